"""The poll loop with a scripted IMDS on loopback (tests/support/fakes/imds_http.py): outcomes, backoff, state kept,
logs."""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from se_exporter.core.lifecycle import diff
from se_exporter.core.model import VmIdentity, parse_document
from se_exporter.infra.http_server import HttpRequest
from se_exporter.sidecar.endpoints import routes
from se_exporter.sidecar.forwarding.envelope import Envelope, Sequencer
from se_exporter.sidecar.forwarding.forward import ForwardMetrics, ForwardSink
from se_exporter.sidecar.lifecycle_store import LifecycleStore
from se_exporter.sidecar.metrics import Metrics
from se_exporter.sidecar.poller import IdentityWatcher, Poller
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import FanOut
from se_exporter.sidecar.snapshot import CurrentState, Snapshot
from tests.support.fakes import imds_http
from tests.support.fakes.imds_http import scripted_imds
from tests.support.fakes.sinks import BrokenSink, RecordingSink
from tests.support.helpers import wait_until

FREEZE = {"EventId": "E1", "EventStatus": "Scheduled", "EventType": "Freeze", "ResourceType": "VirtualMachine",
          "Resources": ["vm0"], "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT", "DurationInSeconds": 5}
GOOD = json.dumps({"DocumentIncarnation": 2, "Events": [FREEZE]}).encode()
EMPTY = json.dumps({"DocumentIncarnation": 3, "Events": []}).encode()


@pytest.fixture(autouse=True)
def _close_servers() -> Iterator[None]:
    yield
    imds_http.close_all()


def make_poller(script: Iterable[httpx.Response | Exception], store: LifecycleStore | None = None,
                **overrides: float) -> tuple[Poller, CollectorRegistry, RecordingSink]:
    """A poller reading a loopback IMDS that answers from ``script`` (see ``tests/support/fakes/imds_http.py``). A hang
    (httpx's timeouts) is waited out at a 0.5 s timeout, the only wait these tests make."""
    script = list(script)
    hangs = any(isinstance(item, httpx.TimeoutException) for item in script)
    timeout = 0.5 if hangs else 2.0
    settings = Settings(poll_interval=overrides.get("poll_interval", 1.0), imds_timeout=timeout,
                        first_call_timeout=timeout if hangs else 120.0,
                        max_backoff=overrides.get("max_backoff", 5.0), vm_name="vm0")
    imds, _, _ = scripted_imds(script, timeout=settings.imds_timeout, first_call_timeout=settings.first_call_timeout,
                               api_version=settings.api_version)
    registry = CollectorRegistry()
    state = CurrentState(Snapshot(vm_name=settings.vm_name, api_version=settings.api_version))
    metrics = Metrics(registry, state.get)
    sink = RecordingSink()
    fan_out = FanOut([BrokenSink(), sink], on_error=lambda name: metrics.sink_errors.labels(name).inc())
    poller = Poller(imds, metrics, fan_out, settings, state, clock=iter(range(1000, 2000)).__next__, store=store)
    return poller, registry, sink


def polls(registry: CollectorRegistry, outcome: str) -> float | None:
    return registry.get_sample_value("azure_scheduled_events_polls_total", {"outcome": outcome})


def test_sinks_see_each_changed_document_once() -> None:
    """Unchanged bytes cost one comparison: sinks are called per change, not per poll."""
    poller, registry, sink = make_poller([httpx.Response(200, content=GOOD)] * 3 + [httpx.Response(200, content=EMPTY)])
    for _ in range(4):
        poller.poll_once()
    assert [c.document.incarnation for c in sink.changes] == [2, 3]
    assert [t.kind for c in sink.changes for t in c.transitions] == ["scheduled", "canceled"]
    assert polls(registry, "ok") == 4
    assert registry.get_sample_value("azure_scheduled_events_document_changes_total") == 2


def test_a_failing_sink_is_counted_and_does_not_stop_the_others() -> None:
    """The broken sink raises on every change; the recording sink still gets them all."""
    poller, registry, sink = make_poller([httpx.Response(200, content=GOOD), httpx.Response(200, content=EMPTY)])
    poller.poll_once()
    poller.poll_once()
    assert len(sink.changes) == 2
    assert registry.get_sample_value("azure_scheduled_events_sink_errors_total", {"sink": "broken"}) == 2


