"""The fleet's storage transport takes its proxy from the environment as aiohttp's ``trust_env`` would, but once, at
start: a request goes through the proxy HTTPS_PROXY/HTTP_PROXY name, not where NO_PROXY exempts the account."""

from __future__ import annotations

import asyncio
import os
import socket
from unittest import mock

from azure.storage.blob.aio import ContainerClient

from se_exporter.infra.azure.storage import trusting
from tests.support.helpers import free_port


class Proxy:
    """A loopback HTTP proxy that answers every request 404 and notes its request line."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.port = 0

    async def __aenter__(self) -> Proxy:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            self.lines.append(line.decode().strip())
            while (await reader.readline()).strip():
                pass  # the headers; the requests checked have no body
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        writer.close()


async def exists(url: str) -> bool | str:
    """Whether the container exists, asked through ``trusting``'s transport, or the error's type."""
    container = ContainerClient(url, "fleet", **trusting(None, url))
    try:
        return bool(await container.exists(retry_total=0))
    except Exception as error:
        return type(error).__name__
    finally:
        await container.close()


def test_requests_go_through_the_proxy_the_environment_named_at_start() -> None:
    """HTTP_PROXY set when the transport is made: every request goes through it, even after the variable is gone
    (the environment is read once, not per request)."""
    async def run() -> list[str]:
        async with Proxy() as proxy:
            url = "http://storage.invalid:10000/account"  # never resolved: the proxy is asked for it
            with mock.patch.dict(os.environ, {"HTTP_PROXY": f"http://127.0.0.1:{proxy.port}"}, clear=False):
                os.environ.pop("NO_PROXY", None)
                os.environ.pop("no_proxy", None)
                container = ContainerClient(url, "fleet", **trusting(None, url))
            try:
                assert await container.exists(retry_total=0) is False  # the proxy's 404
            finally:
                await container.close()
            return proxy.lines

    lines = asyncio.run(run())
    assert lines and lines[0].startswith("GET http://storage.invalid:10000/account/fleet?restype=container"), lines


def test_no_proxy_exempts_the_account() -> None:
    """NO_PROXY naming the account's host: the request goes straight to it (here a closed port), not to the proxy."""
    async def run() -> tuple[bool | str, list[str]]:
        async with Proxy() as proxy:
            with socket.socket() as closed:
                closed.bind(("127.0.0.1", 0))
                port = closed.getsockname()[1]
            with mock.patch.dict(os.environ, {"HTTP_PROXY": f"http://127.0.0.1:{proxy.port}", "NO_PROXY": "127.0.0.1"},
                                 clear=False):
                os.environ.pop("no_proxy", None)
                answer = await exists(f"http://127.0.0.1:{port}/account")
            return answer, proxy.lines

    answer, lines = asyncio.run(run())
    assert answer == "ServiceRequestError" and lines == []


def test_without_proxy_variables_requests_go_direct() -> None:
    """No proxy variable at all: the transport connects to the account itself."""
    port = free_port()
    with mock.patch.dict(os.environ, {}, clear=False):
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            os.environ.pop(name, None)
        assert asyncio.run(exists(f"http://127.0.0.1:{port}/account")) == "ServiceRequestError"
