"""What the fleet's Blob Storage clients share: a transport that reads the proxy once (``trusting``), the check that
the container is there (``ensure_container``), and a storage error in words an operator can act on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from azure.core.exceptions import ResourceExistsError
from azure.core.pipeline.transport import AioHttpTransport
from azure.storage.blob.aio import ContainerClient
from yarl import URL

from se_exporter.core.errors import ConfigError
from se_exporter.core.retry import backoff
from se_exporter.infra.azure.clients import causes, describe

log = logging.getLogger("se_exporter.fleet")  # its one user's: the lines read as they always have
STORAGE_CONNECTION_TIMEOUT, STORAGE_READ_TIMEOUT = 20.0, 60.0  # azure-storage-blob's defaults (see trusting)


def trusting(ca_file: str | None, url: str | None = None) -> dict[str, Any]:
    """A storage client's transport trusting the CAs of ``ca_file`` (the system's when None), its proxy (and the
    proxy's credentials from ~/.netrc) read from the environment once for the account's ``url``, as aiohttp's
    ``trust_env`` would find it at each request: one TLS connection in use and no thread hands a request over
    (docs/performance.md, "The storage clients' transport"). The session is made as azure-core makes its own (no
    cookies, no automatic decompression) and is closed with the client."""
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=ca_file)) if ca_file \
        else aiohttp.TCPConnector()
    proxy: URL | None = None
    proxy_auth: aiohttp.BasicAuth | None = None
    if url is not None:
        with contextlib.suppress(LookupError):  # no proxy for this URL
            proxy, proxy_auth = get_env_proxy_for_url(URL(url))
    session = aiohttp.ClientSession(connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar(),
                                    auto_decompress=False, proxy=proxy, proxy_auth=proxy_auth)
    return {"transport": AioHttpTransport(session=session, session_owner=True,
                                          connection_timeout=STORAGE_CONNECTION_TIMEOUT,
                                          read_timeout=STORAGE_READ_TIMEOUT)}


CHECK_TIMEOUT = 10.0  # one container check; the storage SDK's own retries are off, so its error is the real one
CHECK_BACKOFF = (1.0, 30.0)  # seconds between checks while the storage is unreachable: first, most


async def ensure_container(container: ContainerClient, name: str, report: Callable[[str | None], None],
                           sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
    """Create the container when it is missing; a container that can be neither found nor made is a
    configuration error. Storage unreachable is not: checked again (1 s, doubling up to 30 s) until it answers,
    the cause logged when it changes and given to ``report`` (None once it answers: /readyz shows it); receiving
    starts once it is done. In the background, after the endpoints listen and the signal handlers are set: an
    unreachable storage account delays neither liveness nor SIGTERM."""
    failures, last = 0, ""
    while True:
        try:
            exists = await asyncio.wait_for(container.exists(retry_total=0), CHECK_TIMEOUT)
            break
        except Exception as error:
            cause = storage_cause(error)
        report(cause)
        if cause != last:
            log.warning("cannot check the blob container %s: %s; checking again", name, cause)
            last = cause
        failures += 1
        await sleep(backoff(failures, *CHECK_BACKOFF))
    report(None)
    if last:
        log.info("the storage account answers again: blob container %s %s", name,
                 "found" if exists else "missing")
    if exists:
        return
    try:
        await asyncio.wait_for(container.create_container(), 15)
        log.info("created the blob container %s", name)
    except ResourceExistsError:
        return
    except Exception as error:
        raise ConfigError(f"--checkpoint-container {name}: it does not exist and cannot be created "
                          f"({describe(error)})") from None


def storage_cause(error: BaseException) -> str:
    """What went wrong in words an operator can act on: the OS error under the SDK's wrappers when there is one
    (connection refused, host not found), "no answer within N s" for a timeout, else the error's first line."""
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return f"no answer within {CHECK_TIMEOUT:g} s (timeout)"
    for cause in causes(error):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return f"host not found ({describe(cause)})"
        if isinstance(cause, TimeoutError):
            return "connection timed out"
    return describe(error)
