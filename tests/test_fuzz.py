"""Fuzzing (hypothesis): random JSON and mutations of the documented shapes through parse, lifecycle, collector
and sinks. No exception may escape, and the invariants must hold after every document."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timezone
from email.utils import format_datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from se_exporter.errors import InvalidDocument
from se_exporter.imds import VmIdentity
from se_exporter.lifecycle import CANCELED, COMPLETED, EventRecord, diff
from se_exporter.metrics import EVENT, Metrics, Snapshot
from se_exporter.model import parse_document
from se_exporter.sinks import DocumentChange, FanOut
from se_exporter.sinks.metrics import MetricsSink
from se_exporter.sinks.spans import EventIdGenerator, SpanSink
from tests.conftest import Reliability

DOCUMENTS_PER_EXAMPLE = 20
EXAMPLES = 500
MINIMUM_DOCUMENTS = 10_000

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
junk = json_values | st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc))
not_before = st.one_of(
    times.map(lambda t: format_datetime(t, usegmt=True)), times.map(lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")),
    st.just(""), junk)


def mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The documented value four times in five, anything at all otherwise (wrong types, nulls, unicode)."""
    return st.one_of(good, good, good, good, junk)


def _event() -> st.SearchStrategy[dict[str, Any]]:
    documented = {
        "EventType": mostly(st.sampled_from(["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "Hibernate"])),
        "EventStatus": mostly(st.sampled_from(["Scheduled", "Started"])),
        "ResourceType": mostly(st.just("VirtualMachine")),
        "Resources": mostly(st.lists(st.sampled_from(["vm0", "vm1", "_vm0"]) | st.text(max_size=10), max_size=4)),
        "NotBefore": not_before,
        "Description": mostly(st.text(max_size=40)),
        "EventSource": mostly(st.sampled_from(["Platform", "User"])),
        "DurationInSeconds": mostly(st.integers(-1, 3600)),
    }
    # A small pool of EventIds, so events persist, change and disappear across a sequence; rarely junk or missing.
    event_id = st.one_of(*[st.sampled_from(["E1", "E2", "E3", "e1"])] * 9, junk)
    # Every other key optional (missing keys); extra keys allowed (unknown fields).
    required = st.fixed_dictionaries({"EventId": event_id}, optional={**documented, "Extra": junk, "Zones": junk})
    return st.one_of(required, required, required, required, required, required, required, required, required,
                     st.fixed_dictionaries({}, optional={**documented, "EventId": event_id}))


def _document() -> st.SearchStrategy[Any]:
    events = st.lists(_event(), max_size=6)
    huge = _event().map(lambda event: [event] * 300)  # huge arrays, duplicate EventIds
    shaped = st.fixed_dictionaries(
        {"Events": st.one_of(events, events, events, events, events, events, huge, junk)},
        optional={"DocumentIncarnation": mostly(st.integers(-5, 50) | st.integers(0, 50).map(str)), "Other": junk})
    return st.one_of(shaped, shaped, shaped, json_values)  # mostly document-like, some plain random JSON


class Run:
    """The sidecar's core and sinks on one sequence of documents, checking invariants as it goes."""

    def __init__(self) -> None:
        self.snapshot = Snapshot(vm_name="vm0")
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry, lambda: self.snapshot, clock=lambda: 2_000_000_000.0)
        ids = EventIdGenerator()
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(id_generator=ids)
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        errors: list[str] = []
        self.errors = errors
        self.sinks = FanOut([MetricsSink(self.metrics), SpanSink(provider, ids, None)], on_error=errors.append)
        self.counters: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}

    def feed(self, now: float, raw: bytes) -> None:
        try:
            document = parse_document(raw)
        except InvalidDocument:
            return  # refused with a reason; the previous state stays, which the next step checks
        previous = self.snapshot.records
        step = diff(previous, document, now)
        ended = [t for t in step.transitions if t.kind in (COMPLETED, CANCELED)]
        gone = set(previous) - set(step.records)
        assert sorted(t.event.event_id for t in ended) == sorted(gone)  # each gone event ends exactly once
        for transition in ended:
            assert transition.kind == (COMPLETED if previous[transition.event.event_id].started_at is not None
                                       else CANCELED)
        self.snapshot = Snapshot(records=step.records, incarnation=document.incarnation, up=True,
                                 has_document=True, vm_name="vm0", identity=VmIdentity(name="vm0", vm_id="id"))
        self.sinks.export(DocumentChange(raw, document, step.transitions, step.records, now, "vm0",
                                         self.snapshot.identity, "2020-07-01"))
        assert self.errors == []
        self.check_metrics(step.records)

    def check_metrics(self, records: dict[str, EventRecord] | Any) -> None:
        listed: set[str] = set()
        for family in self.registry.collect():
            for sample in family.samples:
                key = (sample.name, frozenset(sample.labels.items()))
                if sample.name.startswith(EVENT + "_"):
                    listed.add(sample.labels["event_id"])
                if sample.name.endswith(("_total", "_count", "_bucket")):
                    assert sample.value >= self.counters.get(key, 0.0), f"{sample.name} decreased"
                    self.counters[key] = sample.value
        assert listed == set(records)  # series exist exactly for the events listed now


def test_fuzzed_documents_never_break_the_core_or_its_invariants(reliability: Reliability) -> None:
    """At least 10,000 generated documents per run: no exception escapes and every invariant holds throughout."""
    documents = 0

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(_document(), min_size=DOCUMENTS_PER_EXAMPLE, max_size=DOCUMENTS_PER_EXAMPLE))
    def sequence(docs: list[Any]) -> None:
        nonlocal documents
        run = Run()
        for index, doc in enumerate(docs):
            documents += 1
            run.feed(1_000.0 + index, json.dumps(doc).encode())

    sequence()
    assert documents >= MINIMUM_DOCUMENTS
    reliability("Fuzzing", f"{MINIMUM_DOCUMENTS:,}+ generated documents per run (random JSON; wrong types, missing "
                           "keys, huge arrays, unicode, nulls, duplicate EventIds, incarnation going backwards)",
                "no exception escaped; each gone event ended exactly once (completed or canceled); counters never "
                "decreased; per-event series only for listed events")


@given(st.binary(max_size=200))
@settings(max_examples=300, database=None)
def test_arbitrary_bytes_are_refused_cleanly(raw: bytes) -> None:
    """Bytes that are not a document raise InvalidDocument and nothing else."""
    with contextlib.suppress(InvalidDocument):
        parse_document(raw)