@pytest.mark.parametrize(("failure", "outcome"), [
    (httpx.Response(429), "throttled"),
    (httpx.Response(500), "http_error"),
    (httpx.Response(503), "http_error"),
    (httpx.Response(302, headers={"Location": "http://x/"}), "http_error"),
    (httpx.ReadTimeout("slow"), "timeout"),
    (httpx.ConnectError("refused"), "connection_error"),
    (httpx.Response(200, content=b"<html>captive portal</html>"), "invalid_document"),
    (httpx.Response(200, content=b'{"Events": "none"}'), "invalid_document"),
    (httpx.Response(200, content=b""), "invalid_document"),
])
def test_a_failure_keeps_the_last_valid_state_and_recovers(failure: httpx.Response | Exception,
                                                          outcome: str) -> None:
    """During a fault: up 0, outcome counted, events and incarnation kept; next good poll: up 1, no transitions."""
    poller, registry, sink = make_poller([httpx.Response(200, content=GOOD), failure,
                                          httpx.Response(200, content=GOOD)])
    poller.poll_once()
    poller.poll_once()
    assert registry.get_sample_value("azure_scheduled_events_up") == 0
    assert polls(registry, outcome) == 1
    assert registry.get_sample_value("azure_scheduled_events_document_incarnation") == 2
    assert registry.get_sample_value("azure_scheduled_events_pending",
                                     {"event_type": "Freeze", "event_status": "Scheduled",
                                      "affects_this_vm": "true"}) == 1
    success_before = registry.get_sample_value("azure_scheduled_events_last_success_timestamp_seconds")
    poller.poll_once()
    assert registry.get_sample_value("azure_scheduled_events_up") == 1
    assert registry.get_sample_value("azure_scheduled_events_last_success_timestamp_seconds") > success_before
    assert len(sink.changes) == 1  # the same bytes again: nothing new happened, nothing re-reported


def test_an_invalid_document_after_a_valid_one_is_not_a_cancellation() -> None:
    """Garbage in between must not be read as 'all events gone'."""
    poller, _, sink = make_poller([httpx.Response(200, content=GOOD), httpx.Response(200, content=b"{}"),
                                   httpx.Response(200, content=GOOD)])
    for _ in range(3):
        poller.poll_once()
    assert [t.kind for c in sink.changes for t in c.transitions] == ["scheduled"]


def test_backoff_honours_retry_after_up_to_the_cap() -> None:
    """Retry-After 3 waits 3 s; Retry-After 600 waits only max_backoff; success returns to the interval."""
    poller, _, _ = make_poller([
        httpx.Response(429, headers={"Retry-After": "3"}),
        httpx.Response(429, headers={"Retry-After": "600"}),
        httpx.Response(200, content=GOOD),
    ], poll_interval=1.0, max_backoff=5.0)
    assert [poller.poll_once() for _ in range(3)] == [3.0, 5.0, 1.0]


