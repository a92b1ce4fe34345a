"""Forwarding of raw documents: one envelope per changed document, handed to every target.

Targets: the JSON-lines file (``forward_file.py``, written and fsynced at once) and the Event Hubs
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

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from se_exporter.core.retry import Health, backoff
from se_exporter.infra.files import is_disk_full
from se_exporter.sidecar.metrics import NAMESPACE
from se_exporter.sidecar.sinks import DocumentChange, ImdsHealth, Sink
from se_exporter.sidecar.sinks.envelope import Envelope, Sequencer, build

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
    health: Health = field(default_factory=Health)  # failing: the reason of the current refusals
    given_up: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    draining: threading.Lock = field(default_factory=threading.Lock)


    def __len__(self) -> int:
        return len(self.pending)


def _size(envelope: Envelope) -> int:
    return len(envelope.body) + _ENVELOPE_OVERHEAD


class ForwardSink(Sink):
    """The ``Sink`` that builds envelopes; a refusing target keeps its documents queued, the others go on.

    With ``heartbeat_interval`` the current document is forwarded again whenever nothing was forwarded for that
    long: a quiet VM stays visible to consumers (``se-exporter fleet`` expires silent ones). A heartbeat is the
    same envelope with a new sequence, ``observed_at`` now, and the property ``heartbeat: true``.

    Every envelope carries the VM's IMDS health (``imds_last_success``, ``imds_failing``): a change is a successful
    read itself; a heartbeat asks ``imds_health`` (the poll loop's view, passed in by the assembly), so a heartbeat
    sent during an IMDS outage says that the document it repeats is as of the last successful read.
    """

    name = "forward"

    def __init__(self, sequencer: Sequencer, targets: Sequence[Target], metrics: ForwardMetrics,
                 max_pending_bytes: int = MAX_PENDING_BYTES, retry_first: float = RETRY_FIRST,
                 retry_max: float = RETRY_MAX, heartbeat_interval: float | None = None,
                 imds_health: Callable[[], ImdsHealth] | None = None) -> None:
        self._sequencer = sequencer
        self._imds_health = imds_health
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
                    # Without the poll loop's view (a sink built alone), the last change is the last read known.
                    health = self._imds_health() if self._imds_health is not None \
                        else ImdsHealth(self._last.observed_at, failing=False)
                    self._forward(replace(self._last, observed_at=time.time()), heartbeat=True, health=health)

    def _forward(self, change: DocumentChange, heartbeat: bool, health: ImdsHealth | None = None) -> None:
        envelope = build(change, self._sequencer.next(), self._sequencer.installation_id, health)
        if heartbeat:
            envelope = replace(envelope, properties={**envelope.properties, "heartbeat": True})
        for queue in self._queues:
            with queue.lock:
                queue.pending.append(envelope)
                queue.bytes += _size(envelope)
                self._bound(queue)
            self._drain(queue)

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
        if queue.health.recover():
            log.info("%s accepts documents again; the refused ones are written%s", queue.target.name,
                     f" ({queue.given_up} given up while it refused)" if queue.given_up else "")
            queue.given_up = 0
        return True

    def _refused(self, queue: _Queue, envelope: Envelope, error: Exception) -> None:
        """Counted every time; logged once per change of the target's health, without a traceback."""
        reason = refusal_reason(error)
        self._metrics.errors.labels(queue.target.name, reason).inc()
        if queue.health.fail(reason):
            text = (error.strerror if isinstance(error, OSError) else None) or str(error) or type(error).__name__
            log.error("%s refused document %d (%s: %s); it is kept in memory and retried, later documents queue "
                      "behind it", queue.target.name, envelope.sequence, reason, text[:300])
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
            attempts = 1
            while not self._stop.wait(backoff(attempts, self._retry_first, self._retry_max)):
                if all([self._drain(queue) for queue in self._queues]):  # a list: every queue gets its try
                    break
                attempts += 1
