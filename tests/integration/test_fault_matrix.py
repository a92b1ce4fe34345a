"""The fault matrix: for every fault, the process lives, the fault shows in a metric and in one log line, and
the sidecar recovers on the next good poll. Each proven row lands in the Reliability table (docs/reliability.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.faults import Fault
from se_exporter.simulator.server import Simulator, start
from tests.conftest import Reliability, SimulatorFactory
from tests.support.helpers import Sidecar, free_port, wait_until
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.integration
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2", "--imds-timeout", "0.5")

# (what a person would call the fault, the simulator fault, the outcome label it must be counted under)
IMDS_FAULTS = [
    ("429 with Retry-After", Fault("throttle", status=429, retry_after="1", count=0), "throttled"),
    ("429 without Retry-After", Fault("throttle", status=429, count=0), "throttled"),
    ("HTTP 500", Fault("status", status=500, count=0), "http_error"),
    ("HTTP 503", Fault("status", status=503, count=0), "http_error"),
    ("malformed JSON", Fault("malformed", count=0), "invalid_document"),
    ("HTML from a captive proxy", Fault("non_json", count=0), "invalid_document"),
    ("JSON that is not a document", Fault("invalid", count=0), "invalid_document"),
    ("empty body", Fault("empty", count=0), "invalid_document"),
    ("10 MB body (refused unread)", Fault("huge", count=0), "invalid_document"),
    ("no answer (timeout)", Fault("hang", seconds=2, count=0), "timeout"),
    ("slow answers beyond the timeout", Fault("delay", seconds=1.5, count=0), "timeout"),
    ("connection reset", Fault("reset", count=0), "connection_error"),
    ("body cut short of its Content-Length, then closed", Fault("truncate", count=0), "connection_error"),
    ("drip feed: a byte every 0.1 s, each read inside the 0.5 s --imds-timeout", Fault("drip", seconds=0.1, count=0),
     "timeout"),
    ("chunked body without its last chunk", Fault("chunked", error="missing_last", count=0), "connection_error"),
    ("chunk size that is not hexadecimal", Fault("chunked", error="bad_size", count=0), "connection_error"),
    ("JSON nested 100,000 deep", Fault("body", text="[" * 100_000 + "]" * 100_000, count=0), "invalid_document"),
]


@pytest.mark.parametrize(("name", "fault", "outcome"), IMDS_FAULTS, ids=[f[0] for f in IMDS_FAULTS])
def test_imds_fault(name: str, fault: Fault, outcome: str, simulator: SimulatorFactory,
                    sidecar: Callable[..., Sidecar], reliability: Reliability) -> None:
    """During the fault: alive, up 0, outcome counted, last state kept, one log line; after it: up 1 again."""
    sim, server = simulator("live-migration")
    sim.advance(10)  # a Scheduled Freeze is listed
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="first document")
    sim.inject(fault)
    wait_until(lambda: process.value("azure_scheduled_events_up") == 0, what="up to drop")
    wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome=outcome) or 0) >= 2,
               timeout=15, what=f"{outcome} counted")
    assert process.process.poll() is None
    assert process.total("azure_scheduled_events_pending", event_type="Freeze", event_status="Scheduled") == 1
    sim.clear_faults()
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, timeout=15, what="recovery")
    failures = re.findall(r"IMDS poll failed: .*", process.log())
    assert len(failures) == 1, failures
    assert len(re.findall(r"IMDS recovered after \d+ failed polls", process.log())) == 1
    assert process.total("azure_scheduled_events_transitions_total", event_type="Freeze",
                         transition="canceled") is None  # never counted: no series
    reliability("IMDS", name, f"alive; `up` 0 with the last state kept; `outcome=\"{outcome}\"`; one log line; "
                              "recovered on the next good poll")


def test_redirect_to_another_port(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                  reliability: Reliability) -> None:
    """A 302 to another simulator is counted as http_error and the other one never hears from us."""
    sim, server = simulator("live-migration")
    other, other_server = simulator("host-failure")
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="first document")
    sim.inject(Fault("redirect", location=other_server.url + "/metadata/scheduledevents?api-version=2020-07-01",
                     count=0))
    wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome="http_error") or 0) >= 3,
               what="redirects counted")
    assert len(re.findall(r"IMDS poll failed: HTTP 302 redirect to", process.log())) == 1
    assert other.requests == []
    sim.clear_faults()
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="recovery")
    reliability("IMDS", "302 redirect to another port", "not followed (the target saw no request); "
                                                         "`outcome=\"http_error\"`; one log line; recovered")


def test_slow_first_call(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                         reliability: Reliability) -> None:
    """The first call may take long (the service switching on): it is not cut off by --imds-timeout."""
    sim, server = simulator("live-migration")
    sim.inject(Fault("first_call_delay", seconds=1.0))
    process = sidecar("--imds-url", server.url, "--poll-interval", "0.05", "--imds-timeout", "0.3",
                      "--first-call-timeout", "10")
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="slow first document")
    assert process.value("azure_scheduled_events_polls_total", outcome="timeout") is None  # never counted: no series
    reliability("IMDS", "slow first call (1 s, timeout 0.3 s)", "waited for with --first-call-timeout; no timeout")


def test_connection_refused_then_imds_appears(sidecar: Callable[..., Sidecar], reliability: Reliability) -> None:
    """Refused connections are counted; once IMDS listens on that port, the next poll recovers."""
    port = free_port()
    process = sidecar("--imds-url", f"http://127.0.0.1:{port}", *FAST)
    wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome="connection_error") or 0) >= 1,
               what="refused counted")
    assert len(re.findall(r"IMDS poll failed: .*", process.log())) == 1
    late_sim = Simulator(scenarios.load("host-failure"))
    late = start(late_sim, "127.0.0.1", port)
    try:
        wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="recovery")
    finally:
        late.shutdown()
        late.server_close()
    assert late_sim.posts_from("se-exporter") == 0
    reliability("IMDS", "connection refused", "alive; `outcome=\"connection_error\"`; one log line; "
                                             "recovered when IMDS appeared")


def test_otlp_endpoint_down(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                            reliability: Reliability) -> None:
    """With the OTLP endpoint down, events still flow to /metrics, export errors are counted and logged once,
    and shutdown stays prompt."""
    sim, server = simulator("host-failure")
    process = sidecar("--imds-url", server.url, *FAST, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    for t in (3, 303):
        sim.advance(max(0.0, t - sim.scenario_time()))
        incarnation = sim.document()["DocumentIncarnation"]
        wait_until(lambda wanted=incarnation: process.value("azure_scheduled_events_document_incarnation") == wanted,
                   what="document read")
    assert process.total("azure_scheduled_events_transitions_total", event_type="Reboot", transition="completed") == 1
    wait_until(lambda: (process.value("azure_scheduled_events_span_export_errors_total") or 0) > 0, timeout=20,
               what="span export errors counted")
    assert len(re.findall(r"span export failing", process.log())) == 1
    assert process.stop() == 0
    reliability("OpenTelemetry", "OTLP endpoint down", "metrics and logs unaffected; "
                                                       "`span_export_errors_total` counted; one log line; exit 0")


def peak_rss_mb(process: Sidecar) -> float:
    match = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{process.process.pid}/status").read_text())
    assert match
    return int(match.group(1)) / 1024


def test_gzip_bomb(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], reliability: Reliability) -> None:
    """A ~0.3 MB gzip body inflating to 300 MB, though identity was asked for: refused unread, counted as
    invalid_document, logged once, and the sidecar's peak RSS does not grow with it (it grew by 130 MB when the
    body was inflated before the size cap)."""
    sim, server = simulator("live-migration")
    sim.advance(10)
    # The simulator compresses its 300 MB of blanks at the first such answer (seconds): no timeout meanwhile.
    process = sidecar("--imds-url", server.url, *FAST, "--imds-timeout", "30")
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="first document")
    before = peak_rss_mb(process)
    sim.inject(Fault("gzip", size=300 * 1024 * 1024, count=0))
    wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome="invalid_document") or 0) >= 3,
               timeout=30, what="the bomb refused three times")
    assert peak_rss_mb(process) - before < 20
    failures = re.findall(r"IMDS poll failed: .*", process.log())
    assert len(failures) == 1 and "gzip-encoded although identity was asked for" in failures[0]
    sim.clear_faults()
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, timeout=15, what="recovery")
    reliability("IMDS", "gzip body of ~0.3 MB inflating to 300 MB (identity was asked for)",
                "refused unread: `outcome=\"invalid_document\"`; one log line; peak RSS grew under 20 MB; recovered")


def served_document(sim: Simulator, **changes: object) -> str:
    return json.dumps({**sim.document(), **changes})


def test_a_5000_digit_incarnation_is_tolerated(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                               reliability: Reliability) -> None:
    """Python's int-string limit used to escape the parser every poll ('unexpected error in the poll loop', up stuck
    at 1, nothing counted): now the events are read, the incarnation ignored, the warning counted and logged once."""
    sim, server = simulator("live-migration")
    sim.advance(10)
    body = served_document(sim).replace('"DocumentIncarnation": ' + str(sim.document()["DocumentIncarnation"]),
                                        '"DocumentIncarnation": ' + "9" * 5000)
    sim.inject(Fault("body", text=body, count=0))
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome="ok") or 0) >= 5,
               what="five polls")
    samples = process.samples()
    assert samples[("azure_scheduled_events_up", frozenset())] == 1
    assert samples[("azure_scheduled_events_document_warnings_total", frozenset())] == 1
    assert ("azure_scheduled_events_document_incarnation", frozenset()) not in samples
    assert process.total("azure_scheduled_events_pending", event_type="Freeze", event_status="Scheduled") == 1
    assert len(re.findall(r"parsed with 1 warnings: DocumentIncarnation <integer of 5,000 digits>", process.log())) \
        == 1
    assert "unexpected error" not in process.log()
    reliability("IMDS", "DocumentIncarnation of 5,000 digits (past Python's int-string limit)",
                "tolerated: events read, the incarnation ignored with a warning counted and logged once; "
                "never an error in the poll loop")


def test_incarnation_going_backwards(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                     reliability: Reliability) -> None:
    """17 listing the Freeze, 18 without it (canceled), then 10 listing it again (a stale answer): the regression is
    counted and logged once; the event is shown again but never counted scheduled, or canceled, twice."""
    sim, server = simulator("live-migration")
    sim.advance(10)
    listed, empty = served_document(sim, DocumentIncarnation=17), served_document(sim, DocumentIncarnation=18,
                                                                                  Events=[])
    sim.inject(Fault("body", text=listed, count=0))
    process = sidecar("--imds-url", server.url, *FAST)
    for incarnation, body in ((17, listed), (18, empty), (10, listed.replace('"DocumentIncarnation": 17',
                                                                            '"DocumentIncarnation": 10'))):
        sim.set_faults(Fault("body", text=body, count=0))
        wait_until(lambda wanted=incarnation: process.value("azure_scheduled_events_document_incarnation") == wanted,
                   what=f"incarnation {incarnation}")
    assert process.value("azure_scheduled_events_incarnation_regressions_total") == 1
    assert process.total("azure_scheduled_events_pending", event_type="Freeze", event_status="Scheduled") == 1
    sim.set_faults(Fault("body", text=empty.replace('"DocumentIncarnation": 18', '"DocumentIncarnation": 19'),
                         count=0))
    wait_until(lambda: process.value("azure_scheduled_events_document_incarnation") == 19, what="incarnation 19")
    for transition in ("scheduled", "canceled"):
        assert process.total("azure_scheduled_events_transitions_total", event_type="Freeze",
                             transition=transition) == 1, transition
    assert len(re.findall(r"DocumentIncarnation went backwards from 18 to 10", process.log())) == 1
    reliability("IMDS", "DocumentIncarnation going backwards (17 listing an event, 18 without it, 10 listing it again)",
                "`incarnation_regressions_total` counted and one log line; the replayed event shown, never counted "
                "scheduled or canceled twice")


def test_an_event_id_changing_case(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                   reliability: Reliability) -> None:
    """The same GUID listed again in lower case: one event (one trace id), not a cancellation and a new schedule."""
    sim, server = simulator("live-migration")
    sim.advance(10)
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="first document")
    document = sim.document()
    lowered = json.dumps({"DocumentIncarnation": document["DocumentIncarnation"] + 1, "Events": [
        {**event, "EventId": event["EventId"].lower()} for event in document["Events"]]})
    sim.inject(Fault("body", text=lowered, count=0))
    wait_until(lambda: process.value("azure_scheduled_events_document_incarnation")
               == document["DocumentIncarnation"] + 1, what="the lower-cased document")
    for transition, count in (("scheduled", 1), ("canceled", None)):  # None: never counted, no series
        assert process.total("azure_scheduled_events_transitions_total", event_type="Freeze",
                             transition=transition) == count, transition
    ids = [dict(labels)["event_id"] for name, labels in process.samples() if name == "azure_scheduled_event_info"]
    assert ids == [document["Events"][0]["EventId"].lower()]
    reliability("IMDS", "an EventId listed again in another case", "the same event (one trace id): no cancel, no "
                                                                   "second schedule")


HOSTILE_EVENTS = ('{"DocumentIncarnation": 40, "Events": ['
                  '{"EventId": "LLLL-\\ud800", "EventType": "Freeze", "EventStatus": "Scheduled", '
                  '"Resources": ["WestNO_0\\udfff"], "Description": "d\\ud83d"}, '
                  '{"EventId": "X\\n2026-11-22T02:55:46.262Z critical \\u001b[31mdisk on fire\\u001b[0m\\u2028", '
                  '"EventType": "Reboot", "EventStatus": "Scheduled", "Resources": []}]}')


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_strings_no_output_can_take_as_they_are(log_format: str, simulator: SimulatorFactory,
                                                sidecar: Callable[..., Sidecar], receiver: OtlpReceiver,
                                                tmp_path: Path, reliability: Reliability) -> None:
    """Unpaired surrogates (valid JSON escapes) in an EventId, a resource, a description and the VM's own name, and
    an EventId forging a log line (newline, timestamp, 'critical', ANSI colours): /metrics stays 200, spans reach the
    OTLP receiver, the forward file holds the bytes exactly as served, every log record is one line."""
    sim, server = simulator("live-migration", vm_name="WestNO_0\ud800")
    sim.inject(Fault("body", text=HOSTILE_EVENTS, count=0))
    forward = tmp_path / "documents.jsonl"
    process = sidecar("--imds-url", server.url, *FAST, "--forward-file", str(forward), "--log-format", log_format,
                      env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint})
    wait_until(lambda: process.value("azure_scheduled_events_document_incarnation") == 40, what="the document")
    wait_until(lambda: process.value("azure_scheduled_events_vm_info", vm_name="WestNO_0\\ud800", vm_id=sim.vm["vmId"],
                                     vmss_name=sim.vm.get("vmScaleSetName", ""), location=sim.vm["location"],
                                     resource_group=sim.vm.get("resourceGroupName", ""),
                                     subscription_id=sim.vm.get("subscriptionId", ""), vm_size=sim.vm.get("vmSize", ""),
                                     zone=sim.vm.get("zone", "")) == 1, what="the VM's name, spelt out")
    ids = sorted(dict(labels)["event_id"] for name, labels in process.samples() if name == "azure_scheduled_event_info")
    assert ids == sorted(["LLLL-\\ud800", "X\n2026-11-22T02:55:46.262Z critical \x1b[31mdisk on fire\x1b[0m\u2028"])
    spans = wait_until(lambda: len(receiver.named("scheduled_event.update")) >= 2 and receiver.named(
        "scheduled_event.update"), what="the update spans")
    assert "LLLL-\\ud800" in {span.attributes["azure.scheduled_event.id"] for span in spans}
    lines = wait_until(lambda: forward.exists() and forward.read_bytes().splitlines(), what="the forwarded line")
    assert json.loads(lines[0])["body"].encode() == HOSTILE_EVENTS.encode()
    log = wait_until(lambda: "disk on fire" in process.log() and process.log(), what="the transition logged")
    for line in log.splitlines():
        assert "\x1b" not in line and "\u2028" not in line
        if log_format == "json":
            json.loads(line)
        else:
            assert re.match(r"\d{4}-\d\d-\d\dT[\d:.]+Z \w+ ", line) or line.startswith("    "), line
    assert "unexpected error" not in log and "Logging error" not in log
    assert process.value("azure_scheduled_events_document_warnings_total") == 1  # the surrogates, said once
    reliability("IMDS", "unpaired surrogates (`\"\\ud800\"`) in an EventId, a resource, a description and the VM's "
                        "name; an EventId forging a log line (newline, timestamp, `critical`, ANSI colours)",
                "`/metrics` 200; spans at the OTLP receiver; forward-file bytes exactly as served; every log record "
                "one line (text and JSON), the values escaped; the surrogate spelt out with a warning counted")