def test_backoff_is_jittered_from_the_poll_interval_up_to_max_backoff() -> None:
    """Repeated failures wait, jittered, between the poll interval and a ceiling that doubles up to max_backoff, never
    beyond: no two sidecars whose IMDS failed together poll again together."""
    poller, _, _ = make_poller([httpx.Response(500)] * 8, poll_interval=0.5, max_backoff=3.0)
    waits = [poller.poll_once() for _ in range(8)]
    ceilings = [1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    assert all(0.5 <= wait <= ceiling for wait, ceiling in zip(waits, ceilings, strict=True)), waits
    assert len(set(waits)) == len(waits)  # drawn, not a schedule


def test_health_is_logged_per_change_not_per_poll(caplog: pytest.LogCaptureFixture) -> None:
    """Three identical failures make one warning; another kind of failure one more; recovery one info."""
    poller, _, _ = make_poller([httpx.Response(500)] * 3 + [httpx.ReadTimeout("slow"),
                                                            httpx.Response(200, content=GOOD)])
    with caplog.at_level(logging.INFO, logger="se_exporter"):
        for _ in range(5):
            poller.poll_once()
    messages = [r.getMessage() for r in caplog.records if r.name == "se_exporter"]
    failures = [m for m in messages if m.startswith("IMDS poll failed")]
    assert len(failures) == 2
    assert "HTTP 500" in failures[0] and "no complete answer within" in failures[1]
    assert [m for m in messages if m.startswith("IMDS recovered")] == ["IMDS recovered after 4 failed polls"]


def test_document_warnings_are_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A tolerated oddity (a string duration) is visible in a metric and a log line."""
    odd = json.dumps({"DocumentIncarnation": 2, "Events": [{**FREEZE, "DurationInSeconds": "soon"}]}).encode()
    poller, registry, _ = make_poller([httpx.Response(200, content=odd)])
    with caplog.at_level(logging.WARNING, logger="se_exporter"):
        poller.poll_once()
    assert registry.get_sample_value("azure_scheduled_events_document_warnings_total") == 1
    assert any("DurationInSeconds" in r.getMessage() for r in caplog.records)


def test_readyz_turns_green_with_the_first_valid_document() -> None:
    """/readyz is 503 before a valid document, 200 after; /healthz is 200 while the loop is on schedule."""
    poller, registry, _ = make_poller([httpx.Response(500), httpx.Response(200, content=GOOD)])
    pages = routes(registry, poller)

    def get(path: str) -> int:
        return pages[path](HttpRequest("GET", path, "")).status

    poller.poll_once()
    assert get("/readyz") == 503
    assert get("/healthz") == 200
    poller.poll_once()
    assert get("/readyz") == 200
    poller.heartbeat_deadline = 0.0  # as if the loop had not come round for a long time
    assert get("/healthz") == 503


def test_metrics_are_served_in_the_text_format_even_when_openmetrics_is_preferred() -> None:
    """Prometheus asks for OpenMetrics first; like client_golang by default, the answer is the text format
    (gzipped when asked), which Prometheus accepts and which costs half as much to write."""
    poller, registry, _ = make_poller([httpx.Response(200, content=GOOD)])
    poller.poll_once()
    accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    answer = routes(registry, poller)["/metrics"](
        HttpRequest("GET", "/metrics", "", (("accept", accept), ("accept-encoding", "gzip"))))
    assert answer.content_type is not None and answer.content_type.startswith("text/plain; version=0.0.4")
    assert dict(answer.headers)["Content-Encoding"] == "gzip"
    text = gzip.decompress(answer.body).decode()
    assert 'azure_scheduled_events_polls_total{outcome="ok"} 1.0' in text and "# EOF" not in text


def test_identity_is_retried_in_the_background_until_read() -> None:
    """Compute metadata failing twice is counted; the third try sets the identity and the watcher stops."""
    poller, _, _ = make_poller([])
    imds, server, _ = scripted_imds([
        httpx.Response(500), httpx.ConnectError("refused"),
        httpx.Response(200, json={"name": "imds-name", "vmId": "id-7", "location": "westeurope"})])
    watcher_registry = CollectorRegistry()
    metrics = Metrics(watcher_registry, CurrentState(Snapshot()).get)
    IdentityWatcher(imds, poller, metrics, first_wait=0.001, max_wait=0.002).run(threading.Event())
    assert poller.snapshot.identity is not None and poller.snapshot.identity.vm_id == "id-7"
    assert poller.snapshot.vm_name == "vm0"  # --vm-name wins over the name IMDS reports
    assert watcher_registry.get_sample_value("azure_scheduled_events_identity_errors_total") == 2
    assert {request.split(b" ")[1].partition(b"?")[0] for request in server.requests} == {
        b"/metadata/instance/compute"}


def test_an_identity_read_during_a_poll_is_not_lost() -> None:
    """The identity watcher setting the identity while a poll updates the snapshot survives the poll (the two
    threads used to replace the snapshot without a lock, and the poll's write undid the identity)."""
    poller, _, _ = make_poller([httpx.Response(200, content=GOOD)])
    reads: list[str] = []

    def clock_that_lets_the_watcher_in() -> float:
        # The poll reads the clock while it updates the snapshot: the watcher's write lands right then.
        reads.append(f"id-{len(reads)}")
        poller.set_identity(VmIdentity(name="imds-name", vm_id=reads[-1]))
        return 1000.0 + len(reads)

    poller._clock = clock_that_lets_the_watcher_in
    poller.poll_once()
    assert poller.snapshot.up and poller.snapshot.has_document
    assert poller.snapshot.identity is not None and poller.snapshot.identity.vm_id == reads[-1]


def doc(incarnation: int, *events: dict[str, object]) -> httpx.Response:
    body = json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}).encode()
    return httpx.Response(200, content=body)


