"""Wiring: poll loop -> lifecycle -> sinks, the identity watcher, and the HTTP endpoints.

Threads: the poll loop and the identity watcher each run in a daemon thread, the HTTP server in
its own; the main thread only waits for a stop signal. A poll stuck in a two-minute first call
therefore never delays shutdown.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, gzip_accepted

from se_exporter import lifecycle
from se_exporter.config import Listen, Settings
from se_exporter.dirlock import UNSUPPORTED, DirectoryBusy, lock_directory
from se_exporter.errors import ConfigError, ImdsError, ImdsThrottled
from se_exporter.imds import ImdsClient, VmIdentity
from se_exporter.logs import fields
from se_exporter.metrics import Metrics, Snapshot
from se_exporter.model import event_key, parse_document
from se_exporter.platform_io import PLATFORM
from se_exporter.sinks import DocumentChange, FanOut
from se_exporter.sinks.envelope import Sequencer
from se_exporter.sinks.forward import FileTarget, ForwardMetrics, ForwardSink, Target
from se_exporter.sinks.spool import Spool
from se_exporter.state import LifecycleStore

log = logging.getLogger("se_exporter")
TEXT_FORMAT = "text/plain; version=0.0.4"


class Poller:
    """Polls IMDS, keeps the snapshot, hands document changes to the sinks.

    Work per poll is one GET and one bytes comparison: parsing, the lifecycle diff and the sinks
    run only when the bytes changed.
    """

    def __init__(self, imds: ImdsClient, metrics: Metrics, sinks: FanOut, settings: Settings,
                 clock: Callable[[], float] = time.time, store: LifecycleStore | None = None) -> None:
        self._imds = imds
        self._metrics = metrics
        self._sinks = sinks
        self._settings = settings
        self._clock = clock
        self._polls_ok = metrics.polls.labels("ok")  # looked up once: this is counted on every poll
        self._last_body: bytes | None = None
        self._failures = 0
        self._failing_outcome: str | None = None
        # Two threads change the snapshot (this loop and the identity watcher): each change is a
        # read-modify-write under this lock, or one of them would silently undo the other's.
        self._lock = threading.Lock()
        self.snapshot = Snapshot(vm_name=settings.vm_name, api_version=settings.api_version)
        self._store = store
        # Lifecycles open before a restart: the first diff starts from them, not from nothing (keyed as diff keys).
        restored = store.load() if store is not None else {}
        self._restored = {event_key(record.event.event_id): record for record in restored.values()}
        self._ended: Mapping[str, lifecycle.EventRecord] = {}  # recently ended events, so none begins twice
        self.heartbeat_deadline = time.monotonic() + settings.first_timeout + settings.backoff_cap + 10

    def set_identity(self, identity: VmIdentity) -> None:
        self._update(identity=identity, vm_name=self._settings.vm_name or identity.name or None)

    def _update(self, **changes: Any) -> Snapshot:
        """Replace fields of the snapshot atomically; readers (scrapes) keep taking it without a lock."""
        with self._lock:
            self.snapshot = replace(self.snapshot, **changes)
            return self.snapshot

    def poll_once(self) -> float:
        """One poll; returns how long to wait before the next one."""
        started = time.monotonic()
        try:
            body = self._imds.scheduled_events()
            if body != self._last_body:
                self._apply(body)  # raises InvalidDocument before anything is changed
        except ImdsError as error:
            self._metrics.poll_duration.observe(time.monotonic() - started)
            return self._failed(error)
        self._metrics.poll_duration.observe(time.monotonic() - started)
        self._polls_ok.inc()
        if self._failing_outcome is not None:
            log.info("IMDS recovered after %d failed polls", self._failures,
                     extra=fields(imds_state="ok", failed_polls=self._failures))
        self._failures, self._failing_outcome = 0, None
        self._update(up=True, last_success=self._clock())
        return self._settings.poll_interval

    def _apply(self, body: bytes) -> None:
        document = parse_document(body)
        now = self._clock()
        previous = self.snapshot.records if self.snapshot.has_document else self._restored
        step = lifecycle.diff(previous, document, now, self._ended)
        if self._store is not None:
            self._store.save(step.records)
        first = self._last_body is None
        self._last_body = body
        self._ended = step.ended
        before = self.snapshot.incarnation
        if document.incarnation is not None and before is not None and document.incarnation < before:
            # Azure: the incarnation "increases when the events array changes". Lower means IMDS started counting
            # again or a stale answer; the document is still what IMDS says now, so it is used, and said.
            self._metrics.incarnation_regressions.inc()
            log.warning("DocumentIncarnation went backwards from %d to %d; using the document as IMDS' current "
                        "state (events that had ended stay ended)", before, document.incarnation,
                        extra=fields(document_incarnation=document.incarnation, previous_incarnation=before))
        snap = self._update(records=step.records, incarnation=document.incarnation, has_document=True)
        self._metrics.document_changes.inc()
        if document.warnings:
            self._metrics.document_warnings.inc(len(document.warnings))
            log.warning("document %s parsed with %d warnings: %s", document.incarnation, len(document.warnings),
                        "; ".join(document.warnings[:5]), extra=fields(warnings=list(document.warnings[:50])))
        if first:
            log.info("first document read", extra=fields(document_incarnation=document.incarnation,
                                                          events=len(document.events)))
        self._sinks.export(DocumentChange(
            raw=body, document=document, transitions=step.transitions, records=step.records, observed_at=now,
            vm_name=snap.vm_name, identity=snap.identity, api_version=self._settings.api_version))

    def _failed(self, error: ImdsError) -> float:
        self._metrics.polls.labels(error.outcome).inc()
        self._failures += 1
        if error.outcome != self._failing_outcome:
            # One line per change of IMDS health, not per failed poll.
            state = "keeping the last valid state" if self.snapshot.has_document else "no document read yet"
            log.warning("IMDS poll failed: %s (%s)", error, state,
                        extra=fields(imds_state=error.outcome, url=self._imds.events_url))
            self._failing_outcome = error.outcome
        self._update(up=False)
        interval, cap = self._settings.poll_interval, self._settings.backoff_cap
        if isinstance(error, ImdsThrottled) and error.retry_after is not None:
            return min(max(interval, error.retry_after), cap)
        return min(interval * 2.0 ** min(self._failures - 1, 16), cap)

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set. The next poll is due ``delay`` after this one *started*, so the
        poll's own duration is inside the interval and the rate stays fixed."""
        while not stop.is_set():
            started = time.monotonic()
            self.heartbeat_deadline = started + self._imds.current_timeout + self._settings.backoff_cap + 10
            try:
                delay = self.poll_once()
            except Exception:  # a bug must not end the loop silently: log it, wait, go on
                log.exception("unexpected error in the poll loop")
                delay = self._settings.backoff_cap
            stop.wait(max(0.0, started + delay - time.monotonic()))

    @property
    def healthy(self) -> bool:
        return time.monotonic() <= self.heartbeat_deadline


