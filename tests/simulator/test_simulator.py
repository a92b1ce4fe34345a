"""The IMDS simulator: scenario timelines (pure) and the HTTP double's faithfulness to the docs."""

from __future__ import annotations

import gzip
import json
import socket
import sys
import threading
import urllib.request
from collections.abc import Iterator
from importlib import resources
from typing import Any

import httpx
import pytest

from se_exporter.cli import main
from se_exporter.core import apiversion
from se_exporter.core.errors import ConfigError
from se_exporter.core.model import EVENT_FIELDS, parse_document
from se_exporter.infra.http_server import Bounds
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.faults import Fault, from_json, parse_fault
from se_exporter.simulator.server import (
    HISTORY,
    SCHEDULED_EVENTS_VERSIONS,
    RecordedRequest,
    Simulator,
    SimulatorServer,
    start,
)
from se_exporter.simulator.timeline import MAX_SCENARIO_TIME
from tests.support.helpers import wait_until

SE = "/metadata/scheduledevents"


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------- timelines


def statuses(scenario: scenarios.Scenario, t: float,
             approvals: dict[str, float] | None = None) -> list[tuple[str, str]]:
    return [(s.spec.event_type, s.status) for s in scenario.state_at(t, approvals or {})]


def test_live_migration_timeline() -> None:
    """Absent, Scheduled with NotBefore = appear + notice, Started at NotBefore, gone after started_for."""
    live = scenarios.load("live-migration")
    assert statuses(live, 1) == []
    (state,) = live.state_at(2, {})
    assert (state.status, state.not_before) == ("Scheduled", 902)
    assert statuses(live, 901.9) == [("Freeze", "Scheduled")]
    assert statuses(live, 902) == [("Freeze", "Started")]
    assert live.state_at(902, {})[0].not_before is None
    assert statuses(live, 932) == []


def test_approval_starts_the_event_early() -> None:
    """An approval at t starts the event at t, before its NotBefore."""
    live = scenarios.load("live-migration")
    event_id = live.events[0].event_id
    assert statuses(live, 49, {event_id: 50}) == [("Freeze", "Scheduled")]
    assert statuses(live, 60, {event_id: 50}) == [("Freeze", "Started")]
    assert statuses(live, 80.5, {event_id: 50}) == []


def test_cancel_and_reschedule() -> None:
    """The canceled scenario moves NotBefore at 120 s and removes the event at 300 s, never started."""
    canceled = scenarios.load("canceled")
    assert canceled.state_at(100, {})[0].not_before == 902
    assert canceled.state_at(130, {})[0].not_before == 1320
    assert statuses(canceled, 299) == [("Reboot", "Scheduled")]
    assert statuses(canceled, 300) == []
    assert statuses(canceled, 2000) == []


def test_host_failure_is_started_at_first_sight() -> None:
    """A host failure has no Scheduled phase."""
    assert statuses(scenarios.load("host-failure"), 2) == [("Reboot", "Started")]


def test_repeating_scenario_uses_fresh_event_ids_each_cycle() -> None:
    """The demo repeats every 600 s with new EventIds, so each cycle's events are new to the exporter."""
    demo = scenarios.load("demo")
    first = {s.event_id for s in demo.state_at(10, {})}
    second = {s.event_id for s in demo.state_at(610, {})}
    assert first and second and not first & second
    assert len(first) == len(second)


@pytest.mark.parametrize("name", scenarios.builtin_names())
def test_every_builtin_scenario_loads_and_ends(name: str) -> None:
    """Every built-in scenario is valid, lists something, and (one cycle of) it ends."""
    scenario = scenarios.load(name)
    assert scenario.description
    assert scenario.events
    assert scenario.state_at(scenario.duration, {}) == () or scenario.repeat_every


@pytest.mark.parametrize(("data", "fragment"), [
    ({}, "must be an object with an 'events' list"),
    ({"events": [{"notice": 5}]}, "KeyError"),
    ({"events": [{"EventType": "Explode"}]}, "EventType 'Explode' is not one of"),
    ({"events": [{"EventType": "Reboot", "started_for": 0}]}, "started_for must be > 0"),
    ({"repeat_every": 10, "events": [{"EventType": "Reboot", "notice": 60}]}, "longer than repeat_every"),
])
def test_bad_scenarios_are_refused_with_a_reason(data: dict[str, object], fragment: str) -> None:
    """Scenario files are validated with messages that say what to fix."""
    with pytest.raises(ConfigError, match=fragment):
        scenarios.from_json(data, "custom")


