"""OpenTelemetry spans: one trace per EventId, shared by every VM that sees the event.

The design (spans created when they end, from the lifecycle records; deterministic ids; zero-length update spans
for prompt visibility; continued across restarts) is docs/traces.md's.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from se_exporter.core.lifecycle import CANCELED, COMPLETED, STARTED, EventRecord, Transition
from se_exporter.core.model import ScheduledEvent, event_key, json_kind
from se_exporter.infra.files import StateFile, read_state_file
from se_exporter.sidecar.sinks import DocumentChange, PauseFelt, Sink
from se_exporter.sidecar.sinks.facts import event_facts, pause_facts, seconds_fact, transition_facts

log = logging.getLogger("se_exporter.spans")
PREFIX = "azure.scheduled_event."
MAX_SPAN_EVENTS = 128
# Span events carry neither the Description nor the Resources (the span they belong to does), so 128 of them per
# open event stay small.
_SPAN_ONLY = frozenset({PREFIX + "id", PREFIX + "description", PREFIX + "resources"})


def trace_id_for(event_id: str) -> int:
    """The first 16 bytes of SHA-256 over the lower-cased EventId (``event_key``), as the 128-bit trace id."""
    value = int.from_bytes(hashlib.sha256(event_key(event_id).encode()).digest()[:16], "big")
    return value or 1


def span_id_for(event_id: str, vm_key: str, role: str) -> int:
    key = f"{event_key(event_id)}/{vm_key}/{role}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") or 1


def vm_key(change: DocumentChange | PauseFelt) -> str:
    """What this VM is, as far as known: a part of its span ids."""
    return f"{change.identity.vm_id if change.identity else ''}/{change.vm_name or ''}"


def root_context(event_id: str, vm_key: str) -> Any:
    """The context of the event's ``scheduled_event`` span on this VM, for what belongs under it before it ends."""
    context = SpanContext(trace_id=trace_id_for(event_id), span_id=span_id_for(event_id, vm_key, "root"),
                          is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(context))


class EventIdGenerator(IdGenerator):
    """Hands out the ids chosen for the span being started; random ids otherwise."""

    def __init__(self) -> None:
        self._chosen: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("ids", default=None)
        self._random = RandomIdGenerator()

    @contextlib.contextmanager
    def ids(self, trace_id: int, span_id: int) -> Iterator[None]:
        token = self._chosen.set((trace_id, span_id))
        try:
            yield
        finally:
            self._chosen.reset(token)

    def generate_trace_id(self) -> int:
        chosen = self._chosen.get()
        return chosen[0] if chosen else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        chosen = self._chosen.get()
        return chosen[1] if chosen else self._random.generate_span_id()


def attribute_name(fact: str) -> str:
    """The span attribute of a fact (``facts``): its name under ``PREFIX``, without the ``event_`` the Azure names
    repeat (``event_id`` is ``azure.scheduled_event.id``, ``resource_type`` stays)."""
    return PREFIX + fact.removeprefix("event_")


def attributes(*facts: Mapping[str, Any]) -> dict[str, Any]:
    """Facts (``facts.event_facts``, ``facts.transition_facts``) as OpenTelemetry attributes."""
    return {attribute_name(name): value for group in facts for name, value in group.items()}


# Span events gathered for one open event's ``scheduled_event`` span: (name, time in ns, attributes).
_SpanEvents = list[tuple[str, int, dict[str, Any]]]
_ATTRIBUTE_TYPES = (str, bool, int, float)


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"a JSON {json_kind(value)} where a list belongs")
    return value


def _span_event(item: Any) -> tuple[str, int, dict[str, Any]]:
    """One saved span event, ``[name, time_ns, attributes]``, checked to be what ``_note`` writes."""
    name, timestamp, attrs = _list(item) if len(_list(item)) == 3 else (None, None, None)
    if not isinstance(name, str) or type(timestamp) is not int or not isinstance(attrs, dict):
        raise ValueError("a span event is not [name, time in ns, attributes]")
    for value in attrs.values():
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, _ATTRIBUTE_TYPES) for v in values):
            raise ValueError("a span event attribute is not a string, number, boolean or a list of them")
    return name, timestamp, attrs