class IdentityWatcher:
    """Reads compute metadata once it can; retries in the background with a capped backoff."""

    def __init__(self, imds: ImdsClient, poller: Poller, metrics: Metrics, first_wait: float = 1.0,
                 max_wait: float = 60.0) -> None:
        self._imds, self._poller, self._metrics = imds, poller, metrics
        self._first_wait, self._max_wait = first_wait, max_wait
        # Set after the first try, failed or not: the poll loop waits for it (briefly), so that the first
        # forwarded document already carries the VM's id and partition key in the common case.
        self.first_attempt = threading.Event()

    def run(self, stop: threading.Event) -> None:
        wait = self._first_wait
        logged = False
        while not stop.is_set():
            try:
                identity = self._imds.compute()
            except ImdsError as error:
                self.first_attempt.set()
                self._metrics.identity_errors.inc()
                if not logged:
                    log.warning("cannot read VM identity, retrying in the background: %s", error)
                    logged = True
                stop.wait(wait)
                wait = min(wait * 2, self._max_wait)
                continue
            self._poller.set_identity(identity)
            self.first_attempt.set()
            log.info("VM identity read", extra=fields(vm_name=self._poller.snapshot.vm_name, vm_id=identity.vm_id,
                                                      vmss_name=identity.vmss_name or None,
                                                      location=identity.location))
            return