def test_scenario_file_by_path(tmp_path: pytest.TempPathFactory) -> None:
    """A user's own scenario file loads by path."""
    path = tmp_path / "mine.json"  # type: ignore[operator]
    path.write_text(json.dumps({"events": [{"EventType": "Reboot", "notice": 60}]}))
    scenario = scenarios.load(str(path))
    assert scenario.name == "mine"
    assert scenario.events[0].resources == ("WestNO_0",)


@pytest.mark.parametrize(("argv", "env", "fragment"), [
    (["--speed", "1e308"], {}, "--speed: '1e308' is out of range: 0.001 to 100000"),
    (["--speed", "inf"], {}, "--speed: 'inf' is out of range"),
    (["--speed", "1e-300"], {}, "--speed: '1e-300' is out of range"),
    (["--speed", "nan"], {}, "--speed: 'nan' must be a positive number"),
    (["--speed", "0"], {}, "--speed: '0' must be a positive number"),
    ([], {"SE_EXPORTER_SIMULATOR_SPEED": "1e400"}, "SE_EXPORTER_SIMULATOR_SPEED: '1e400' is out of range"),
])
def test_an_absurd_speed_stops_simulate_with_one_line(argv: list[str], env: dict[str, str], fragment: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate --speed`` is bounded as ``run --speed`` is (tested in sidecar/test_settings.py): unbounded, 1e-300
    overflowed every NotBefore's timestamp (each document an OverflowError) and 1e308 put scenario time near 1e306 s
    in the first millisecond. Exit 2 and one line naming the setting, before any server starts."""
    assert main(["simulate", "--listen", "127.0.0.1:0", *argv], env=env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("se-exporter: error: ")
    assert fragment in err


def test_fault_specs() -> None:
    """Fault spec strings parse into faults; unknown kinds and keys are refused."""
    assert parse_fault("throttle,retry_after=2,count=3") == Fault("throttle", count=3, status=429, retry_after="2")
    assert parse_fault("status,status=503") == Fault("status", status=503)
    assert parse_fault("hang").seconds == 30
    with pytest.raises(ConfigError, match="not one of"):
        parse_fault("explode")
    with pytest.raises(ConfigError, match="unknown keys colour"):
        parse_fault("status,colour=red")


# ---------------------------------------------------------------- the HTTP double


@pytest.fixture
def served() -> Iterator[tuple[Simulator, SimulatorServer, FakeClock]]:
    clock = FakeClock()
    sim = Simulator(scenarios.load("live-migration"), clock=clock)
    server = start(sim)
    yield sim, server, clock
    server.shutdown()
    server.server_close()


def get(server: SimulatorServer, path: str = SE, version: str | None = "2020-07-01",
        headers: dict[str, str] | None = None) -> httpx.Response:
    params = {"api-version": version} if version else {}
    with httpx.Client(trust_env=False) as http:
        return http.get(server.url + path, params=params, headers={"Metadata": "true", **(headers or {})})


def post(server: SimulatorServer, body: bytes, version: str = "2020-07-01") -> httpx.Response:
    with httpx.Client(trust_env=False) as http:
        return http.post(server.url + SE, params={"api-version": version}, content=body,
                         headers={"Metadata": "true"})


def test_metadata_header_is_required(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """Without Metadata: true, IMDS answers 400."""
    _, server, _ = served
    with httpx.Client(trust_env=False) as http:
        response = http.get(server.url + SE, params={"api-version": "2020-07-01"})
    assert response.status_code == 400
    assert "metadata header" in response.json()["error"]


@pytest.mark.parametrize("version", [None, "latest", "2018-01-01", "2020-07-02"])
def test_api_version_must_be_a_documented_one(served: tuple[Simulator, SimulatorServer, FakeClock],
                                              version: str | None) -> None:
    """A missing or undocumented api-version is a 400 listing the newest versions."""
    _, server, _ = served
    response = get(server, version=version)
    assert response.status_code == 400
    assert "2020-07-01" in response.json()["newest-versions"]


def test_proxied_requests_are_refused(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """IMDS refuses requests carrying X-Forwarded-For."""
    _, server, _ = served
    assert get(server, headers={"X-Forwarded-For": "10.0.0.1"}).status_code == 400


def test_document_sequence_and_incarnation(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """Empty, Scheduled, Started (NotBefore ''), empty again; the incarnation bumps on each change only."""
    _, server, clock = served
    seen = []
    for t in (0, 1, 5, 5, 903, 903, 940):
        clock.now = 1_700_000_000.0 + t
        seen.append(get(server).json())
    incarnations = [doc["DocumentIncarnation"] for doc in seen]
    assert incarnations == [1, 1, 2, 2, 3, 3, 4]
    assert [doc["Events"][0]["EventStatus"] if doc["Events"] else None for doc in seen] == [
        None, None, "Scheduled", "Scheduled", "Started", "Started", None]
    assert seen[2]["Events"][0]["NotBefore"] == "Tue, 14 Nov 2023 22:28:22 GMT"
    assert seen[4]["Events"][0]["NotBefore"] == ""
    for doc in seen:
        assert parse_document(json.dumps(doc)).warnings == ()


@pytest.mark.parametrize("version", SCHEDULED_EVENTS_VERSIONS)
def test_fields_are_shaped_per_api_version(version: str) -> None:
    """Older api-versions lack newer fields and event types; the preview uses ISO times and underscores."""
    clock = FakeClock()
    sim = Simulator(scenarios.load("demo"), clock=clock)
    clock.now += 250  # Freeze, neighbour Reboot, Preempt and degraded-hardware Redeploy are listed
    doc = sim.document(version)
    types = {event["EventType"] for event in doc["Events"]}
    assert ("Preempt" in types) == (version >= "2017-11-01")
    fields = set().union(*(event.keys() for event in doc["Events"]))
    assert ("Description" in fields) == (version >= "2019-04-01")
    assert ("EventSource" in fields) == (version >= "2019-08-01")
    assert ("DurationInSeconds" in fields) == (version >= "2020-07-01")
    scheduled = next(event for event in doc["Events"] if event["EventStatus"] == "Scheduled")
    if version == "2017-03-01":
        assert isinstance(doc["DocumentIncarnation"], str)
        assert scheduled["NotBefore"].endswith("Z") and "T" in scheduled["NotBefore"]
        assert all(name.startswith("_") for name in scheduled["Resources"])
    else:
        assert isinstance(doc["DocumentIncarnation"], int)
        assert scheduled["NotBefore"].endswith(" GMT")
    parsed = parse_document(json.dumps(doc))
    assert parsed.warnings == ()


@pytest.mark.parametrize("version", SCHEDULED_EVENTS_VERSIONS)
def test_every_field_of_the_table_is_served_from_its_version(version: str) -> None:
    """Every event the simulator lists carries exactly the fields ``EVENT_FIELDS`` says its api-version lists, and a
    field the scenario does not give is served as the row's example: a new row is served with no simulator change."""
    clock = FakeClock()
    sim = Simulator(scenarios.load("demo"), clock=clock)
    clock.now += 250
    events = sim.document(version)["Events"]
    assert events
    wanted = {row.json for row in EVENT_FIELDS if apiversion.lists_field(version, row.json)}
    assert [set(event) for event in events] == [wanted] * len(events)
    untold = [row for row in EVENT_FIELDS if row.json not in scenarios.TIMED_FIELDS and row.json in wanted
              and all(row.json not in raw for raw in _scenario_events("demo"))]
    for row in untold:
        assert {event[row.json] for event in events} == {row.example}, row.json


def _scenario_events(name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(
        resources.files("se_exporter.simulator").joinpath("scenarios", f"{name}.json").read_text())["events"]
    return events


def test_terminate_needs_2019_01_01() -> None:
    """Terminate events are not shown to api-versions before 2019-01-01."""
    clock = FakeClock()
    sim = Simulator(scenarios.load("vmss-terminate"), clock=clock)
    clock.now += 10
    assert sim.document("2017-11-01")["Events"] == []
    assert sim.document("2019-01-01")["Events"][0]["EventType"] == "Terminate"


def test_compute_metadata(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """The compute endpoint serves the scenario's VM; the full instance endpoint wraps it."""
    _, server, _ = served
    compute = get(server, "/metadata/instance/compute", "2021-02-01").json()
    assert compute["name"] == "WestNO_0"
    assert get(server, "/metadata/instance", "2021-02-01").json()["compute"] == compute
    assert get(server, "/metadata/instance/compute", "2099-01-01").status_code == 400


def test_post_approval_starts_the_event(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """A valid StartRequests POST is a 200 and the event is Started at the next GET."""
    _, server, clock = served
    clock.now += 10
    event_id = get(server).json()["Events"][0]["EventId"]
    assert post(server, json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()).status_code == 200
    assert get(server).json()["Events"][0]["EventStatus"] == "Started"


@pytest.mark.parametrize("body", [b"", b"nope", b"{}", b'{"StartRequests": []}', b'{"StartRequests": [{}]}',
                                  b'{"StartRequests": [{"EventId": "not-listed"}]}'])
def test_malformed_approvals_are_400(served: tuple[Simulator, SimulatorServer, FakeClock], body: bytes) -> None:
    """Malformed or unknown approvals are refused and change nothing."""
    _, server, clock = served
    clock.now += 10
    assert post(server, body).status_code == 400
    assert get(server).json()["Events"][0]["EventStatus"] == "Scheduled"


def test_requests_are_recorded(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """Every request is recorded with method, path, user agent and Metadata header."""
    sim, server, _ = served
    get(server, headers={"User-Agent": "probe/1"})
    post(server, b"{}")
    recorded = [(r.method, r.path, r.user_agent, r.metadata_header) for r in sim.requests]
    assert recorded == [("GET", SE, "probe/1", "true"), ("POST", SE, f"python-httpx/{httpx.__version__}", "true")]
    assert sim.posts_from("python-httpx") == 1
    assert sim.posts_from("se-exporter") == 0


@pytest.mark.parametrize(("fault", "status", "check"), [
    (Fault("throttle", status=429, retry_after="2"), 429, lambda r: r.headers["Retry-After"] == "2"),
    (Fault("status", status=503), 503, lambda r: True),
    (Fault("redirect", location="http://127.0.0.1:9/x"), 302, lambda r: r.headers["Location"] == "http://127.0.0.1:9/x"),
    (Fault("malformed"), 200, lambda r: r.content.startswith(b'{"DocumentIncarnation": 7, "Events": [{')),
    (Fault("non_json"), 200, lambda r: r.headers["Content-Type"] == "text/html"),
    (Fault("invalid"), 200, lambda r: r.json()["Events"] == "none"),
    (Fault("empty"), 200, lambda r: r.content == b""),
    (Fault("body", text='{"Events": []}'), 200, lambda r: r.content == b'{"Events": []}'),
    (Fault("huge", size=300_000), 200, lambda r: len(r.content) == 300_000),
])
def test_faults_apply_to_the_next_gets_then_clear(served: tuple[Simulator, SimulatorServer, FakeClock],
                                                  fault: Fault, status: int, check: object) -> None:
    """A fault with count=1 shapes exactly one answer; the next one is a normal document."""
    sim, server, _ = served
    sim.inject(fault)
    response = get(server)
    assert response.status_code == status
    assert check(response)  # type: ignore[operator]
    assert get(server).json()["Events"] == []


def test_fault_counts_and_clearing(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """count=N applies N times; count=0 until cleared."""
    sim, server, _ = served
    sim.inject(Fault("status", status=500, count=2))
    assert [get(server).status_code for _ in range(3)] == [500, 500, 200]
    sim.inject(Fault("status", status=503, count=0))
    assert [get(server).status_code for _ in range(3)] == [503, 503, 503]
    sim.clear_faults()
    assert get(server).status_code == 200


def test_reset_closes_without_an_answer(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """The reset fault drops the connection: the client sees a protocol or connection error."""
    sim, server, _ = served
    sim.inject(Fault("reset"))
    with pytest.raises(httpx.TransportError):
        get(server)


def test_control_endpoints(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """Faults and time jumps can be driven over HTTP by people and other processes."""
    _, server, _ = served
    with httpx.Client(trust_env=False) as http:
        assert http.post(server.url + "/_simulator/faults", json={"kind": "status", "status": 502}).status_code == 200
        assert get(server).status_code == 502
        assert http.post(server.url + "/_simulator/faults", json={"kind": "nope"}).status_code == 400
        assert http.post(server.url + "/_simulator/advance", json={"seconds": 10}).json()["scenario_time"] == 10
        assert get(server).json()["Events"][0]["EventStatus"] == "Scheduled"
        state = http.get(server.url + "/_simulator/state").json()
        assert state["scenario"] == "live-migration"
        assert http.get(server.url + "/_simulator/requests").json()[0]["path"] == "/_simulator/faults"


def test_control_clears_faults_and_answers_404_for_an_action_or_method_it_does_not_list(
        served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """POST clear-faults drops a fault injected for ever; an unknown action, or a known one asked with the other
    method, is 404."""
    _, server, _ = served
    with httpx.Client(trust_env=False) as http:
        assert http.post(server.url + "/_simulator/faults", json={"kind": "status", "status": 502,
                                                                  "count": 0}).status_code == 200
        assert get(server).status_code == 502
        assert http.post(server.url + "/_simulator/clear-faults").status_code == 200
        assert get(server).status_code == 200
        assert http.post(server.url + "/_simulator/nope").status_code == 404
        assert http.post(server.url + "/_simulator/state").status_code == 404
        assert http.get(server.url + "/_simulator/clear-faults").status_code == 404


def test_keep_alive(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """The simulator keeps connections open like IMDS, so a poller can reuse one."""
    _, server, _ = served
    host, port = server.server_address[:2]
    with socket.create_connection((str(host), port)) as conn:
        request = f"GET {SE}?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\nMetadata: true\r\n\r\n".encode()
        for _ in range(2):
            conn.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                data += conn.recv(65536)
            assert data.startswith(b"HTTP/1.1 200")


def test_urllib_sees_the_same_document(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """Any ordinary client works against the simulator (what users' responders will use)."""
    _, server, clock = served
    clock.now += 10
    request = urllib.request.Request(server.url + SE + "?api-version=2020-07-01", headers={"Metadata": "true"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert json.load(response)["Events"][0]["EventType"] == "Freeze"


@pytest.mark.parametrize(("fault", "reason"), [
    ({"kind": "status", "status": "abc"}, "status must be an integer from 100 to 599"),
    ({"kind": "status", "status": 99999}, "status must be an integer from 100 to 599"),
    ({"kind": "status", "status": 42}, "status must be an integer from 100 to 599"),
    ({"kind": "status", "status": True}, "status must be an integer"),
    ({"kind": "delay", "seconds": -1}, "seconds must be a number from 0 to 3600"),
    ({"kind": "delay", "seconds": "soon"}, "seconds must be a number"),
    ({"kind": "hang", "seconds": 1e308}, "seconds must be a number from 0 to 3600"),
    ({"kind": "huge", "bytes": -5}, "bytes must be an integer from 0"),
    ({"kind": "huge", "bytes": 2**40}, "bytes must be an integer from 0"),
    ({"kind": "huge", "size": 1000}, "unknown fault keys size (the body size is 'bytes')"),
    ({"kind": "status", "count": -1}, "count must be an integer from 0"),
    ({"kind": "status", "count": 1.5}, "count must be an integer"),
    ({"kind": "throttle", "retry_after": "1\r\nX-Injected: yes"}, "retry_after must be printable ASCII"),
    ({"kind": "redirect", "location": ["http://x/"]}, "location must be printable ASCII"),
    ({"kind": "body", "text": 7}, "text must be a string"),
    (rb'{"kind": "body", "text": "\ud800"}', "text must be valid Unicode"),
    ({"kind": "chunked", "error": "sometimes"}, "error 'sometimes' is not one of none, missing_last, bad_size"),
    ({"kind": "drip", "seconds": 0}, "drip needs seconds > 0"),
    ({"kind": 5}, "kind must be a string"),
    ({"status": 500}, "an object with at least 'kind'"),
    ([{"kind": "status"}, {"kind": "status", "status": "x"}], "status must be an integer"),
])
def test_bad_faults_are_400_with_the_reason_and_change_nothing(served: tuple[Simulator, SimulatorServer, FakeClock],
                                                               fault: object, reason: str) -> None:
    """The fault API checks every value: 400 naming what is wrong, nothing injected (a list is all or nothing), and
    the next GET is a normal document (it used to crash the handler)."""
    _, server, _ = served
    with httpx.Client(trust_env=False) as http:
        answer = http.post(server.url + "/_simulator/faults", **(
            {"content": fault} if isinstance(fault, bytes) else {"json": fault}))
    assert answer.status_code == 400
    assert reason in answer.json()["error"]
    assert get(server).status_code == 200


def test_a_body_spec_takes_json_with_commas() -> None:
    """text= takes the rest of the spec, so a JSON body with commas can be given on the command line."""
    assert parse_fault('body,count=0,text={"DocumentIncarnation": 1, "Events": []}') == Fault(
        "body", count=0, text='{"DocumentIncarnation": 1, "Events": []}')


def test_retry_after_is_seconds_or_an_http_date() -> None:
    """Retry-After as RFC 9110 defines it: delay-seconds, or an HTTP date (the client reads both; a date, which
    holds a comma, goes through the JSON API)."""
    assert parse_fault("throttle,retry_after=0").retry_after == "0"
    assert from_json({"kind": "throttle", "retry_after": "Wed, 21 Oct 2026 07:28:00 GMT"}).retry_after
    assert from_json({"kind": "throttle", "retry_after": 7}).retry_after == "7"
    with pytest.raises(ConfigError, match="retry_after must be"):
        from_json({"kind": "throttle", "retry_after": -5})


def test_bytes_is_the_size_key_everywhere() -> None:
    """'bytes' in a spec string and in JSON, as docs/simulator.md says; both make the same fault."""
    assert parse_fault("huge,bytes=300") == from_json({"kind": "huge", "bytes": 300}) == Fault("huge", size=300)
    assert parse_fault("truncate,bytes=10,count=0") == Fault("truncate", size=10, count=0)


@pytest.mark.parametrize(("spec", "reason"), [
    ("status,status=abc", "invalid literal"), ("status,status=99999", "from 100 to 599"),
    ("delay,seconds=-1", "from 0 to 3600"), ("delay,seconds=nan", "from 0 to 3600"),
    ("chunked,error=maybe", "is not one of"), ("huge,size=5", "unknown keys size"),
    ("throttle,retry_after=-5", "retry_after must be whole seconds"), ("throttle,retry_after=1.5", "whole seconds"),
    ("throttle,retry_after=soon", "or an HTTP date"),
])
def test_bad_fault_specs_are_refused_with_a_reason(spec: str, reason: str) -> None:
    """The CLI's --fault gets the same checks: one clear error instead of a crash at the next request."""
    with pytest.raises(ConfigError, match=reason):
        parse_fault(spec)


def test_advance_refuses_going_back_or_nonsense(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """Scenario time only moves forward, by a finite number of seconds."""
    _, server, _ = served
    with httpx.Client(trust_env=False) as http:
        for seconds in (-5, "soon", None, True):
            answer = http.post(server.url + "/_simulator/advance", json={"seconds": seconds})
            assert answer.status_code == 400, seconds
        assert http.post(server.url + "/_simulator/advance", content=b'{"seconds": Infinity}').status_code == 400


def test_advance_refuses_taking_the_clock_past_a_century(
        served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """Two jumps of 1e308 s made the clock infinite (an answer of ``Infinity``, every later document NaN): a jump past
    MAX_SCENARIO_TIME is refused with a one-line reason, the clock unchanged, and the simulator keeps serving."""
    _, server, _ = served
    with httpx.Client(trust_env=False) as http:
        for _ in range(2):
            answer = http.post(server.url + "/_simulator/advance", json={"seconds": 1e308})
            assert answer.status_code == 400
            assert "past 3153600000 s (100 years)" in answer.json()["error"] and "\n" not in answer.json()["error"]
        almost = {"seconds": MAX_SCENARIO_TIME - 10}
        assert http.post(server.url + "/_simulator/advance", json=almost).status_code == 200
        assert http.post(server.url + "/_simulator/advance", json={"seconds": 20}).status_code == 400
        state = http.get(server.url + "/_simulator/state")
        assert state.status_code == 200 and "Infinity" not in state.text and "NaN" not in state.text
        assert http.get(server.url + SE, params={"api-version": "2020-07-01"},
                        headers={"Metadata": "true"}).status_code == 200


def raw_exchange(server: SimulatorServer, timeout: float = 5.0) -> bytes:
    """One GET on a raw socket; everything the simulator sends until it closes."""
    host, port = server.server_address[:2]
    with socket.create_connection((str(host), port), timeout=timeout) as conn:
        conn.sendall(f"GET {SE}?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\nMetadata: true\r\n\r\n".encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data


def test_truncate_sends_part_of_the_document_under_its_full_length(
        served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """truncate: the whole document's Content-Length, the first N bytes (default half), then the connection closes."""
    sim, server, _ = served
    document = json.dumps(sim.document()).encode()
    for fault, sent in ((Fault("truncate"), len(document) // 2), (Fault("truncate", size=7), 7),
                        (Fault("truncate", size=10**6), len(document) - 1)):
        sim.inject(fault)
        head, _, body = raw_exchange(server).partition(b"\r\n\r\n")
        assert b"Content-Length: %d" % len(document) in head
        assert body == document[:sent]


def test_drip_sends_one_byte_at_a_time(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """drip: the whole answer arrives a byte per send, complete and correct when the client waits for it."""
    sim, server, _ = served
    document = json.dumps(sim.document()).encode()
    sim.inject(Fault("drip", seconds=0.001))
    head, _, body = raw_exchange(server).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == document


@pytest.mark.parametrize(("error", "expected"), [("none", "whole"), ("missing_last", "no last chunk"),
                                                 ("bad_size", "bad size")])
def test_chunked_faults(served: tuple[Simulator, SimulatorServer, FakeClock], error: str, expected: str) -> None:
    """chunked: the document in chunks, well formed or with its last chunk missing or a garbled size."""
    sim, server, _ = served
    sim.inject(Fault("chunked", error=error))
    head, _, body = raw_exchange(server).partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    if expected == "whole":
        with httpx.Client(trust_env=False) as http:  # an ordinary client decodes it to the document
            sim.inject(Fault("chunked", error=error))
            assert http.get(server.url + SE, params={"api-version": "2020-07-01"},
                            headers={"Metadata": "true"}).json() == sim.document()
    elif expected == "no last chunk":
        assert not body.endswith(b"0\r\n\r\n")
    else:
        assert b"\r\nzz\r\n" in body


def test_gzip_bomb_inflates_to_blanks_then_the_document(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """gzip: Content-Encoding gzip though identity was asked for; with bytes=N it inflates to N blanks and the
    document (still valid JSON), at a small fraction of N on the wire."""
    sim, server, _ = served
    sim.inject(Fault("gzip", size=8 * 1024 * 1024))
    head, _, body = raw_exchange(server).partition(b"\r\n\r\n")
    assert b"Content-Encoding: gzip" in head
    assert len(body) < 64 * 1024
    inflated = gzip.decompress(body)
    assert len(inflated) == 8 * 1024 * 1024 + len(json.dumps(sim.document()))
    assert json.loads(inflated) == sim.document()


# ---------------------------------------------------------------- the double under abuse


def test_idle_connections_hold_no_thread_and_are_capped_and_timed_out() -> None:
    """300 idle connections add no thread; past the cap (here 50) the longest-waiting ones are closed, the rest
    when the head deadline passes, and a normal GET is answered meanwhile."""
    sim = Simulator(scenarios.load("live-migration"))
    server = start(sim, bounds=Bounds(connections=50, head_timeout=1.0))
    threads = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", server.server_port), timeout=5) for _ in range(300)]
    try:
        assert threading.active_count() == threads
        assert get(server).status_code == 200

        def closed(sock: socket.socket) -> bool:
            try:
                return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) in (b"", b"H")  # closed, or 408
            except BlockingIOError:
                return False
            except OSError:
                return True

        wait_until(lambda: all(closed(sock) for sock in idle), timeout=10, what="every idle connection closed")
    finally:
        for sock in idle:
            sock.close()
        server.server_close()


def test_a_body_over_64_kib_is_refused_413_and_not_kept(served: tuple[Simulator, SimulatorServer, FakeClock]) -> None:
    """A 1 MiB approval body is answered 413 without being read, and nothing of it is recorded."""
    sim, server, _ = served
    before = len(sim.requests)
    answer = post(server, b"x" * 1024 * 1024)
    assert answer.status_code == 413
    assert len(sim.requests) == before


def test_request_history_is_bounded() -> None:
    """The simulator remembers the last 1,000 requests (and 1,000 changes of the served document), no more."""
    sim = Simulator(scenarios.load("live-migration"))
    for number in range(HISTORY + 500):
        sim.record(RecordedRequest(0.0, "GET", f"/{number}", "", "t", "true", b""))
        sim.record_served(str(number).encode())
    assert HISTORY == 1000
    assert [r.path for r in sim.requests] == [f"/{number}" for number in range(500, HISTORY + 500)]
    assert sim.distinct_served() == [str(number).encode() for number in range(500, HISTORY + 500)]


def test_a_repeating_scenario_keeps_no_notbefore_of_past_cycles() -> None:
    """The NotBefores fixed at first sight are kept only while listed: a repeating scenario served cycle after
    cycle (a rehearsal left running, or a high --speed) holds a bounded number of them."""
    clock = FakeClock()
    sim = Simulator(scenarios.load("demo"), clock=clock)
    assert sim.scenario.repeat_every is not None
    listed_at_most = len(sim.scenario.events)
    clock.now += 250  # four events listed with a NotBefore, each cycle under fresh EventIds
    for _ in range(200):
        clock.now += sim.scenario.repeat_every
        assert sim.document()["Events"]
        assert len(sim._not_before_wall) <= listed_at_most


def test_a_notbefore_stays_put_while_listed_across_a_jump() -> None:
    """An event's NotBefore is fixed at first sight: a jump of scenario time later does not move it."""
    clock = FakeClock()
    sim = Simulator(scenarios.load("live-migration"), clock=clock)
    clock.now += 10
    first = {e["EventId"]: e["NotBefore"] for e in sim.document()["Events"]}
    sim.advance(5)
    clock.now += 1
    again = {e["EventId"]: e["NotBefore"] for e in sim.document()["Events"]}
    assert first and again == first


def test_the_request_history_reads_safely_while_the_server_records() -> None:
    """Iterating ``requests`` while another thread records never fails: readers get a copy."""
    sim = Simulator(scenarios.load("live-migration"))
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            sim.record(RecordedRequest(0.0, "GET", "/", "", "t", "true", b""))

    writer = threading.Thread(target=record)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows, so a live view would be caught mid-walk
    writer.start()
    try:
        for _ in range(200):
            assert all(r.method == "GET" for r in sim.requests)
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(switch)


@pytest.mark.parametrize("action", ["faults", "identity", "advance"])
@pytest.mark.parametrize("body", [b"[]", b'{"lifetime": 1e400}', b"[" * 60_000, b"[" * 100_000, b"not json",
                                  b"\xff\xfe", b'{"seconds": NaN}'])
def test_bad_control_bodies_get_400_with_a_one_line_reason(served: tuple[Simulator, SimulatorServer, FakeClock],
                                                           action: str, body: bytes) -> None:
    """Whatever the body, the control API answers (400 when it cannot use it, 413 past 64 KiB) with a one-line
    reason."""
    _, server, _ = served
    with httpx.Client(trust_env=False) as http:
        answer = http.post(f"{server.url}/_simulator/{action}", content=body)
    if action == "faults" and body == b"[]":
        assert answer.status_code == 200  # no faults: nothing to do
        return
    if len(body) > 64 * 1024:
        assert answer.status_code == 413
        assert answer.text.count("\n") == 1
        return
    assert answer.status_code == 400, answer.text
    reason = answer.json()["error"]
    assert reason and "\n" not in reason and "Traceback" not in reason and len(reason) <= 300


@pytest.mark.parametrize("settings", [{"status": 99999}, {"status": 99}, {"status": "500"}, {"lifetime": -1},
                                      {"lifetime": 10**12}, {"fail": -1}, {"colour": "red"}])
def test_identity_settings_are_validated(served: tuple[Simulator, SimulatorServer, FakeClock],
                                         settings: dict[str, object]) -> None:
    """/_simulator/identity takes a status from 100 to 599, a finite lifetime from 0 to ten years, a count."""
    sim, server, _ = served
    with httpx.Client(trust_env=False) as http:
        answer = http.post(f"{server.url}/_simulator/identity", json=settings)
    assert answer.status_code == 400
    assert (sim.identity.lifetime, sim.identity.failures, sim.identity.failure_status) == (3599, 0, 500)


@pytest.mark.parametrize("status", [100, 103, 204, 304, 418, 599])
def test_a_status_fault_sends_that_status_with_its_body(served: tuple[Simulator, SimulatorServer, FakeClock],
                                                        status: int) -> None:
    """Any status from 100 to 599 goes out as asked, with its JSON body, even those HTTP frames without one."""
    sim, server, _ = served
    sim.inject(Fault("status", status=status))
    with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as conn:
        conn.sendall(f"GET {SE}?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\nMetadata: true\r\n"
                     "Connection: close\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 %d " % status)
    assert answer.endswith(b'{"error": "simulated HTTP %d"}' % status)
