"""Hostile HTTP clients for the server tests: drippers that never finish a request head, and oversized heads."""

from __future__ import annotations

import contextlib
import http.client
import selectors
import socket
import threading
import time
from types import TracebackType

DRIP_HEAD = b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\nX-Drip: " + b"a" * 100_000


class Drippers:
    """``count`` connections, each sending a request head one byte every ``every`` seconds and never finishing
    it; a connection the server closes is opened again at once (a hostile client)."""

    def __init__(self, port: int, count: int, every: float = 2.0) -> None:
        self.port, self.count, self.every = port, count, every
        self.opened = 0  # connections made, reconnections included
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drippers", daemon=True)
        self._sockets: dict[socket.socket, tuple[int, float]] = {}  # -> bytes sent, next send (monotonic)
        self._ready = threading.Event()

    def __enter__(self) -> Drippers:
        self._thread.start()
        self._ready.wait(60)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(30)

    def _open(self, selector: selectors.BaseSelector, now: float) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            return
        sock.setblocking(False)
        self.opened += 1
        self._sockets[sock] = (0, now + self.every * (self.opened % 16) / 16)  # spread over the period
        selector.register(sock, selectors.EVENT_READ)

    def _drop(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        selector.unregister(sock)
        self._sockets.pop(sock, None)
        sock.close()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for _ in range(self.count):
                self._open(selector, time.monotonic())
            self._ready.set()
            while not self._stop.is_set():
                now = time.monotonic()
                due = min((when for _, when in self._sockets.values()), default=now + self.every)
                for key, _ in selector.select(max(0.0, min(due - now, 0.5))):
                    self._drop(selector, key.fileobj)  # type: ignore[arg-type]  # answered or closed: reconnect
                now = time.monotonic()
                for sock, (sent, when) in list(self._sockets.items()):
                    if when > now:
                        continue
                    try:
                        sock.send(DRIP_HEAD[sent:sent + 1])
                        self._sockets[sock] = (sent + 1, now + self.every)
                    except OSError:
                        self._drop(selector, sock)
                while len(self._sockets) < self.count and not self._stop.is_set():
                    self._open(selector, time.monotonic())
            for sock in list(self._sockets):
                self._drop(selector, sock)


def scrape(port: int, path: str, timeout: float) -> int:
    """One GET on a new connection; its status (0 when it failed or took longer than ``timeout``)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    except OSError:
        return 0
    finally:
        connection.close()


def oversized_head(port: int, headers: int = 98, size: int = 65_000) -> tuple[bytes, bool]:
    """Send a request with ``headers`` headers of ``size`` bytes each (6.4 MB by default: under the standard
    library's per-line and count limits), then read; what the server answered, and whether it took every byte."""
    answer, sent_all = b"", False
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n")
            line = b"X-Big: " + b"a" * (size - 9) + b"\r\n"
            for _ in range(headers):
                sock.sendall(line)
            sock.sendall(b"\r\n")
            sent_all = True
        except OSError:
            pass
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer, sent_all