def make_http_app(registry: CollectorRegistry, poller: Poller) -> Callable[..., Iterable[bytes]]:
    """/metrics from prometheus-client, /healthz and /readyz from the poller's state."""
    metrics_app = make_wsgi_app(registry, disable_compression=True)  # compressed below, faster

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return _metrics(metrics_app, environ, start_response)
        if path == "/healthz":
            return _text(start_response, poller.healthy, "poll loop running", "poll loop stalled")
        if path == "/readyz":
            return _text(start_response, poller.snapshot.has_document, "valid document read",
                         "no valid document read yet")
        if path == "/":
            page = (b"<html><head><title>se-exporter</title></head><body><h1>se-exporter</h1>"
                    b"<p><a href='/metrics'>/metrics</a> <a href='/healthz'>/healthz</a> "
                    b"<a href='/readyz'>/readyz</a></p></body></html>")
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [page]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found\n"]

    return app


def _metrics(metrics_app: Callable[..., Iterable[bytes]], environ: dict[str, Any],
             start_response: Callable[..., Any]) -> Iterable[bytes]:
    # Always the Prometheus text format, as Go's client_golang serves by default: Prometheus asks for
    # OpenMetrics first, and prometheus-client's OpenMetrics writer takes twice as long (38 vs 18 ms with
    # 1,000 events listed) for nothing we use (no exemplars; _created series are off).
    environ = {**environ, "HTTP_ACCEPT": TEXT_FORMAT}
    if not gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
        return metrics_app(environ, start_response)
    answer: list[tuple[str, list[tuple[str, str]]]] = []
    body = b"".join(metrics_app(environ, lambda status, headers: answer.append((status, headers))))
    status, headers = answer[0]
    if not status.startswith("200"):
        start_response(status, headers)
        return [body]
    # Level 1, not prometheus-client's 9: metrics text is so repetitive that level 1 is within 8% of the
    # size (20.6 vs 19.1 KB with 1,000 events listed) at a quarter of the CPU (0.6 vs 2.4 ms).
    start_response(status, [*headers, ("Content-Encoding", "gzip")])
    return [gzip.compress(body, compresslevel=1)]


def _text(start_response: Callable[..., Any], ok: bool, good: str, bad: str) -> list[bytes]:
    start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
    return [((good if ok else bad) + "\n").encode()]


# Bounds of the HTTP server. A scraper is a well-behaved client on a private network, but nothing a
# client does may exhaust the process: every connection holds one thread, so their number is capped,
# and a request must arrive whole within REQUEST_DEADLINE (a per-read timeout alone lets a client that
# sends a byte every few seconds hold its thread for ever).
MAX_CONNECTIONS = 32
REQUEST_DEADLINE = 10.0  # seconds to send the request line and headers (Prometheus sends them at once)
WRITE_TIMEOUT = 10.0  # seconds any one write of the answer may block on a client that does not read
SLOT_WAIT = 1.0  # seconds a new connection may wait for a free thread before it is answered 503
LISTEN_BACKLOG = 512  # connections the kernel queues while all threads are busy (the kernel may lower it)
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\n"
         b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n")


class _DeadlineReader(io.RawIOBase):
    """The socket as a stream whose reads all end by one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


class _QuietHandler(WSGIRequestHandler):
    disable_nagle_algorithm = True  # separate header and body writes must not wait for a delayed ACK
    timeout = WRITE_TIMEOUT
    request_deadline = REQUEST_DEADLINE

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, time.monotonic() + self.request_deadline))

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.connection.settimeout(self.timeout)  # the request is in: the answer gets the ordinary timeout
        return parsed

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds are not news."""


