"""Loopback only, enforced in pytest's own process: an audit hook refuses any connect, sendto or name lookup whose
address is not loopback, before the call reaches the OS (nothing is sent, no DNS query leaves), and the test in
which it happened fails even when a library catches the refusal and retries quietly.

Processes the tests start (the sidecar, Prometheus, Azurite) are not covered: their addresses come from the tests,
all 127.0.0.1. Binding is not checked: a server's address is where it listens, not where it sends.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Iterator

import pytest

REFUSED: list[str] = []  # what the hook refused since the last test's check: a test fails on any of it
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
# Passive lookups for a server's bind (asyncio's create_server); a connect to them stays on this machine.
WILDCARDS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 - compared against, never bound here


class NonLoopbackError(PermissionError):
    """A socket call to a non-loopback address, refused before it reached the OS."""


def is_loopback(host: object) -> bool:
    """127.0.0.0/8, ::1 (also IPv4-mapped), the localhost names; ``None`` and wildcards (a passive lookup)."""
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    host = host.split("%", 1)[0].strip("[]")
    if host.lower() in LOOPBACK_NAMES or host in WILDCARDS:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # any other name: resolving it would be a DNS query
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event in ("socket.connect", "socket.sendto"):
        sock, address = args[0], args[1]
        if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple):
            return  # Unix sockets, netlink: no network
        host = address[0]
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"):
        host = args[0]
    else:
        return
    if not is_loopback(host):
        REFUSED.append(f"{event} {host!r}")
        raise NonLoopbackError(f"tests talk to loopback only: {event} to {host!r} refused (tests/support/loopback.py)")


sys.addaudithook(_audit)  # once, when pytest loads this plugin; audit hooks cannot be removed


@pytest.fixture(autouse=True)
def loopback_only() -> Iterator[None]:
    """Fails the test if anything in it tried a non-loopback address (even when the error was caught)."""
    REFUSED.clear()
    yield
    refused, REFUSED[:] = list(REFUSED), []
    if refused:
        pytest.fail(f"non-loopback network use refused: {', '.join(refused)}", pytrace=False)
