"""Run as ``python -m tests.support.imds_guard_probe``: after ``cli.main`` ran a command (as every program starts), try
to POST to IMDS through every HTTP client the programs load, and a bare socket, with the address in several spellings;
print, as JSON, what stopped each attempt.

A separate process, because pytest's own loopback hook (tests/support/loopback.py) would refuse these addresses before
the guard is asked. Nothing reaches IMDS: a second audit hook, installed behind the guard, stops (and reports as
``escaped``) any connection to that address the guard let through.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import json
import socket
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

import requests

from se_exporter import cli
from se_exporter.infra.outbound import IMDS_ADDRESS, ImdsWriteRefused, is_imds

APPROVAL = b'{"StartRequests": [{"EventId": "E1"}]}'
# IMDS's address written five ways (dotted, hexadecimal, one decimal number, octal, IPv4-mapped IPv6), from the
# guard's own constant.
_NUMBER = int(IMDS_ADDRESS)
_OCTAL = ".".join(f"0{int(part):o}" for part in str(IMDS_ADDRESS).split("."))
SPELLINGS = [str(IMDS_ADDRESS), f"{_NUMBER:#x}", str(_NUMBER), _OCTAL, f"[::ffff:{IMDS_ADDRESS}]"]
ESCAPED: list[object] = []


def _loopback(host: str) -> bool:
    """Whether a resolved address is loopback: decided apart from the guard's own ``is_imds``, so that a spelling
    the guard misreads still reaches nothing off this machine."""
    try:
        address = ipaddress.ip_address(host.split("%", maxsplit=1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def _sentinel(event: str, args: tuple[Any, ...]) -> None:
    if event != "socket.connect" or not isinstance(args[1], tuple) or not isinstance(args[1][0], str):
        return
    if not _loopback(args[1][0]):  # nothing leaves loopback, whatever the guard decided
        if is_imds(args[1][0]):
            ESCAPED.append(args[1])
        raise ConnectionRefusedError("the probe's sentinel stopped a connection off loopback that the guard let "
                                     "through")


def _causes(error: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__ or (error.args[0] if error.args and isinstance(
            error.args[0], BaseException) else getattr(error, "reason", None) or getattr(error, "os_error", None))
    return seen


def _requests_post(host: str) -> None:
    requests.post(f"http://{host}/metadata/scheduledevents?api-version=2020-07-01", data=APPROVAL,
                  headers={"Metadata": "true"}, timeout=2)


def _urllib_post(host: str) -> None:
    request = urllib.request.Request(f"http://{host}/metadata/scheduledevents", data=APPROVAL, method="POST")
    urllib.request.urlopen(request, timeout=2)


def _http_client_post(host: str) -> None:
    connection = http.client.HTTPConnection(host.strip("[]"), 80, timeout=2)
    try:
        connection.request("POST", "/metadata/scheduledevents", body=APPROVAL)
    finally:
        connection.close()


def _aiohttp_post(host: str) -> None:
    import aiohttp  # noqa: PLC0415 - the fleet's client library, only for this case

    async def post() -> None:
        url = f"http://{host}/metadata/scheduledevents"
        timeout = aiohttp.ClientTimeout(2)
        async with aiohttp.ClientSession() as session, session.post(url, data=APPROVAL, timeout=timeout):
            pass

    asyncio.run(post())


def _token_transport_post(host: str) -> None:
    from azure.core.rest import HttpRequest  # noqa: PLC0415 - azure-core comes with the Event Hubs extra

    from se_exporter.infra.azure.credential import _token_transport  # noqa: PLC0415

    async def post() -> None:
        transport = _token_transport()
        async with transport:
            await transport.send(HttpRequest("POST", f"http://{host}/metadata/scheduledevents", content=APPROVAL))

    asyncio.run(post())


def _raw_socket(host: str) -> None:
    socket.create_connection((host.strip("[]"), 80), timeout=2).close()


CLIENTS: dict[str, Callable[[str], None]] = {
    "requests": _requests_post, "urllib": _urllib_post, "http.client": _http_client_post, "aiohttp": _aiohttp_post,
    "the managed identity's transport": _token_transport_post, "a bare socket": _raw_socket,
}




def main() -> None:
    cli.main(["simulate", "--list-scenarios"])  # installs the guard, as every command does
    sys.addaudithook(_sentinel)
    results: dict[str, str] = {}
    for client, attempt in CLIENTS.items():
        for host in SPELLINGS:
            escaped = len(ESCAPED)
            try:
                attempt(host)
                outcome = "sent"
            except Exception as error:  # each library wraps the refusal its own way
                refused = any(isinstance(cause, ImdsWriteRefused) for cause in _causes(error))
                outcome = "refused" if refused else f"{type(error).__name__}: {error}"
            results[f"{client} {host}"] = "escaped" if len(ESCAPED) > escaped else outcome
    print(json.dumps(results))


if __name__ == "__main__":
    main()
