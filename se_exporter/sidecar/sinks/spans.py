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
from datetime import datetime
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from se_exporter.core.lifecycle import CANCELED, COMPLETED, STARTED, EventRecord, Transition
from se_exporter.core.model import EVENT_FIELDS, ScheduledEvent, affects_vm, event_key, json_kind
from se_exporter.core.spot import lead_seconds
from se_exporter.infra.files import StateFile, read_state_file
from se_exporter.sidecar.metrics import LABEL_MARK
from se_exporter.sidecar.sinks import DocumentChange, Sink

log = logging.getLogger("se_exporter.spans")
PREFIX = "azure.scheduled_event."
MAX_SPAN_EVENTS = 128
# An attribute value from IMDS holds at most this many characters (cut ones end in LABEL_MARK), a list attribute at
# most MAX_ATTRIBUTE_ITEMS of them: a 1 MiB Description kept whole in each update span, span event and log record
# took hundreds of MiB while the collector was down. Span events carry neither the Description nor the Resources
# (the span they belong to does), so 128 of them per open event stay small too.
MAX_ATTRIBUTE_CHARS = 1024
MAX_ATTRIBUTE_ITEMS = 256
_SPAN_ONLY = frozenset({PREFIX + "id", PREFIX + "description", PREFIX + "resources"})


def trace_id_for(event_id: str) -> int:
    """The first 16 bytes of SHA-256 over the lower-cased EventId (``event_key``), as the 128-bit trace id."""
    value = int.from_bytes(hashlib.sha256(event_key(event_id).encode()).digest()[:16], "big")
    return value or 1


def span_id_for(event_id: str, vm_key: str, role: str) -> int:
    key = f"{event_key(event_id)}/{vm_key}/{role}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") or 1


def vm_key(change: DocumentChange) -> str:
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


def bounded(value: Any) -> Any:
    """An attribute value within MAX_ATTRIBUTE_CHARS (and a list within MAX_ATTRIBUTE_ITEMS items of it)."""
    if isinstance(value, str):
        return value if len(value) <= MAX_ATTRIBUTE_CHARS else \
            value[:MAX_ATTRIBUTE_CHARS - len(LABEL_MARK)] + LABEL_MARK
    if isinstance(value, list):
        return [bounded(item) for item in value[:MAX_ATTRIBUTE_ITEMS]]
    return value


def attribute_name(attribute: str) -> str:
    """The span attribute of an ``EVENT_FIELDS`` row: its ScheduledEvent attribute under ``PREFIX``, without the
    ``event_`` the Azure names repeat (``event_id`` is ``azure.scheduled_event.id``, ``resource_type`` stays)."""
    return PREFIX + attribute.removeprefix("event_")


def attribute_value(value: Any) -> Any:
    """A field's value as an attribute: a list for a tuple, a time in ISO 8601 with ``Z``."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


def attributes(event: ScheduledEvent, incarnation: int | None, vm_name: str | None) -> dict[str, Any]:
    """The contract attributes of an event as last listed: one per field of ``EVENT_FIELDS`` that has a value
    (``attribute_name``), the document's incarnation and whether it affects this VM; each value bounded
    (``bounded``)."""
    values: dict[str, Any] = {}
    for row in EVENT_FIELDS:
        value = getattr(event, row.attribute)
        if value is not None:
            values[attribute_name(row.attribute)] = attribute_value(value)
    if incarnation is not None:
        values[PREFIX + "document_incarnation"] = incarnation
    affects = affects_vm(event, vm_name)
    if affects is not None:
        values[PREFIX + "affects_this_vm"] = affects
    return {key: bounded(value) for key, value in values.items()}


def transition_extras(transition: Transition, change: DocumentChange) -> dict[str, Any]:
    """What a transition adds to the event's attributes (spans' updates and the event log records alike): the
    NotBefore it moved from, that it came without notice, the recommendation a Preempt follows, the api-version."""
    record = transition.record
    extra: dict[str, Any] = {PREFIX + "api_version": change.api_version}
    if transition.previous_not_before is not None:
        extra[PREFIX + "previous_not_before"] = attribute_value(transition.previous_not_before)
    if transition.kind == STARTED:
        extra[PREFIX + "notice_seconds"] = max(0.0, record.notice_seconds or 0.0)
        extra[PREFIX + "skipped_scheduled"] = record.skipped_scheduled
    recommendation = change.follows.get(record.event.key)
    if recommendation is not None:
        extra[PREFIX + "follows_recommendation_id"] = bounded(recommendation.event.event_id)
        extra[PREFIX + "recommendation_lead_seconds"] = max(0.0, lead_seconds(record, recommendation) or 0.0)
    return extra


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

    def export(self, change: DocumentChange) -> None:
        vm, incarnation = vm_key(change), change.document.incarnation
        moved = {t.event.key for t in change.transitions}
        for transition in change.transitions:
            self._transition(transition, vm, incarnation, change)
        for key, record in change.records.items():
            before = self._last.get(key)
            if before is not None and before != record.event and key not in moved:
                self._note(record, "changed", vm, incarnation, change, {})
        self._last = {key: record.event for key, record in change.records.items()}
        # Only listed events can still end; anything else (say, state left from another stream) would grow for ever.
        self._open = {key: opened for key, opened in self._open.items() if key in change.records}
        self._save()

    def _transition(self, transition: Transition, vm_key: str, incarnation: int | None,
                    change: DocumentChange) -> None:
        record, kind = transition.record, transition.kind
        self._note(record, kind.value, vm_key, incarnation, change, transition_extras(transition, change))
        event_id = record.event.event_id
        attrs = attributes(record.event, incarnation, change.vm_name)
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
                       {**attrs, PREFIX + "outcome": kind.value}, self._open.pop(record.event.key, []))

    def _note(self, record: EventRecord, kind: str, vm_key: str, incarnation: int | None, change: DocumentChange,
              extra: Mapping[str, Any]) -> None:
        """A span event for the root span later, and a zero-length update span now."""
        event_id = record.event.event_id
        now_ns = int(change.observed_at * 1e9)
        attrs = {**attributes(record.event, incarnation, change.vm_name), PREFIX + "transition": kind, **extra}
        opened = self._open.setdefault(record.event.key, [])
        if len(opened) < MAX_SPAN_EVENTS:
            opened.append((kind, now_ns, {k: v for k, v in attrs.items() if k not in _SPAN_ONLY}))
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
