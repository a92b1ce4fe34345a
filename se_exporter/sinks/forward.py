"""Forwarding of raw documents: one envelope per changed document, handed to every target.

Targets: the JSON-lines file (``--forward-file``, written and fsynced at once) and the Event Hubs
spool (``--spool-dir``, drained by the forwarder thread). The envelope is built once, so both carry
the same sequence number and message id.

A target that refuses a document (a full disk, an I/O error) does not lose it: the envelope waits in
that target's in-memory queue and is offered again, in order, by a retry thread with a capped backoff,
and every later envelope queues behind it, so each target still receives its documents in sequence
order. The queue is bounded (``MAX_PENDING_BYTES``; past it the oldest refused document is given up,
counted and logged, the newest always kept) and lives only in memory: what it holds when the sidecar
stops is counted and logged as lost. A document is either accepted by a target (written whole and
synced, counted as forwarded) or refused (nothing of it written, counted under its reason): never both.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from se_exporter.errors import ConfigError
from se_exporter.files import DISK, Disk, is_disk_full, write_all
from se_exporter.metrics import NAMESPACE
from se_exporter.platform_io import PLATFORM
from se_exporter.sinks import DocumentChange
from se_exporter.sinks.envelope import Envelope, Sequencer, build

log = logging.getLogger("se_exporter.forward")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
MAX_PENDING_BYTES = 8 << 20  # per target; the 128 Mi pod limit leaves room for this and a 4 MiB document besides
_ENVELOPE_OVERHEAD = 512  # properties and bookkeeping, roughly, on top of the body
RETRY_FIRST, RETRY_MAX = 0.5, 5.0  # a full disk is cheap to probe, and space coming back is worth noticing soon


class ForwardMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.forwarded = Counter(f"{NAMESPACE}_forwarded_documents", "Documents acknowledged by a forwarding sink.",
                                 ["sink"], registry=registry)
        self.errors = Counter(f"{NAMESPACE}_forward_errors", "Failed forwarding attempts, by sink and reason.",
                              ["sink", "reason"], registry=registry)
        self.spool_documents = Gauge(f"{NAMESPACE}_spool_documents", "Documents waiting in the spool.",
                                     registry=registry)
        self.spool_bytes = Gauge(f"{NAMESPACE}_spool_bytes", "Bytes waiting in the spool.", registry=registry)
        self.dropped = Counter(f"{NAMESPACE}_spool_dropped_documents",
                               "Documents dropped from a full spool (oldest first) or unreadable.", registry=registry)
        self.latency = Histogram(f"{NAMESPACE}_forward_latency_seconds",
                                 "Observed -> acknowledged by Event Hubs.", buckets=LATENCY_BUCKETS, registry=registry)
        self.pending = Gauge(f"{NAMESPACE}_forward_pending_documents",
                             "Documents a target refused (full disk, write error), held in memory and retried.",
                             ["sink"], registry=registry)
        self.given_up = Counter(f"{NAMESPACE}_forward_dropped_documents",
                                "Refused documents given up: the in-memory queue was full, or the sidecar stopped.",
                                ["sink"], registry=registry)


class Target(Protocol):
    name: str

    def accept(self, envelope: Envelope) -> None:
        """Take the envelope whole, or raise and keep nothing of it."""

    def close(self, timeout: float) -> None: ...


def refusal_reason(error: BaseException) -> str:
    """The ``reason`` label of ``forward_errors_total`` when a target refuses a document."""
    if isinstance(error, OSError):
        return "disk_full" if is_disk_full(error) else "write"
    return "other"


@dataclass(eq=False)
class _Queue:
    """One target's refused envelopes, oldest first. ``lock`` guards the deque; ``draining`` lets one thread
    at a time offer envelopes to the target, so order holds without blocking the poll loop on a slow drain."""

    target: Target
    pending: deque[Envelope] = field(default_factory=deque)
    bytes: int = 0
    in_flight: Envelope | None = None
    failing: str | None = None
    given_up: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    draining: threading.Lock = field(default_factory=threading.Lock)


    def __len__(self) -> int:
        return len(self.pending)


def _size(envelope: Envelope) -> int:
    return len(envelope.body) + _ENVELOPE_OVERHEAD


class ForwardSink:
    """The ``Sink`` that builds envelopes; a refusing target keeps its documents queued, the others go on.

    With ``heartbeat_interval`` the current document is forwarded again whenever nothing was forwarded for that
    long: a quiet VM stays visible to consumers (``se-exporter fleet`` expires silent ones). A heartbeat is the
    same envelope with a new sequence, ``observed_at`` now, and the property ``heartbeat: true``.
    """

    name = "forward"

    def __init__(self, sequencer: Sequencer, targets: Sequence[Target], metrics: ForwardMetrics,
                 max_pending_bytes: int = MAX_PENDING_BYTES, retry_first: float = RETRY_FIRST,
                 retry_max: float = RETRY_MAX, heartbeat_interval: float | None = None) -> None:
        self._sequencer = sequencer
        self._queues = tuple(_Queue(target) for target in targets)
        self._metrics = metrics
        self._max_pending_bytes = max_pending_bytes
        self._retry_first, self._retry_max = retry_first, retry_max
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._retrier: threading.Thread | None = None
        for queue in self._queues:  # the series exist at 0 from the start, so rate() and panels work at once
            metrics.forwarded.labels(queue.target.name)
            metrics.given_up.labels(queue.target.name)
            metrics.pending.labels(queue.target.name).set_function(queue.__len__)
        self._interval = heartbeat_interval
        self._last: DocumentChange | None = None
        self._forwarded_at = time.monotonic()
        self._beat_lock = threading.Lock()
        self._heartbeat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        if heartbeat_interval:
            self._heartbeat.start()

    def export(self, change: DocumentChange) -> None:
        with self._beat_lock:  # one forward at a time: a heartbeat never takes a later sequence than a newer change
            self._last, self._forwarded_at = change, time.monotonic()
            self._forward(change, heartbeat=False)

    def _beat(self) -> None:
        interval = float(self._interval or 0)
        while not self._stop.wait(max(0.0, self._forwarded_at + interval - time.monotonic())):
            with self._beat_lock:
                if time.monotonic() < self._forwarded_at + interval:
                    continue  # a change was forwarded meanwhile: the next heartbeat is due an interval after it
                self._forwarded_at = time.monotonic()
                if self._last is not None:  # before the first valid document there is nothing to repeat
                    self._forward(replace(self._last, observed_at=time.time()), heartbeat=True)

    def _forward(self, change: DocumentChange, heartbeat: bool) -> None:
        envelope = build(change, self._sequencer.next(), self._sequencer.installation_id)
        if heartbeat:
            envelope = replace(envelope, properties={**envelope.properties, "heartbeat": True})
        for queue in self._queues:
            with queue.lock:
                queue.pending.append(envelope)
                queue.bytes += _size(envelope)
                self._bound(queue)
            self._drain(queue)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self, timeout: float = 8.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._retrier is not None:
            self._retrier.join(timeout)
        if self._heartbeat.is_alive():
            self._heartbeat.join(timeout)
        for queue in self._queues:
            self._drain(queue)  # one last try: space may have come back since the last attempt
            with queue.lock:
                lost = [envelope.sequence for envelope in queue.pending]
            if lost:
                log.error("%s never accepted %d documents (sequences %d-%d); they are lost as the sidecar stops",
                          queue.target.name, len(lost), lost[0], lost[-1])
                self._metrics.given_up.labels(queue.target.name).inc(len(lost))
            queue.target.close(timeout)

    def _bound(self, queue: _Queue) -> None:
        """Under ``queue.lock``: past the limit give up the oldest, never the newest nor one being written."""
        while queue.bytes > self._max_pending_bytes and len(queue.pending) > 1:
            index = 1 if queue.pending[0] is queue.in_flight else 0
            if index == len(queue.pending) - 1:
                return
            envelope = queue.pending[index]
            del queue.pending[index]
            queue.bytes -= _size(envelope)
            if queue.given_up == 0:
                log.error("%s: more than %d bytes of refused documents held in memory: giving up the oldest "
                          "(document %d first)", queue.target.name, self._max_pending_bytes, envelope.sequence)
            queue.given_up += 1
            self._metrics.given_up.labels(queue.target.name).inc()

    def _drain(self, queue: _Queue) -> bool:
        """Offer queued envelopes to the target, oldest first; True once none is left."""
        while True:
            if not queue.draining.acquire(blocking=False):
                return False  # another thread is draining; it looks again once it is done
            try:
                if not self._offer_all(queue):
                    return False
            finally:
                queue.draining.release()
            with queue.lock:
                if not queue.pending:
                    return True

    def _offer_all(self, queue: _Queue) -> bool:
        """Under ``queue.draining``; False when the target refused, with the refused envelope still first."""
        while True:
            with queue.lock:
                if not queue.pending:
                    break
                envelope = queue.in_flight = queue.pending[0]
            try:
                queue.target.accept(envelope)
            except Exception as error:  # whatever a target raises is a refusal: counted, kept, retried
                with queue.lock:
                    queue.in_flight = None
                self._refused(queue, envelope, error)
                return False
            with queue.lock:
                queue.in_flight = None
                queue.pending.popleft()
                queue.bytes -= _size(envelope)
        if queue.failing is not None:
            log.info("%s accepts documents again; the refused ones are written%s", queue.target.name,
                     f" ({queue.given_up} given up while it refused)" if queue.given_up else "")
            queue.failing, queue.given_up = None, 0
        return True

    def _refused(self, queue: _Queue, envelope: Envelope, error: Exception) -> None:
        """Counted every time; logged once per change of the target's health, without a traceback."""
        reason = refusal_reason(error)
        self._metrics.errors.labels(queue.target.name, reason).inc()
        if reason != queue.failing:
            text = (error.strerror if isinstance(error, OSError) else None) or str(error) or type(error).__name__
            log.error("%s refused document %d (%s: %s); it is kept in memory and retried, later documents queue "
                      "behind it", queue.target.name, envelope.sequence, reason, text[:300])
            queue.failing = reason
        self._start_retrier()
        self._wake.set()

    def _start_retrier(self) -> None:
        if self._retrier is None and not self._stop.is_set():
            self._retrier = threading.Thread(target=self._retry, name="forward-retry", daemon=True)
            self._retrier.start()

    def _retry(self) -> None:
        """Offer refused documents again, from ``retry_first`` doubling to ``retry_max``, until none is left."""
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            delay = self._retry_first
            while not self._stop.wait(delay):
                if all([self._drain(queue) for queue in self._queues]):  # a list: every queue gets its try
                    break
                delay = min(delay * 2, self._retry_max)


