"""A scripted HTTP/1.1 server on loopback that answers each request with the next item of its script, byte for
byte: the IMDS edge's own double for faults no real server makes on purpose (truncation, drip feeds, hangs)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from dataclasses import dataclass, field

CLOSE = object()  # close the connection after this answer
HANG = object()  # never answer this request


@dataclass(frozen=True)
class Drip:
    """Send ``head`` at once, then ``data`` one byte every ``interval`` seconds (until the client goes away)."""

    data: bytes
    interval: float
    head: bytes = b""


@dataclass
class ScriptedServer:
    """Answers requests in order from ``script``: bytes to send, optionally followed by CLOSE; HANG never answers;
    a Drip sends its bytes one at a time. With ``tls``, every connection is wrapped in that server context."""

    script: list[object]
    tls: ssl.SSLContext | None = None
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._closed = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the client closed or reset the connection, as several tests do
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
                self._open.append(conn)
            self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                self.requests.append(head)
                if not self.script:
                    return
                step = self.script.pop(0)
                # Taken with its step, before the answer is sent: once the client has the answer it may send its
                # next request on a new connection at once, and that connection's thread must not find CLOSE
                # first (it did: an AssertionError in the server, seen by the client as RemoteDisconnected).
                close_after = bool(self.script) and self.script[0] is CLOSE
                if close_after:
                    self.script.pop(0)
                if step is HANG:
                    self._closed.wait()  # until the test is over
                    return
                if isinstance(step, Drip):
                    conn.sendall(step.head)
                    for index in range(len(step.data)):
                        conn.sendall(step.data[index:index + 1])
                        if self._closed.wait(step.interval):
                            return
                    if close_after:
                        return
                    continue
                assert isinstance(step, bytes)
                conn.sendall(step)
                if close_after:
                    return

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):  # close() alone leaves accept() blocked, and its thread, for ever
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._acceptor.join(timeout=10)
        for conn in self._open:
            conn.close()