def event(event_id: str, status: str = "Scheduled") -> dict[str, object]:
    return {**FREEZE, "EventId": event_id, "EventStatus": status, "NotBefore": "" if status == "Started" else
            FREEZE["NotBefore"]}


def kinds(sink: RecordingSink) -> list[tuple[str, str]]:
    return [(t.event.event_id, t.kind) for change in sink.changes for t in change.transitions]


def test_an_incarnation_going_backwards_is_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """17 then 10: the document is used (it is what IMDS says now), the regression counted, and one warning names
    both numbers; 10 then 11 is no regression."""
    poller, registry, _ = make_poller([doc(17, event("A")), doc(10, event("A")), doc(11, event("A"))])
    with caplog.at_level(logging.INFO, logger="se_exporter"):
        for _ in range(3):
            poller.poll_once()
    assert registry.get_sample_value("azure_scheduled_events_incarnation_regressions_total") == 1
    assert registry.get_sample_value("azure_scheduled_events_document_incarnation") == 11
    warnings = [r.getMessage() for r in caplog.records if "went backwards" in r.getMessage()]
    assert warnings == ["DocumentIncarnation went backwards from 17 to 10; using the document as IMDS' current "
                        "state (events that had ended stay ended)"]
    assert registry.get_sample_value("azure_scheduled_events_up") == 1


def test_a_replayed_document_never_counts_an_event_scheduled_twice() -> None:
    """10 [A] -> 17 [] -> 10 [A] -> 18 []: A is scheduled once and canceled once; while listed again it is shown."""
    poller, registry, sink = make_poller([doc(10, event("A")), doc(17), doc(10, event("A")), doc(18)])
    poller.poll_once()
    poller.poll_once()
    poller.poll_once()
    assert registry.get_sample_value("azure_scheduled_events_pending",
                                     {"event_type": "Freeze", "event_status": "Scheduled",
                                      "affects_this_vm": "true"}) == 1
    poller.poll_once()
    assert kinds(sink) == [("A", "scheduled"), ("A", "canceled")]
    assert registry.get_sample_value("azure_scheduled_events_incarnation_regressions_total") == 1


def test_an_event_id_changing_only_in_case_is_not_canceled_and_scheduled() -> None:
    """The same GUID in upper then lower case: one event, one series at a time, no cancel, no second schedule."""
    poller, registry, sink = make_poller([doc(1, event("C7061BAC-AFDC")), doc(2, event("c7061bac-afdc"))])
    poller.poll_once()
    poller.poll_once()
    assert kinds(sink) == [("C7061BAC-AFDC", "scheduled")]
    ids = [sample.labels["event_id"] for family in registry.collect() for sample in family.samples
           if sample.name == "azure_scheduled_event_info"]
    assert ids == ["c7061bac-afdc"]


def test_lifecycles_restored_from_disk_match_whatever_the_case(tmp_path: Path) -> None:
    """State written under the EventId as listed continues when the event is listed again after a restart."""
    store = LifecycleStore(tmp_path, scope="http://imds.test")
    first = parse_document(doc(1, event("C7061BAC-AFDC")).content)
    store.save(diff({}, first, 1000.0).records)
    poller, _, sink = make_poller([doc(1, event("C7061BAC-AFDC"))], store=store)
    poller.poll_once()
    assert kinds(sink) == []
    assert sink.changes[0].records["c7061bac-afdc"].first_seen == 1000.0


@pytest.mark.parametrize("body", [
    b'{"DocumentIncarnation": ' + b"9" * 5000 + b', "Events": []}',
    b'{"DocumentIncarnation": "' + b"9" * 5000 + b'", "Events": []}',
])
def test_a_5000_digit_incarnation_is_a_warning_not_a_loop_error(body: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """Python's int-string limit used to escape the parser ('unexpected error in the poll loop', up stuck at 1):
    now the document is read, the incarnation ignored, the warning counted and logged once."""
    poller, registry, _ = make_poller([httpx.Response(200, content=body)])
    with caplog.at_level(logging.INFO, logger="se_exporter"):
        poller.poll_once()
    assert polls(registry, "ok") == 1
    assert registry.get_sample_value("azure_scheduled_events_document_warnings_total") == 1
    assert registry.get_sample_value("azure_scheduled_events_document_incarnation") is None
    assert len([r for r in caplog.records if "parsed with 1 warnings" in r.getMessage()]) == 1
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]