def file_line(envelope: Envelope) -> bytes:
    """One JSON object per line: the envelope's header and the document's exact text as ``body``."""
    record = envelope.header()
    del record["observed_at"]  # already in properties, as RFC 3339
    record["body"] = envelope.body.decode("utf-8", errors="surrogateescape")
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape") + b"\n"


class FileTarget:
    """Appends envelopes to a JSON-lines file for log shippers; written whole and fsynced before a document counts.

    A line that fails half-way (a short write on a full disk, then ENOSPC) is cut off again, so the file
    never holds a line reported as failed, and the next line does not start in the middle of it.
    """

    name = "file"

    def __init__(self, path: Path, metrics: ForwardMetrics, disk: Disk = DISK) -> None:
        self._metrics = metrics
        self._disk = disk
        self._lock = threading.Lock()
        self._torn: int | None = None  # where the file must be cut before the next line (a cut that failed)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | PLATFORM.open_flags, 0o666)
            self.last_sequence = self._recover(path)
        except OSError as exc:
            raise ConfigError(f"--forward-file {path}: cannot open it for appending ({exc.strerror})") from None
        self.path = path

    def accept(self, envelope: Envelope) -> None:
        line = file_line(envelope)
        with self._lock:
            if self._torn is not None:
                self._disk.ftruncate(self._fd, self._torn)
                self._torn = None
            size = os.fstat(self._fd).st_size
            try:
                write_all(self._disk, self._fd, line)
                self._disk.fdatasync(self._fd)
            except OSError:
                try:
                    self._disk.ftruncate(self._fd, size)
                except OSError:
                    self._torn = size
                raise
        self._metrics.forwarded.labels(self.name).inc()

    def close(self, timeout: float) -> None:
        with self._lock:
            os.close(self._fd)

    def _recover(self, path: Path) -> int:
        """The sequence of the file's last line (0 if none), after cutting off a line of ours left incomplete by
        a crash; a file that ends in text of another writer gets a newline so our first line starts clean."""
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            tail = _tail(handle, size)
        if not tail:
            return 0
        start = tail.rfind(b"\n", 0, len(tail) - 1) + 1
        if not tail.endswith(b"\n"):
            if not tail[start:].startswith(b'{"sequence":'):
                write_all(self._disk, self._fd, b"\n")
                return 0
            log.warning("%s ends in an incomplete line (%d bytes, a write cut short): removed", path,
                        len(tail) - start)
            os.ftruncate(self._fd, size - (len(tail) - start))
            return self._recover(path)
        try:
            sequence = json.loads(tail[start:])["sequence"]
        except (ValueError, RecursionError, TypeError, KeyError, IndexError):
            return 0
        return sequence if type(sequence) is int else 0


def _tail(handle: BinaryIO, size: int, limit: int = 16 << 20) -> bytes:
    """The end of a file, read backwards until it holds the whole last line (or ``limit`` bytes)."""
    end, data = size, b""
    while end > 0 and len(data) < limit:
        start = max(0, end - (1 << 16))
        handle.seek(start)
        data = handle.read(end - start) + data
        end = start
        if data.count(b"\n", 0, len(data) - 1):  # a newline before the last byte: the last line is all here
            break
    return data