class _SleepingServerMixIn:
    """socketserver's accept loop without its polling: it sleeps until a connection or shutdown() arrives.

    socketserver.BaseServer.serve_forever wakes every ``poll_interval`` only to see whether shutdown() was
    called: at 0.05 s that was 20 wake-ups a second and most of the sidecar's idle CPU. Here shutdown()
    writes a byte to a socket pair that the loop waits on beside the listening socket, so the loop has no
    timeout at all and still stops at once.
    """

    socket: socket.socket

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._stop_requested = False
        self._stopped = threading.Event()
        try:
            super().__init__(*args, **kwargs)  # binds: may fail (address in use), and the pair must not leak
        except BaseException:
            self._wake_read.close()
            self._wake_write.close()
            raise

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Handle connections until shutdown(); ``poll_interval`` is ignored (nothing is polled)."""
        self._stopped.clear()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ)
                selector.register(self._wake_read, selectors.EVENT_READ)
                while not self._stop_requested:
                    ready = {key.fileobj for key, _ in selector.select()}
                    if self._stop_requested:
                        break
                    if self.socket in ready:
                        self._handle_request_noblock()  # type: ignore[attr-defined]
        finally:
            with contextlib.suppress(OSError):  # empty the pair, so that the loop could be run again
                while self._wake_read.recv(64):
                    pass
            self._stop_requested = False
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop the loop and wait until it has stopped (as socketserver's: call it while the loop runs)."""
        self._stop_requested = True
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()  # type: ignore[misc]
        self._wake_read.close()
        self._wake_write.close()


