"""Forwarding of raw documents: one envelope per changed document, handed to every target.

Targets: the JSON-lines file (``forward_file.py``, written and fsynced at once) and Event Hubs (``eventhubs.py``,
through the spool on disk). The envelope is built once, so every target carries the same sequence number and message
id. Off the poll thread: a worker numbers each change and builds its envelope, and each target has a queue and worker
of its own (``infra/batching.py``); what a refusing target keeps, and what can be lost, is docs/forwarding.md's ("A full
disk").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from se_exporter.infra.batching import BatchProcessor, Deliverer, MemoryQueue
from se_exporter.infra.files import is_disk_full
from se_exporter.sidecar.forwarding.envelope import Envelope, Sequencer, build
from se_exporter.sidecar.metrics import NAMESPACE
from se_exporter.sidecar.sinks import DocumentChange, ImdsHealth, Sink

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


def _size(item: Envelope | DocumentChange | _Beat) -> int:
    """Roughly what an item holds in memory: its document, and properties and bookkeeping besides."""
    body = item.raw if isinstance(item, DocumentChange) else item.body if isinstance(item, Envelope) else b""
    return len(body) + _ENVELOPE_OVERHEAD


class TargetDeliverer(Deliverer[Envelope]):
    """A target as an exporter: envelopes offered one by one, oldest first, until one is refused."""

    def __init__(self, target: Target, timeout: float = 8.0) -> None:
        self.name, self._target, self._timeout = target.name, target, timeout

    def deliver(self, batch: Sequence[Envelope]) -> int:
        for done, envelope in enumerate(batch):
            try:
                self._target.accept(envelope)
            except Exception:
                if done:
                    return done  # the next attempt starts with the refused one, and counts its refusal
                raise
        return len(batch)

    def label(self, item: Envelope) -> str:
        return f"document {item.sequence}"

    def shutdown(self) -> None:
        self._target.close(self._timeout)


@dataclass(frozen=True)
class _Beat:
    """A heartbeat due: the last change forwarded again, with the IMDS health as of now."""

    health: ImdsHealth | None


class _Envelopes(Deliverer["DocumentChange | _Beat"]):
    """Numbers each change (and heartbeat) and queues its envelope for every target, in order.

    A sidecar that forwarded under its name and then learns its vm_id sends one ``retires_name`` message under the
    old key first (``_retirement``; why: docs/architecture.md). Known in memory only."""

    name = "forward"

    def __init__(self, sequencer: Sequencer, targets: Sequence[BatchProcessor[Envelope]]) -> None:
        self._sequencer, self._targets = sequencer, targets
        self._last: DocumentChange | None = None
        self._named: str | None = None  # the key (a name) last forwarded under while no vm_id was known

    def deliver(self, batch: Sequence[DocumentChange | _Beat]) -> int:
        for item in batch:
            taken = self._take(item)
            if taken is not None:
                self._forward(*taken, beat=isinstance(item, _Beat))
        return len(batch)

    def _take(self, item: DocumentChange | _Beat) -> tuple[DocumentChange, ImdsHealth | None] | None:
        """The change ``item`` forwards: a document's own, or for a heartbeat the last one again, read now (none
        before the first valid document: there is nothing to repeat)."""
        if not isinstance(item, _Beat):
            self._last = item
            return item, None
        if self._last is None:
            return None
        # Without the poll loop's view (a sink built alone), the last change is the last read known.
        health = item.health or ImdsHealth(self._last.observed_at, failing=False)
        return replace(self._last, observed_at=time.time()), health

    def _forward(self, change: DocumentChange, health: ImdsHealth | None, beat: bool) -> None:
        """One envelope of ``change``, after the message retiring the name it was last forwarded under once its
        vm_id is known."""
        if self._named is not None and change.identity is not None and change.identity.vm_id:
            self._emit(self._retirement(change, self._named))
            self._named = None
        envelope = build(change, self._sequencer.next(), self._sequencer.installation_id, health)
        if beat:
            envelope = replace(envelope, properties={**envelope.properties, "heartbeat": True})
        properties = envelope.properties
        if not properties["vm_id"] and properties["vm_name"] and envelope.partition_key == properties["vm_name"]:
            self._named = envelope.partition_key
        self._emit(envelope)

    def _retirement(self, change: DocumentChange, named: str) -> Envelope:
        """The one message under the old key ``named`` that retires the VM known by that name (see the class)."""
        envelope = build(change, self._sequencer.next(), self._sequencer.installation_id)
        return replace(envelope, partition_key=named,
                       properties={**envelope.properties, "vm_name": named, "retires_name": True})

    def _emit(self, envelope: Envelope) -> None:
        for target in self._targets:
            target.emit(envelope)


class ForwardSink(Sink):
    """The ``Sink`` that builds envelopes; a refusing target keeps its documents queued, the others go on.

    With ``heartbeat_interval`` the current document is forwarded again whenever nothing was forwarded for that
    long, with the IMDS health ``imds_health`` (the poll loop's view) gives: docs/forwarding.md says what a
    heartbeat carries and why.
    """

    name = "forward"

    def __init__(self, sequencer: Sequencer, targets: Sequence[Target], metrics: ForwardMetrics,
                 max_pending_bytes: int = MAX_PENDING_BYTES, retry_first: float = RETRY_FIRST,
                 retry_max: float = RETRY_MAX, heartbeat_interval: float | None = None,
                 imds_health: Callable[[], ImdsHealth] | None = None) -> None:
        self._imds_health = imds_health
        self._targets = tuple(self._processor(target, metrics, max_pending_bytes, retry_first, retry_max)
                              for target in targets)
        # The changes not yet numbered: a handful at most, unless the state directory's disk stalls.
        self._changes: BatchProcessor[DocumentChange | _Beat] = BatchProcessor(
            MemoryQueue(MAX_PENDING_BYTES, _size, lambda item: metrics.given_up.labels(self.name).inc()),
            _Envelopes(sequencer, self._targets), refusal_reason,
            on_error=lambda reason: metrics.errors.labels(self.name, reason).inc(),
            on_lost=metrics.given_up.labels(self.name).inc, retry_first=retry_first, retry_max=retry_max)
        self._interval = heartbeat_interval
        self._forwarded_at = time.monotonic()
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        if heartbeat_interval:
            self._heartbeat.start()

    @staticmethod
    def _processor(target: Target, metrics: ForwardMetrics, max_pending_bytes: int, retry_first: float,
                   retry_max: float) -> BatchProcessor[Envelope]:
        name = target.name
        given_up = metrics.given_up.labels(name)
        metrics.forwarded.labels(name)  # the series exist at 0 from the start, so rate() and panels work at once

        def drop(envelope: Envelope) -> None:
            log.error("%s: more than %d bytes of refused documents held in memory: gave up the oldest (document %d)",
                      name, max_pending_bytes, envelope.sequence)
            given_up.inc()

        queue = MemoryQueue(max_pending_bytes, _size, drop)
        metrics.pending.labels(name).set_function(queue.__len__)
        return BatchProcessor(queue, TargetDeliverer(target), refusal_reason,
                              on_error=lambda reason: metrics.errors.labels(name, reason).inc(),
                              on_lost=given_up.inc, retry_first=retry_first, retry_max=retry_max)

    def on_change(self, change: DocumentChange) -> None:
        self._forwarded_at = time.monotonic()
        self._changes.emit(change)

    def _beat(self) -> None:
        interval = float(self._interval or 0)
        while not self._stop.wait(max(0.0, self._forwarded_at + interval - time.monotonic())):
            if time.monotonic() < self._forwarded_at + interval:
                continue  # a change was forwarded meanwhile: the next heartbeat is due an interval after it
            self._forwarded_at = time.monotonic()
            self._changes.emit(_Beat(self._imds_health() if self._imds_health is not None else None))

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Every change numbered and every envelope accepted by its target, within ``timeout_millis``."""
        end = time.monotonic() + timeout_millis / 1000
        flushed = self._changes.force_flush(timeout_millis)
        for target in self._targets:
            flushed = target.force_flush(int(max(0.0, end - time.monotonic()) * 1000)) and flushed
        return flushed

    def shutdown(self, timeout: float = 8.0) -> None:
        """Within ``timeout`` seconds for all of it: every change handed to the targets, which then stop."""
        end = time.monotonic() + timeout
        self._stop.set()
        if self._heartbeat.is_alive():
            self._heartbeat.join(timeout)
        self._changes.shutdown(max(0.0, end - time.monotonic()))
        for target in self._targets:
            target.shutdown(max(0.0, end - time.monotonic()))
