"""Forwarding of raw documents: one envelope per changed document, handed to every target.

Targets: the JSON-lines file (``--forward-file``, written and fsynced at once) and the Event Hubs
spool (``--spool-dir``, drained by the forwarder thread). The envelope is built once, so both carry
the same sequence number and message id.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from se_exporter.errors import ConfigError
from se_exporter.metrics import NAMESPACE
from se_exporter.sinks import DocumentChange
from se_exporter.sinks.envelope import Envelope, Sequencer, build

log = logging.getLogger("se_exporter.forward")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


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


class Target(Protocol):
    name: str

    def accept(self, envelope: Envelope) -> None: ...

    def close(self, timeout: float) -> None: ...


class ForwardSink:
    """The ``Sink`` that builds envelopes; a failing target is logged and counted, the others go on.

    With ``heartbeat_interval`` the current document is forwarded again whenever nothing was forwarded for that
    long: a quiet VM stays visible to consumers (``se-exporter fleet`` expires silent ones). A heartbeat is the
    same envelope with a new sequence, ``observed_at`` now, and the property ``heartbeat: true``.
    """

    name = "forward"

    def __init__(self, sequencer: Sequencer, targets: Sequence[Target], metrics: ForwardMetrics,
                 heartbeat_interval: float | None = None) -> None:
        self._sequencer = sequencer
        self._targets = tuple(targets)
        self._metrics = metrics
        for target in self._targets:  # the series exist at 0 from the start, so rate() and panels work at once
            metrics.forwarded.labels(target.name)
        self._interval = heartbeat_interval
        self._last: DocumentChange | None = None
        self._forwarded_at = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        if heartbeat_interval:
            self._heartbeat.start()

    def export(self, change: DocumentChange) -> None:
        with self._lock:  # one forward at a time: a heartbeat never takes a later sequence than a newer change
            self._last, self._forwarded_at = change, time.monotonic()
            self._forward(change, heartbeat=False)

    def _beat(self) -> None:
        interval = float(self._interval or 0)
        while not self._stop.wait(max(0.0, self._forwarded_at + interval - time.monotonic())):
            with self._lock:
                if time.monotonic() < self._forwarded_at + interval:
                    continue  # a change was forwarded meanwhile: the next heartbeat is due an interval after it
                self._forwarded_at = time.monotonic()
                if self._last is not None:  # before the first valid document there is nothing to repeat
                    self._forward(replace(self._last, observed_at=time.time()), heartbeat=True)

    def _forward(self, change: DocumentChange, heartbeat: bool) -> None:
        envelope = build(change, self._sequencer.next(), self._sequencer.installation_id)
        if heartbeat:
            envelope = replace(envelope, properties={**envelope.properties, "heartbeat": True})
        for target in self._targets:
            try:
                target.accept(envelope)
            except OSError as exc:
                log.error("%s could not accept document %d: %s", target.name, envelope.sequence, exc)
                self._metrics.errors.labels(target.name, "write").inc()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self, timeout: float = 8.0) -> None:
        self._stop.set()
        if self._heartbeat.is_alive():
            self._heartbeat.join(timeout)
        for target in self._targets:
            target.close(timeout)


def file_line(envelope: Envelope) -> bytes:
    """One JSON object per line: the envelope's header and the document's exact text as ``body``."""
    record = envelope.header()
    del record["observed_at"]  # already in properties, as RFC 3339
    record["body"] = envelope.body.decode("utf-8", errors="surrogateescape")
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape") + b"\n"


class FileTarget:
    """Appends envelopes to a JSON-lines file for log shippers; fsynced before a document counts."""

    name = "file"

    def __init__(self, path: Path, metrics: ForwardMetrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = path.open("ab")
        except OSError as exc:
            raise ConfigError(f"--forward-file {path}: cannot open it for appending ({exc.strerror})") from None
        self.path = path

    def accept(self, envelope: Envelope) -> None:
        with self._lock:
            self._handle.write(file_line(envelope))
            self._handle.flush()
            os.fsync(self._handle.fileno())
        self._metrics.forwarded.labels(self.name).inc()

    def close(self, timeout: float) -> None:
        with self._lock:
            self._handle.close()