class SpanSink(Sink):
    name = "spans"

    def __init__(self, provider: TracerProvider, ids: EventIdGenerator, state_dir: Path | None) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("se_exporter")
        self._ids = ids
        self._path = state_dir / "spans.json" if state_dir else None
        self._file = StateFile(self._path, log, "cannot write the span state file %s: %s",
                               "span state file %s written again") if self._path else None
        # Keyed by event_key, as the records are (a file written before keys were lower-cased still loads).
        self._open: dict[str, _SpanEvents] = {event_key(event_id): opened for event_id, opened in self._load().items()}
        self._last: dict[str, ScheduledEvent] = {}

    def on_change(self, change: DocumentChange) -> None:
        vm, incarnation = vm_key(change), change.document.incarnation
        moved = {t.event.key for t in change.transitions}
        for transition in change.transitions:
            self._transition(transition, vm, incarnation, change)
        for key, record in change.records.items():
            before = self._last.get(key)
            if before is not None and before != record.event and key not in moved:
                self._note(record, vm, incarnation, change, {"transition": "changed"})
        self._last = {key: record.event for key, record in change.records.items()}
        # Only listed events can still end; anything else (say, state left from another stream) would grow for ever.
        self._open = {key: opened for key, opened in self._open.items() if key in change.records}
        self._save()

    def on_pause(self, felt: PauseFelt) -> None:
        """A ``scheduled_event.pause`` span in the trace of the event the pause belongs to, lasting what it did; a
        pause of no event's (unannounced) or explained by throttling is a log record only."""
        record = felt.record
        if record is None or felt.pause.throttled:
            return
        event_id = record.event.event_id
        attrs = attributes(event_facts(record.event, None, felt.vm_name), pause_facts(felt))
        start = int(felt.began_at * 1e9)
        span = self._tracer.start_span("scheduled_event.pause", context=root_context(event_id, vm_key(felt)),
                                       kind=SpanKind.INTERNAL, attributes=attrs, start_time=start)
        span.end(end_time=start + int(felt.pause.seconds * 1e9))

    def _transition(self, transition: Transition, vm_key: str, incarnation: int | None,
                    change: DocumentChange) -> None:
        record, kind = transition.record, transition.kind
        self._note(record, vm_key, incarnation, change, transition_facts(transition, change))
        event_id = record.event.event_id
        attrs = attributes(event_facts(record.event, incarnation, change.vm_name))
        # The notice ends when the event starts, or when it is canceled before it starts. Each span starts at the
        # wall clock's reading and lasts what the monotonic clock measured (EventRecord), so a clock stepped back
        # between its ends never makes it end before it began.
        notice = {STARTED: record.notice_seconds, CANCELED: record.lifetime_seconds}.get(kind)
        if kind in (STARTED, CANCELED):
            self._span(event_id, vm_key, "scheduled_event.notice", "notice", record.first_seen, notice, attrs)
        if kind in (COMPLETED, CANCELED) and record.gone_at is not None:
            if kind == COMPLETED and record.started_at is not None:
                self._span(event_id, vm_key, "scheduled_event.impact", "impact", record.started_at,
                           record.impact_seconds, attrs)
            self._span(event_id, vm_key, "scheduled_event", "root", record.first_seen, record.lifetime_seconds,
                       {**attrs, PREFIX + "outcome": kind.value,
                        PREFIX + "longest_pause_seconds": seconds_fact(record.longest_pause)},
                       self._open.pop(record.event.key, []))

    def _note(self, record: EventRecord, vm_key: str, incarnation: int | None, change: DocumentChange,
              transition: Mapping[str, Any]) -> None:
        """A span event for the root span later, and a zero-length update span now (``transition``: the
        transition's facts, or only its kind for a change that is not one)."""
        event_id = record.event.event_id
        now_ns = int(change.observed_at * 1e9)
        attrs = attributes(event_facts(record.event, incarnation, change.vm_name), transition)
        opened = self._open.setdefault(record.event.key, [])
        if len(opened) < MAX_SPAN_EVENTS:
            opened.append((transition["transition"], now_ns, {k: v for k, v in attrs.items() if k not in _SPAN_ONLY}))
        span = self._tracer.start_span("scheduled_event.update", context=root_context(event_id, vm_key),
                                       kind=SpanKind.INTERNAL,
                                       attributes=attrs, start_time=now_ns)
        span.end(end_time=now_ns)

    def _span(self, event_id: str, vm_key: str, name: str, role: str, start: float, seconds: float | None,
              attrs: Mapping[str, Any], events: _SpanEvents | None = None) -> None:
        trace_id = trace_id_for(event_id)
        context = None if role == "root" else root_context(event_id, vm_key)
        with self._ids.ids(trace_id, span_id_for(event_id, vm_key, role)):
            span = self._tracer.start_span(name, context=context, kind=SpanKind.INTERNAL, attributes=dict(attrs),
                                           start_time=int(start * 1e9))
        for event_name, timestamp, event_attrs in events or ():
            span.add_event(event_name, event_attrs, timestamp=timestamp)
        span.end(end_time=int((start + max(0.0, seconds or 0.0)) * 1e9))

    def _load(self) -> dict[str, _SpanEvents]:
        """Span events saved before a restart; a file of any other shape is logged once and ignored."""
        if self._path is None or not self._path.exists():
            return {}
        try:
            data = json.loads(read_state_file(self._path))
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {json_kind(data)}, not an object")
            return {str(event_id): [_span_event(item) for item in _list(events)][:MAX_SPAN_EVENTS]
                    for event_id, events in data.items()}
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("ignoring the span state file %s: %s", self._path, str(exc)[:300])
            return {}

    def _save(self) -> None:
        if self._file is None:
            return
        self._file.save(json.dumps(self._open, separators=(",", ":")).encode())

    def shutdown(self) -> None:
        self._provider.shutdown()
