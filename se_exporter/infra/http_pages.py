"""What a handler of the one HTTP server (``http_server``) is given and answers, and the pages every program serves
with it: routes for GET and HEAD, /healthz and /readyz texts, an index, /metrics (gzipped when asked), and the counter
of refusals by reason."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from se_exporter.infra.held import HeldFamilies

# The bounds that refuse a request or a connection, as ``rejection_counter`` labels them (``http_server``).
REASONS = ("header_bytes", "deadline", "body_bytes", "connections", "malformed", "write_deadline")


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...] = ()  # names in lower case, values as sent (latin-1)
    body: bytes = b""
    raw: RawWriter | None = None  # None when called in-process (tests, benchmarks)

    def header(self, name: str) -> str:
        """The last value of the header ``name`` (lower case); "" when absent."""
        return next((value for key, value in reversed(self.headers) if key == name), "")


class Joined:
    """``separator.join(items)`` as a body part, made a slice of ``per_piece`` items at a time as it is sent: its
    size is known at once, its bytes exist only a piece at a time, so a slow client of a fleet's scrape holds the
    list of items, not a copy of the text."""

    def __init__(self, separator: bytes, items: list[bytes], per_piece: int) -> None:
        self.separator, self.items, self.per_piece = separator, items, per_piece
        self._size = sum(map(len, items)) + len(separator) * max(0, len(items) - 1)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[bytes]:
        items, step, separator = self.items, self.per_piece, self.separator
        for start in range(0, len(items), step):
            if start:
                yield separator
            yield separator.join(items[start:start + step])


Part = bytes | Joined


def pieces(parts: Iterable[Part]) -> Iterator[bytes]:
    """The bytes of ``parts`` in order, a piece at a time (a ``Joined`` in its slices)."""
    for part in parts:
        if isinstance(part, bytes):
            if part:
                yield part
        else:
            yield from part


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # close the connection after this answer
    stream: tuple[Part, ...] = ()  # a large body's parts, sent a piece at a time as the client reads (``body`` empty)

    @property
    def size(self) -> int:
        """The body's bytes: what Content-Length says."""
        return sum(map(len, self.stream)) if self.stream else len(self.body)


# A handler's answer: a Response, or None when it wrote its answer itself (``HttpRequest.raw``) or wants the
# connection closed without one; either way the connection is then closed.
Handler = Callable[[HttpRequest], Awaitable["Response | None"]]
Page = Callable[[HttpRequest], Response]


class RawWriter:
    """Bytes on the socket as they are, bypassing HTTP framing (the simulator's byte-level faults)."""

    def __init__(self, writer: asyncio.StreamWriter, timeout: float) -> None:
        self._writer, self._timeout = writer, timeout

    async def write(self, data: bytes) -> bool:
        """False once the client has gone or has not read for the write timeout."""
        try:
            self._writer.write(data)
            await asyncio.wait_for(self._writer.drain(), self._timeout)
        except (OSError, asyncio.TimeoutError):
            return False
        return True


def pages(routes: Mapping[str, Page]) -> Handler:
    """A handler serving ``routes`` to GET and HEAD (405 with Allow otherwise), 404 elsewhere."""

    async def handle(request: HttpRequest) -> Response:
        page = routes.get(request.path)
        if page is None:
            return Response(404, b"not found\n")
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD"),))
        return page(request)

    return handle


def text(ok: bool, good: str, bad: str) -> Response:
    """200 and ``good``, or 503 and ``bad``: /healthz and /readyz."""
    return Response(200 if ok else 503, ((good if ok else bad) + "\n").encode())


def html_index(title: str) -> Response:
    return Response(200, (f"<html><head><title>{title}</title></head><body><h1>{title}</h1>"
                          "<p><a href='/metrics'>/metrics</a> <a href='/healthz'>/healthz</a> "
                          "<a href='/readyz'>/readyz</a></p></body></html>").encode(),
                    "text/html; charset=utf-8")


METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics(request: HttpRequest, body: bytes | list[Part]) -> Response:
    """The Prometheus text ``body`` (or its chunks, in order), gzipped when the request asks for gzip with a quality
    above zero.

    Level 1, not prometheus-client's 9: metrics text is so repetitive that level 1 is nearly as small at a
    fraction of the CPU (figures: docs/performance.md, "Scrape"). Chunks are compressed one after the other, or
    sent one after the other, never joined: a fleet's body is tens of MB, and each whole copy of it (a join, then
    the socket transport's buffer of what the client has not read yet) is memory at the scrape's peak."""
    chunks = [body] if isinstance(body, bytes) else body
    if gzip_wanted(request.header("accept-encoding")):
        compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16 +: a gzip header and trailer
        compressed = [compressor.compress(piece) for piece in pieces(chunks)]
        compressed.append(compressor.flush())
        return Response(200, b"".join(compressed), METRICS_TYPE, (("Content-Encoding", "gzip"),))
    if len(chunks) == 1 and isinstance(chunks[0], bytes):
        return Response(200, chunks[0], METRICS_TYPE)
    return Response(200, b"", METRICS_TYPE, stream=tuple(chunk for chunk in chunks if len(chunk)))


def gzip_wanted(accept_encoding: str) -> bool:
    """Whether Accept-Encoding asks for gzip: listed with a quality above zero (``gzip;q=0`` means "not gzip",
    RFC 9110 12.5.3; prometheus-client's ``gzip_accepted`` reads only the name)."""
    for item in accept_encoding.split(","):
        name, *parameters = (part.strip() for part in item.split(";"))
        if name.lower() != "gzip":
            continue
        quality = next((value for key, _, value in (p.partition("=") for p in parameters)
                        if key.strip().lower() == "q"), "1")
        try:
            return float(quality) > 0
        except ValueError:
            return False
    return False


def rejection_counter(registry: CollectorRegistry, namespace: str,
                      held: HeldFamilies | None = None) -> Callable[[str], None]:
    """``<namespace>_http_rejected_total{reason}``; returns its ``inc``. Every reason is shown from the start, or,
    with ``held`` (the sidecar's: a series on every VM), a reason only once it happened, held at 0 first."""
    name, documentation = f"{namespace}_http_rejected", "HTTP requests or connections refused by a bound, by reason."
    if held is not None:
        lazy = held.counter(name, documentation, ["reason"])
        return lambda reason: lazy.labels(reason).inc()
    counter = Counter(name, documentation, ["reason"], registry=registry)
    for reason in REASONS:
        counter.labels(reason)
    return lambda reason: counter.labels(reason).inc()

