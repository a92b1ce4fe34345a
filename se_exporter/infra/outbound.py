"""Read-only towards IMDS, for every program: no connection to its address but from a client that can only GET.

IMDS approves a scheduled event when it is sent a POST (``StartRequests``). Two clients of this project talk to it,
and neither can send anything but GET: the sidecar's IMDS transport (``KeepAliveTransport.get`` takes no method) and
the managed identity's token transport (``infra/azure/credential.py``, which marks only its GETs). Each makes its
connections inside ``get_only()``. Every other connection to the IMDS address, by any library of any program
(requests, aiohttp, http.client, urllib, the AMQP client, a webhook pointed there by mistake), is refused before it is
made: ``install`` (called by ``cli.main`` for every command) adds an audit hook (PEP 578) on ``socket.connect``, the
one place every Python client's connection goes through, whichever library built it. The hook raises
``ImdsWriteRefused``, a ``PermissionError``, so each library reports it as the connection failure it is.

The address is recognised however it is written: 169.254.169.254, 0xa9fea9fe, 2852039166, 0251.0376.0251.0376
(every form ``inet_aton`` reads), and inside IPv6 (``::ffff:169.254.169.254``); a host name is resolved first.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

IMDS_ADDRESS = ipaddress.IPv4Address("169.254.169.254")
_GET_ONLY: ContextVar[bool] = ContextVar("se_exporter_get_only", default=False)
_installed = False


class ImdsWriteRefused(PermissionError):
    """A connection to IMDS by a client that could send it more than GET."""


@contextmanager
def get_only() -> Iterator[None]:
    """Connections made in the body may reach IMDS: the caller sends nothing but GET on them."""
    token = _GET_ONLY.set(True)
    try:
        yield
    finally:
        _GET_ONLY.reset(token)


def is_imds(host: str) -> bool:
    """Whether ``host`` (an address in any spelling, or a name) is the IMDS address."""
    text = host.strip().strip("[]").split("%")[0].rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(text)
    except ValueError:
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(text))  # hexadecimal, octal, one number, short forms
        except OSError:
            return _resolves_to_imds(text)
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
                                           if int(address) >> 32 == 0 else None)  # ::169.254.169.254 too
        return embedded == IMDS_ADDRESS
    return address == IMDS_ADDRESS


def _resolves_to_imds(name: str) -> bool:
    try:
        found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False  # the connect itself fails the same way
    return any(is_imds(str(info[4][0])) for info in found if info[0] in (socket.AF_INET, socket.AF_INET6))


def refuse_unless_get(method: str, host: str) -> None:
    """For a client that may send other methods: ``ImdsWriteRefused`` for anything but GET to IMDS."""
    if method.upper() != "GET" and is_imds(host):
        raise ImdsWriteRefused(f"{method.upper()} to IMDS ({host}) refused: se-exporter only ever reads IMDS")


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event != "socket.connect" or _GET_ONLY.get():
        return
    sock, address = args
    if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and address \
            and isinstance(address[0], str) and is_imds(address[0]):
        raise ImdsWriteRefused(f"connection to IMDS ({address[0]}) refused: only the IMDS client and the managed "
                               "identity's token requests may reach it, and they only ever GET")


def install() -> None:
    """Refuse, for the rest of the process, every connection to IMDS made outside ``get_only`` (audit hooks cannot
    be removed: once is enough, and a second call does nothing)."""
    global _installed  # noqa: PLW0603 - one hook per process, whoever asks first
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
