"""One small interface for every output, shaped like OpenTelemetry's ``SpanExporter``.

The poll loop hands each sink a ``DocumentChange`` only when the document's bytes changed, never per poll, so a
sink's cost is paid per change, and a ``PauseFelt`` for each pause the VM lived through. ``FanOut`` wraps the sinks
so that one failing sink is logged and counted and never stalls or breaks the others (as the OpenTelemetry SDK's
``SimpleSpanProcessor`` does with exporter errors). ``FanOut`` runs on the poll thread, so the sinks it calls directly
only count and log; whatever does I/O (forwarding, spans, log records) queues for a ``BatchProcessor``
(``infra/batching.py``) and returns at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from se_exporter.core.lifecycle import EventRecord, Transition
from se_exporter.core.model import Document, VmIdentity
from se_exporter.core.pause import Pause

log = logging.getLogger("se_exporter.sinks")


@dataclass(frozen=True)
class DocumentChange:
    """A new valid document and what it meant: the unit every sink consumes."""

    raw: bytes
    document: Document
    transitions: tuple[Transition, ...]
    records: Mapping[str, EventRecord]
    observed_at: float
    vm_name: str | None
    identity: VmIdentity | None
    api_version: str  # the one the document answers (with --api-version auto, the version in use)
    # Preempts first seen in this change (by key) -> the SpotRebalanceRecommendation each follows (core/spot.py)
    follows: Mapping[str, EventRecord] = field(default_factory=dict)


@dataclass(frozen=True)
class PauseFelt:
    """A pause (``core/pause.py``) as the outputs tell it: the record of the event it belongs to as folded (None:
    unannounced, or the event is gone), when it began on the wall clock, and the VM as in a ``DocumentChange``."""

    pause: Pause
    record: EventRecord | None
    began_at: float  # unix seconds
    vm_name: str | None
    identity: VmIdentity | None


@dataclass(frozen=True)
class ImdsHealth:
    """How the VM's reads of IMDS are going, as of now: what a heartbeat says besides the document it repeats.

    ``last_success`` is when the sidecar last read a valid document (unix seconds; None before the first),
    ``failing`` whether the latest poll failed: docs/forwarding.md says why a heartbeat carries them.
    """

    last_success: float | None
    failing: bool


class Sink:
    """Base of every output, shaped as OpenTelemetry's ``SpanExporter`` but named apart from it (a sink is handed a
    document change, not a batch to export): ``on_change`` is the one method a sink must write; ``force_flush`` and
    ``shutdown`` do nothing unless a sink holds something to flush or close."""

    name: str = "sink"

    def on_change(self, change: DocumentChange) -> None:
        raise NotImplementedError

    def on_pause(self, felt: PauseFelt) -> None:
        """A pause the VM lived through; most outputs do not tell pauses."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Deliver whatever is buffered within ``timeout_millis``; True when all of it was."""
        return True

    def shutdown(self) -> None:
        """Release what the sink holds; called once, after the last change."""


class FanOut:
    """Delivers each change to every sink; an exception in one is logged, counted and contained."""

    def __init__(self, sinks: Sequence[Sink], on_error: Callable[[str], None]) -> None:
        self._sinks = tuple(sinks)
        self._on_error = on_error

    def on_change(self, change: DocumentChange) -> None:
        for sink in self._sinks:
            try:
                sink.on_change(change)
            except Exception:  # a sink must never take the poll loop down
                log.exception("sink %s failed on incarnation %s", sink.name, change.document.incarnation)
                self._on_error(sink.name)

    def on_pause(self, felt: PauseFelt) -> None:
        for sink in self._sinks:
            try:
                sink.on_pause(felt)
            except Exception:
                log.exception("sink %s failed on a pause", sink.name)
                self._on_error(sink.name)

    def shutdown(self) -> None:
        for sink in self._sinks:
            try:
                sink.force_flush()
                sink.shutdown()
            except Exception:
                log.exception("sink %s failed to shut down", sink.name)
                self._on_error(sink.name)