def serve(listen: Listen, app: Callable[..., Iterable[bytes]], max_connections: int = MAX_CONNECTIONS,
          request_deadline: float = REQUEST_DEADLINE, slot_wait: float = SLOT_WAIT) -> ThreadingWSGIServer:
    """Bind exactly where configured ('' = all interfaces) and serve in a daemon thread, one thread per
    connection up to ``max_connections``; past that a connection waits ``slot_wait`` and is answered 503."""

    class Handler(_QuietHandler):
        pass

    Handler.request_deadline = request_deadline

    class Server(_SleepingServerMixIn, ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        request_queue_size = LISTEN_BACKLOG
        allow_reuse_address = PLATFORM.reuse_address  # on Windows it would let a second instance share the port
        _slots = threading.BoundedSemaphore(max_connections)
        _refusing = False

        def server_bind(self) -> None:
            PLATFORM.prepare_listener(self.socket)  # exclusive address use on Windows; [::] is dual stack
            super().server_bind()

        def process_request(self, request: Any, client_address: Any) -> None:
            # Only the first connection past the limit waits for a thread: while refusing, the accept loop must not
            # wait slot_wait per queued connection, or a flood of them would delay every answer (a /healthz probe
            # too) by that much each.
            if not self._slots.acquire(timeout=0 if self._refusing else slot_wait):
                self._refuse(request)
                return
            if self._refusing:
                log.info("HTTP connections below the limit of %d again", max_connections)
                self._refusing = False
            try:
                super().process_request(request, client_address)
            except BaseException:
                self._slots.release()
                raise

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self._slots.release()

        def _refuse(self, request: socket.socket) -> None:
            if not self._refusing:  # one line per episode, not per connection
                log.warning("HTTP connection limit of %d reached: answering 503 until a connection ends",
                            max_connections)
                self._refusing = True
            with contextlib.suppress(OSError):
                request.settimeout(0.1)
                request.sendall(_BUSY)
            self.shutdown_request(request)

        def handle_error(self, request: Any, client_address: Any) -> None:
            """A scraper hanging up or too slow is no reason for a traceback; anything else is logged."""
            if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, TimeoutError)):
                return
            log.exception("HTTP request from %s failed", client_address)

    server = make_server(listen.host, listen.port, app, server_class=Server, handler_class=Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


def make_forwarding(settings: Settings, registry: CollectorRegistry) -> ForwardSink | None:
    """The forwarding sink with its targets (file, Event Hubs), or None when nothing is configured."""
    if not (settings.forward_file or settings.eventhubs_enabled):
        return None
    metrics = ForwardMetrics(registry)
    sequencer = Sequencer(Path(settings.state_path))
    targets: list[Target] = []
    if settings.forward_file:
        file_target = FileTarget(Path(settings.forward_file), metrics)
        sequencer.advance_past(file_target.last_sequence)  # numbers used while forwarding.json could not be saved
        targets.append(file_target)
        log.info("forwarding documents to the file %s", Path(settings.forward_file).resolve())
    if settings.eventhubs_enabled:
        # Imported here: the Event Hubs sink brings asyncio (~1.8 MB of RSS), which a sidecar not forwarding to
        # Event Hubs never needs.
        from se_exporter.sinks.eventhubs import EventHubsTarget, producer_factory  # noqa: PLC0415 - see above

        spool = Spool(Path(settings.spool_path), settings.spool_max_bytes, on_drop=metrics.dropped.inc)
        sequencer.advance_past(spool.last_sequence)
        metrics.spool_documents.set_function(lambda: spool.count)
        metrics.spool_bytes.set_function(lambda: spool.size_bytes)
        target = EventHubsTarget(spool, producer_factory(
            settings.eventhub_connection_string, settings.eventhub_name, settings.eventhub_namespace,
            settings.eventhub_client_id, endpoint=settings.eventhub_endpoint, ca_file=settings.eventhub_ca_file),
            metrics, send_timeout=settings.eventhub_send_timeout,
            max_retry_wait=settings.eventhub_retry_max)
        target.start()
        targets.append(target)
        where = settings.eventhub_namespace or "the namespace of the connection string"
        if settings.eventhub_endpoint:
            where += f" through {settings.eventhub_endpoint}"
        log.info("forwarding documents to Event Hubs (%s), spooled in %s", where, Path(settings.spool_path).resolve())
    if settings.heartbeat_seconds:
        log.info("forwarding the current document again after %gs without a change (heartbeat)",
                 settings.heartbeat_seconds)
    return ForwardSink(sequencer, targets, metrics, heartbeat_interval=settings.heartbeat_seconds)


def claim_state(settings: Settings) -> contextlib.ExitStack:
    """Lock the state directory, and a spool directory outside it, for this process: one sidecar per directory.

    A default state directory that cannot be written is left alone: nothing is kept there, so nothing is shared
    (``lifecycle_store`` says so in the log). Held until the returned stack is closed or the process ends.
    """
    held = contextlib.ExitStack()
    state = Path(settings.state_path)
    directories = [("--state-dir", state, settings.state_dir is not None)]
    spool = Path(settings.spool_path)
    if settings.eventhubs_enabled and not spool.resolve().is_relative_to(state.resolve()):
        directories.append(("--spool-dir", spool, True))
    for flag, directory, must in directories:
        try:
            held.enter_context(lock_directory(directory))
        except DirectoryBusy as busy:
            held.close()
            holder = f"pid {busy.pid}" if busy.pid is not None else "a process whose pid is unknown"
            raise ConfigError(f"{flag} {directory}: already used by another se-exporter ({holder}); give each "
                              "instance its own directory") from None
        except OSError as exc:
            if exc.errno in UNSUPPORTED:
                log.warning("%s %s: its filesystem cannot lock files (%s); make sure no other se-exporter uses it",
                            flag, directory, exc.strerror)
            elif must:
                held.close()
                raise ConfigError(f"{flag} {directory}: cannot write there ({exc.strerror or exc})") from None
    return held


def lifecycle_store(settings: Settings) -> LifecycleStore | None:
    """Where open lifecycles are kept. An explicit --state-dir must work; the default is used if it can be."""
    directory = Path(settings.state_path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        if settings.state_dir is not None:
            raise ConfigError(f"--state-dir {directory}: cannot write there ({exc.strerror})") from None
        log.warning("cannot write %s (%s): open lifecycles will not survive a restart; set --state-dir",
                    directory, exc.strerror)
        return None
    return LifecycleStore(directory, scope=settings.imds_url)