def test_deep_nesting_is_an_invalid_document_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """A body nested 100,000 deep: invalid_document each poll, up 0, one log line for the run of them."""
    deep = httpx.Response(200, content=b"[" * 100_000 + b"]" * 100_000)
    poller, registry, _ = make_poller([httpx.Response(200, content=GOOD), deep, deep, deep])
    with caplog.at_level(logging.INFO, logger="se_exporter"):
        for _ in range(4):
            poller.poll_once()
    assert polls(registry, "invalid_document") == 3
    assert registry.get_sample_value("azure_scheduled_events_up") == 0
    failures = [r.getMessage() for r in caplog.records if r.getMessage().startswith("IMDS poll failed")]
    assert len(failures) == 1 and "nested too deeply" in failures[0]
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]


HOSTILE_IDS = [r"LLLL-\ud800", r"X\n2026-11-22T02:55:46.262Z critical \u001b[31mforged\u001b[0m", r'Q\\\"=\u2028']


def hostile_document() -> bytes:
    events = ", ".join('{"EventId": "' + event_id + '", "EventType": "Freeze", "EventStatus": "Scheduled", '
                       '"Resources": ["vm0\\udfff"]}' for event_id in HOSTILE_IDS)
    return ('{"DocumentIncarnation": 5, "Events": [' + events + "]}").encode()


def test_a_scrape_survives_any_string_from_imds() -> None:
    """Lone surrogates, newlines, ANSI escapes, quotes and backslashes in EventIds and in compute metadata: /metrics
    answers 200 with text Prometheus' parser reads, one series per event."""
    poller, registry, _ = make_poller([httpx.Response(200, content=hostile_document())])
    poller.poll_once()
    poller.set_identity(VmIdentity.from_compute({"name": "vm\ud800", "vmId": "id\n1", "location": "x\x1b[2J"}))
    answer = routes(registry, poller)["/metrics"](HttpRequest("GET", "/metrics", ""))
    body = answer.body
    assert answer.status == 200
    ids = sorted(sample.labels["event_id"] for family in text_string_to_metric_families(body.decode("utf-8"))
                 for sample in family.samples if sample.name == "azure_scheduled_event_info")
    assert ids == sorted(["LLLL-\\ud800", "X\n2026-11-22T02:55:46.262Z critical \x1b[31mforged\x1b[0m", 'Q\\"=\u2028'])


class Blocking:
    """A forwarding target that blocks until ``release`` is set (a disk that stalls, a webhook that hangs)."""

    name = "blocking"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.accepted: list[Envelope] = []

    def accept(self, envelope: Envelope) -> None:
        self.release.wait(30)
        self.accepted.append(envelope)

    def close(self, timeout: float) -> None:
        """Nothing to release."""


def test_a_target_that_blocks_for_seconds_does_not_delay_the_next_poll(tmp_path: Path) -> None:
    """With a forwarding target stuck for seconds, each poll (every one a new document, so every one forwarded)
    returns in well under a second, and the target gets every document, in order, once it is unstuck."""
    documents = [json.dumps({"DocumentIncarnation": n, "Events": []}).encode() for n in range(1, 5)]
    imds, _, _ = scripted_imds([httpx.Response(200, content=body) for body in documents])
    settings = Settings(vm_name="vm0")
    registry = CollectorRegistry()
    state = CurrentState(Snapshot(vm_name="vm0", api_version=settings.api_version))
    metrics = Metrics(registry, state.get)
    target = Blocking()
    forward = ForwardSink(Sequencer(tmp_path), [target], ForwardMetrics(registry))
    poller = Poller(imds, metrics, FanOut([forward], on_error=lambda name: None), settings, state)
    durations = []
    for _ in documents:
        started = time.monotonic()
        poller.poll_once()
        durations.append(time.monotonic() - started)
    assert max(durations) < 1.0, durations
    assert target.accepted == []  # still blocked: the polls above did not wait for it
    target.release.set()
    wait_until(lambda: len(target.accepted) == len(documents), what="every document forwarded")
    assert [e.body for e in target.accepted] == documents
    forward.shutdown(5)
