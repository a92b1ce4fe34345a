"""Fuzzing (hypothesis): random JSON and mutations of the documented shapes through parse, lifecycle, collector
and sinks, and byte-level faults through the real transport. No exception may escape, and the invariants must hold
after every document."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from email.utils import format_datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from se_exporter.core.errors import ImdsError, ImdsTimeout, InvalidDocument
from se_exporter.core.lifecycle import CANCELED, COMPLETED, SCHEDULED, STARTED, EventRecord, diff
from se_exporter.core.model import VmIdentity, parse_document
from se_exporter.infra.logs import JsonFormatter, TextFormatter
from se_exporter.sidecar.imds import ImdsClient
from se_exporter.sidecar.metrics import EVENT, Metrics
from se_exporter.sidecar.sinks import DocumentChange, FanOut
from se_exporter.sidecar.sinks.eventlog import LogSink
from se_exporter.sidecar.sinks.spans import EventIdGenerator, SpanSink
from se_exporter.sidecar.sinks.transition_metrics import MetricsSink
from se_exporter.sidecar.snapshot import Snapshot
from se_exporter.sidecar.transport import KeepAliveTransport
from tests.conftest import Reliability
from tests.support.fakes.http_server import CLOSE, Drip, ScriptedServer

HUGE_MARK = "<5000 digits>"  # replaced in the JSON text by a 5,000-digit number (past Python's int-string limit)
DOCUMENTS_PER_EXAMPLE = 20
EXAMPLES = 500
MINIMUM_DOCUMENTS = 10_000

# Strings IMDS could send that no UTF-8 encoder takes (lone surrogates, valid JSON escapes) or that forge log lines.
nasty_text = st.lists(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.sampled_from(
    ["\n", "\r", "\x1b[31m", "\x9b", "\u2028", "\u202e", "\x00", '"', "\\", "critical "]) | st.characters(),
    min_size=1, max_size=8).map("".join)
huge_numbers = st.integers(2**63, 2**200) | st.integers(-(2**200), -(2**63) - 1) | st.just(HUGE_MARK)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20) | nasty_text | huge_numbers,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
# Every character UTF-8 encodes (all but the surrogates): the same set as codec="utf-8", which costs a fresh
# checkout 4 s of CPU to compute (hypothesis then caches it in .hypothesis/).
junk = json_values | st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30)
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
    # A small pool of EventIds, so events persist, change, change case and disappear across a sequence, and come
    # back after they ended (as a replayed stale document would); rarely junk, unencodable or missing.
    event_id = st.one_of(*[st.sampled_from(["E1", "E2", "E3", "e1", " E2 ", "E\ud800"])] * 9, junk)
    # Every other key optional (missing keys); extra keys allowed (unknown fields).
    required = st.fixed_dictionaries({"EventId": event_id}, optional={**documented, "Extra": junk, "Zones": junk})
    return st.one_of(required, required, required, required, required, required, required, required, required,
                     st.fixed_dictionaries({}, optional={**documented, "EventId": event_id}))


def _document() -> st.SearchStrategy[Any]:
    events = st.lists(_event(), max_size=6)
    huge = _event().map(lambda event: [event] * 300)  # huge arrays, duplicate EventIds
    shaped = st.fixed_dictionaries(
        {"Events": st.one_of(events, events, events, events, events, events, huge, junk)},
        optional={"DocumentIncarnation": mostly(st.integers(-5, 50) | st.integers(0, 50).map(str) | huge_numbers),
                  "Other": junk})
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
        self.sinks = FanOut([MetricsSink(self.metrics), SpanSink(provider, ids, None), LogSink()],
                            on_error=errors.append)
        self.counters: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.ended: dict[str, EventRecord] = {}
        self.seen: set[tuple[str, str]] = set()  # (event key, transition) pairs so far

    def feed(self, now: float, raw: bytes) -> None:
        try:
            document = parse_document(raw)
        except InvalidDocument:
            return  # refused with a reason; the previous state stays, which the next step checks
        previous = self.snapshot.records
        step = diff(previous, document, now, self.ended)
        ended = [t for t in step.transitions if t.kind in (COMPLETED, CANCELED)]
        gone = set(previous) - set(step.records) - set(self.ended)
        assert sorted(t.event.key for t in ended) == sorted(gone)  # each gone event ends exactly once
        for transition in ended:
            assert transition.kind == (COMPLETED if previous[transition.event.key].started_at is not None
                                       else CANCELED)
        for transition in step.transitions:  # never twice per event, however its id is spelt or replayed
            once = CANCELED if transition.kind == COMPLETED else transition.kind  # an event ends one way
            if transition.kind in (SCHEDULED, STARTED, COMPLETED, CANCELED):
                assert (transition.event.key, once) not in self.seen, transition
                self.seen.add((transition.event.key, once))
        assert set(step.records) == {event.key for event in document.events}
        self.ended = dict(step.ended)
        self.snapshot = Snapshot(records=step.records, incarnation=document.incarnation, up=True,
                                 has_document=True, vm_name="vm0", identity=VmIdentity(name="vm0", vm_id="id"))
        self.sinks.on_change(DocumentChange(raw, document, step.transitions, step.records, now, "vm0",
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
        # series exist exactly for the events listed now
        assert listed == {record.event.event_id for record in records.values()}


@pytest.mark.long(seconds=420)
def test_fuzzed_documents_never_break_the_core_or_its_invariants(reliability: Reliability) -> None:
    """At least 10,000 generated documents per run: no exception escapes and every invariant holds throughout."""
    documents = 0

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(_document(), min_size=DOCUMENTS_PER_EXAMPLE, max_size=DOCUMENTS_PER_EXAMPLE))
    def sequence(docs: list[Any]) -> None:
        nonlocal documents
        run = Run()
        with _one_line_logs() as check_logs:
            for index, doc in enumerate(docs):
                documents += 1
                run.feed(1_000.0 + index, json.dumps(doc).replace(json.dumps(HUGE_MARK), "9" * 5000).encode())
            check_logs()
        scrape = generate_latest(run.registry).decode("utf-8")  # what /metrics serves: encodes, and parses back
        list(text_string_to_metric_families(scrape))

    sequence()
    assert documents >= MINIMUM_DOCUMENTS
    reliability("Fuzzing", f"{MINIMUM_DOCUMENTS:,}+ generated documents per run (random JSON; wrong types, missing "
                           "keys, huge arrays, unicode, unpaired surrogates, control characters, nulls, numbers past "
                           "64 bits and past 4,300 digits, duplicate and case-changed EventIds, ended events listed "
                           "again, incarnation going backwards)",
                "no exception escaped; each gone event ended exactly once (completed or canceled); no event "
                "scheduled, started or ended twice; counters never decreased; per-event series only for listed "
                "events; every scrape encodes and parses; every log record one line (text and JSON)")


@contextlib.contextmanager
def _one_line_logs() -> Iterator[Any]:
    """Capture the event log in both formats; the yielded check asserts one line per record in each."""
    streams = {"text": io.StringIO(), "json": io.StringIO()}
    handlers = []
    for name, stream in streams.items():
        handler = logging.StreamHandler(stream)
        handler.setFormatter(JsonFormatter() if name == "json" else TextFormatter())
        handlers.append(handler)
    events = logging.getLogger("se_exporter.events")
    level, propagate = events.level, events.propagate
    events.setLevel(logging.INFO)
    events.propagate = False
    for handler in handlers:
        events.addHandler(handler)

    def check() -> None:
        text = streams["text"].getvalue().splitlines()
        lines = streams["json"].getvalue().splitlines()
        assert len(text) == len(lines)
        assert all(re.match(r"\d{4}-\d\d-\d\dT[\d:.]+Z (warning|info) ", line) for line in text)
        for line in lines:
            json.loads(line)

    try:
        yield check
    finally:
        for handler in handlers:
            events.removeHandler(handler)
        events.setLevel(level)
        events.propagate = propagate


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None, database=None)  # no per-example deadline: a loaded machine is not a bug
def test_arbitrary_bytes_are_refused_cleanly(raw: bytes) -> None:
    """Bytes that are not a document raise InvalidDocument and nothing else."""
    with contextlib.suppress(InvalidDocument):
        parse_document(raw)


# ---------------------------------------------------------------------------------------------------- the wire

@st.composite
def _answer(draw: st.DrawFn) -> tuple[bytes, bytes | None, str]:
    """An HTTP answer for a generated body, framed by Content-Length or in random chunks, then perhaps broken: cut
    at any offset, a chunk size garbled, compressed, or given a Content-Length that is not one number. Returns the
    bytes on the wire, the body the client must return (None: it must fail) and what was done."""
    body = draw(st.binary(min_size=1, max_size=300))
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    if draw(st.booleans()):
        cuts = sorted(draw(st.sets(st.integers(1, len(body) - 1), max_size=6))) if len(body) > 1 else []
        parts = [body[start:end] for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        extension = draw(st.sampled_from([b"", b";ext=1"]))
        chunks = b"".join(b"%x%s\r\n%s\r\n" % (len(part), extension, part) for part in parts)
        wire = head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
        whole_from = len(wire) - len(b"\r\n\r\n")  # cut after the last chunk's "0": every byte of the body arrived
        if draw(st.integers(0, 9)) == 0:  # a chunk size that is not hexadecimal
            sizes = [match.start() for match in re.finditer(rb"\r\n[0-9a-f]+(;ext=1)?\r\n", wire[len(head):])]
            at = len(head) + draw(st.sampled_from(sizes)) + 2
            return wire[:at] + b"z" + wire[at + 1:], None, "bad chunk size"
    else:
        wire = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        whole_from = len(wire)
    fault = draw(st.sampled_from(["none", "cut", "cut", "cut", "encoding", "length"]))
    if fault == "cut":
        offset = draw(st.integers(0, len(wire) - 1))
        return wire[:offset], body if offset >= whole_from else None, f"cut at {offset}"
    if fault == "encoding":
        coding = draw(st.sampled_from(["gzip", "deflate", "br", "compress", "zstd", "x-gzip", "GZip", " gzip ,br"]))
        return wire.replace(head, head + b"Content-Encoding: " + coding.encode() + b"\r\n"), None, "compressed"
    if fault == "length" and b"Content-Length" in wire[:wire.index(b"\r\n\r\n")]:
        bad = draw(st.sampled_from([b"abc", b"-1", b"1e3", b"%d, %d" % (len(body), len(body) + 1)]))
        return wire.replace(b"Content-Length: %d" % len(body), b"Content-Length: " + bad), None, "bad length"
    return wire, body, "none"


@pytest.fixture(scope="module")
def wire() -> Iterator[tuple[ScriptedServer, ImdsClient]]:
    """One scripted loopback server and one real client (KeepAliveTransport) for all the examples."""
    server = ScriptedServer([])
    transport = KeepAliveTransport()
    client = ImdsClient(transport, server.url, "2020-07-01", timeout=2.0, first_call_timeout=2.0,
                        max_body_bytes=4096)
    yield server, client
    transport.close()
    server.close()


def test_byte_level_faults_never_pass_for_a_document(wire: tuple[ScriptedServer, ImdsClient],
                                                     reliability: Reliability) -> None:
    """Through the real transport: a whole answer gives exactly its body; a cut (at any offset), garbled chunk,
    compressed body or unusable Content-Length is an ImdsError; nothing else ever escapes."""
    server, client = wire
    tried: set[str] = set()

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(_answer())
    def exchange(answer: tuple[bytes, bytes | None, str]) -> None:
        raw, expected, what = answer
        tried.add(what.split(" at ")[0])
        server.script[:] = [raw, CLOSE]
        if expected is None:
            with pytest.raises(ImdsError):
                client.scheduled_events()
        else:
            assert client.scheduled_events() == expected

    exchange()
    assert tried == {"none", "cut", "bad chunk size", "compressed", "bad length"}
    reliability("Fuzzing", "400 generated answers through the real transport: bodies in Content-Length or random "
                           "chunks, cut at any offset, garbled chunk sizes, compressed, unusable Content-Length",
                "a whole answer gave exactly its body; every broken one was a failed poll; nothing else escaped")


def test_drip_feeds_end_in_the_body_or_a_timeout(wire: tuple[ScriptedServer, ImdsClient]) -> None:
    """Answers dripped a byte every few milliseconds against a total timeout of 20-200 ms: either the whole body
    in time or ImdsTimeout, and never much later than the timeout."""
    server, _ = wire

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.binary(min_size=1, max_size=40), st.floats(0.001, 0.005), st.floats(0.02, 0.2), st.booleans())
    def drip(body: bytes, interval: float, total: float, whole: bool) -> None:
        transport = KeepAliveTransport()
        client = ImdsClient(transport, server.url, "2020-07-01", timeout=total, first_call_timeout=total,
                            max_body_bytes=4096)
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        server.script[:] = [Drip(answer, interval) if whole else Drip(body, interval, head=answer[:-len(body)])]
        started = time.monotonic()
        try:
            assert client.scheduled_events() == body
        except ImdsTimeout:
            pass
        finally:
            transport.close()
        assert time.monotonic() - started < total + 2.5  # 2.5 s: the scheduler's share on 2 loaded cores

    drip()
