"""The simulator's platform copy: every message it makes is one the fleet's reader takes for what it means."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from typing import Any

import pytest

from se_exporter.core.model import VmIdentity
from se_exporter.fleet.platform.reader import PlatformEvent, read_platform
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.platform import PlatformCopy, Published
from se_exporter.simulator.scenario import Scenario, lifecycle
from se_exporter.simulator.server import Simulator, every_vm
from se_exporter.simulator.timeline import Timeline
from tests.support.helpers import key_times

EPOCH = 1_800_000_000.0  # unix time of scenario second 0 in these tests
MAX = 1024 * 1024
SCOPES = {"virtualMachineScaleSets": "scale_set", "availabilitySets": "availability_set",
          "virtualMachines": "virtual_machine"}


def read(message: Published) -> PlatformEvent:
    found = read_platform(message.body, MAX, 0.0)
    assert found is not None and not found.skipped and not found.warnings, (found, message.body[:300])
    [event] = found.events
    return event


def sweep(scenario: Scenario, schema: str = "eventgrid", until: float | None = None) -> list[tuple[float, Published]]:
    """Every message of one cycle (or until ``until``), looked for at each moment IMDS changes and half a second
    before it, with that moment."""
    copy = PlatformCopy(scenario, schema)
    out: list[tuple[float, Published]] = []
    moments = sorted({0.0, *key_times(scenario), *(t - 0.5 for t in key_times(scenario) if t >= 0.5)})
    for t in moments:
        if until is None or t <= until:
            out += [(t, message) for message in copy.due(t, {}, lambda at: EPOCH + at)]
    return out


def expected_statuses(scenario: Scenario) -> dict[str, list[str]]:
    return {spec.event_id: [status for _, status in lifecycle(spec, None)] for spec in scenario.events}


@pytest.mark.parametrize("schema", ["eventgrid", "cloudevents"])
@pytest.mark.parametrize("name", scenarios.builtin_names())
def test_every_message_reads_as_the_event_it_tells_of(name: str, schema: str) -> None:
    """For every built-in scenario, every message read_platform takes for the intended status of the scenario's
    EventId, with its Resources, its scope, subscription, resource group and location; the statuses of each EventId
    come in order, once each, and end Completed or Canceled."""
    scenario = scenarios.load(name)
    specs = {spec.event_id: spec for spec in scenario.events}
    seen: dict[str, list[str]] = defaultdict(list)
    for _, message in sweep(scenario, schema):
        event = read(message)
        assert event.schema == schema
        spec = specs[event.event_id]
        kind, scope_name, vm = scenario.scope(spec)
        assert (event.event_id, event.event_status, event.grid_id) == (
            message.event_id, message.event_status, message.grid_id)
        assert (event.event_type, event.resources, event.event_source) == (
            spec.event_type, spec.resources, spec.listed["EventSource"])
        assert (event.scope_type, event.scope_name) == (SCOPES[kind], scope_name)
        assert (event.subscription_id, event.resource_group, event.location) == (
            vm["subscriptionId"], vm["resourceGroupName"], vm["location"])
        assert (event.not_before is None) == (event.event_status != "Scheduled")
        if not message.duplicate:
            seen[event.event_id].append(event.event_status)
    assert dict(seen) == expected_statuses(scenario)
    assert all(statuses[-1] in ("Completed", "Canceled") for statuses in seen.values())


@pytest.mark.parametrize("name", scenarios.builtin_names())
def test_the_platform_ends_an_event_when_imds_drops_it(name: str) -> None:
    """Same EventIds as IMDS; Scheduled and Started when IMDS first lists them so; Completed when IMDS drops a
    started event, Canceled when it drops one that never started (IMDS shows neither)."""
    scenario = scenarios.load(name)
    for t, message in sweep(scenario):
        if message.duplicate:
            continue
        before = {s.event_id: s.status for s in scenario.state_at(t - 0.001, {})}
        now = {s.event_id: s.status for s in scenario.state_at(t, {})}
        status = message.event_status
        if status in ("Scheduled", "Started"):
            assert now.get(message.event_id) == status and before.get(message.event_id) != status, (t, status)
        else:
            assert message.event_id not in now, (t, status)
            assert before.get(message.event_id) == ("Started" if status == "Completed" else "Scheduled"), (t, status)


def test_duplicates_repeat_the_event_grid_id_and_bytes_now_and_then() -> None:
    """Every duplicate_every-th message comes twice with the same Event Grid id and bytes; other ids never repeat."""
    scenario = scenarios.load("fleet")
    messages = [message for _, message in sweep(scenario)]
    originals = [m for m in messages if not m.duplicate]
    copies = [m for m in messages if m.duplicate]
    assert len(copies) == len(originals) // scenario.platform.duplicate_every > 0
    assert len({m.grid_id for m in originals}) == len(originals)
    for copy in copies:
        original = messages[messages.index(copy) - 1]
        assert (original.grid_id, original.body, original.duplicate) == (copy.grid_id, copy.body, False)


def test_a_repeating_scenario_announces_each_cycles_event_ids() -> None:
    """Each cycle's fresh EventIds (as IMDS lists them) are announced, and the memory keeps only a few cycles."""
    scenario = scenarios.load("fleet")
    period = scenario.repeat_every or 0
    copy = PlatformCopy(scenario)
    ids: set[str] = set()
    for cycle in range(6):
        for t in (cycle * period + dt for dt in range(0, int(period), 5)):
            ids |= {m.event_id for m in copy.due(t, {}, lambda at: EPOCH + at)}
            listed = {s.event_id for s in scenario.state_at(t, {})}
            assert listed <= ids, t
    assert len(ids) == 6 * len(scenario.events)
    assert len(copy._published) <= 3 * len(scenario.events)


def test_a_jump_of_scenario_time_publishes_what_it_skipped_in_order() -> None:
    """After a jump past whole events, their statuses still come, in order, with eventTimes that never go back."""
    scenario = scenarios.load("fleet")
    copy = PlatformCopy(scenario)
    wall = iter(range(10**6))
    messages = copy.due(250.0, {}, lambda at: EPOCH + at) + copy.due(260.0, {}, lambda at: EPOCH + next(wall))
    times = [read(m).event_time for m in messages]
    assert times == sorted(times)
    statuses: dict[str, list[str]] = defaultdict(list)
    for message in messages:
        if not message.duplicate:
            statuses[message.event_id].append(message.event_status)
    assert dict(statuses) == expected_statuses(scenario)


def test_an_approval_starts_the_event_on_every_vm_and_on_the_platform() -> None:
    """An approval from one VM (a StartRequest) starts the event in every VM's IMDS and in the platform copy, with
    the approval's time."""
    clock = FakeClock()
    web_0, web_1, *_ = every_vm(scenarios.load("fleet"), clock=clock)
    copy = PlatformCopy(web_0.scenario)
    freeze = web_0.scenario.events[0].event_id
    clock.now += 10
    assert web_1.approve([freeze]) == []
    assert [e["EventStatus"] for e in web_0.document()["Events"] if e["EventId"] == freeze] == ["Started"]
    now = web_0.timeline.now()
    started = [m for m in copy.due(now[1], web_0.timeline.approvals(), lambda t: web_0.timeline.wall_at(t, now))
               if m.event_status == "Started"]
    assert [read(m).event_time for m in started] == [pytest.approx(clock.now)]


class FakeClock:
    def __init__(self) -> None:
        self.now = EPOCH

    def __call__(self) -> float:
        return self.now


def listed(sim: Simulator) -> set[str]:
    return {event["EventId"] for event in sim.document()["Events"]}


def test_a_blind_vm_never_lists_the_event_the_platform_announces() -> None:
    """The scenario's ``blind`` keeps one VM's IMDS from listing one event, which its scale-set neighbours list and
    the platform announces; POST /_simulator/blind does the same to another VM at run time, and to it only."""
    clock = FakeClock()
    sims = {sim.vm["name"]: sim for sim in every_vm(scenarios.load("fleet"), clock=clock)}
    scenario = sims["web_0"].scenario
    freeze, reboot = scenario.events[0].event_id, scenario.events[1].event_id
    clock.now += 30
    assert reboot not in listed(sims["web_2"])
    assert {freeze, reboot} <= listed(sims["web_0"]) & listed(sims["web_1"])
    announced = {m.event_id for _, m in sweep(scenario, until=30)}
    assert reboot in announced
    sims["web_1"].hide(freeze.lower())
    assert freeze not in listed(sims["web_1"]) and freeze in listed(sims["web_0"])


def test_every_vm_has_its_own_identity_in_the_place_the_platform_names() -> None:
    """Each VM's compute metadata (what its sidecar forwards as properties) names the subscription, resource group,
    location and scale set of the platform's messages about it, and a VM name of the event's Resources."""
    scenario = scenarios.load("fleet")
    sims = every_vm(scenario)
    identities = {sim.vm["name"]: VmIdentity.from_compute(sim.vm) for sim in sims}
    assert len({identity.vm_id for identity in identities.values()}) == len(sims)
    for _, message in sweep(scenario):
        event = read(message)
        for name in event.resources:
            identity = identities[name]
            assert (identity.name, identity.subscription_id, identity.resource_group, identity.location,
                    identity.vmss_name) == (name, event.subscription_id, event.resource_group, event.location,
                                            event.scope_name)
            assert identity.resource_id.endswith(f"/virtualMachines/{name}")


def test_a_one_vm_scenario_keeps_listing_every_event() -> None:
    """A scenario of one VM lists every event to it, its neighbours' too, as before scenarios had several VMs."""
    scenario = scenarios.load("availability-set")
    assert len(scenario.vms) == 1
    assert all(scenario.listed_to(spec, "WestNO_0") for spec in scenario.events)


def test_events_reach_only_the_vms_of_their_scale_set() -> None:
    """In a scenario of several VMs an event reaches the VMs of its scale set, not a VM outside it."""
    data: dict[str, Any] = {"vm": {"vmScaleSetName": "web"}, "vms": [{"name": "web_0"}, {"name": "web_1"},
                                                                     {"name": "db", "vmScaleSetName": ""}],
                            "events": [{"EventType": "Reboot", "Resources": ["web_1"]},
                                       {"EventType": "Freeze", "Resources": ["db"]}]}
    scenario = scenarios.from_json(data, "mixed")
    web, db = scenario.events
    assert [scenario.listed_to(web, name) for name in ("web_0", "web_1", "db")] == [True, True, False]
    assert [scenario.listed_to(db, name) for name in ("web_0", "web_1", "db")] == [False, False, True]
    assert scenario.scope(db)[:2] == ("virtualMachines", "db")


@pytest.mark.parametrize(("data", "fragment"), [
    ({"vms": [], "events": []}, "'vms' a non-empty list"),
    ({"vms": [{"name": "a/b"}], "events": []}, "is not 1 to 64 letters"),
    ({"vms": [{"name": "a"}, {"name": "A"}], "events": []}, "two VMs are named 'A'"),
    ({"platform": {"duplicate_every": -1}, "events": []}, "duplicate_every must be a whole number"),
    ({"platform": {"often": 1}, "events": []}, "platform must be an object with"),
    ({"platform": {"delay": 60}, "repeat_every": 60, "events": []}, "delay must be shorter than repeat_every"),
])
def test_bad_vms_or_platform_settings_are_refused_in_one_line(data: dict[str, Any], fragment: str) -> None:
    """A scenario's VMs and platform settings are checked when it loads, with a reason."""
    with pytest.raises(scenarios.ConfigError, match=fragment):
        scenarios.from_json(data, "bad")


def test_the_timeline_is_shared_by_every_vm() -> None:
    """Advancing one VM's IMDS moves every VM of the scenario: one place, one clock."""
    sims = every_vm(scenarios.load("fleet"), clock=FakeClock())
    sims[0].advance(100)
    assert {sim.scenario_time() for sim in sims} == {100.0}
    assert isinstance(sims[0].timeline, Timeline) and all(sim.timeline is sims[0].timeline for sim in sims)


def test_a_platform_delay_moves_every_message_later() -> None:
    """``platform.delay``: each message comes that many scenario seconds after the change in IMDS, eventTime too."""
    data = {"platform": {"delay": 3, "duplicate_every": 0},
            "events": [{"EventType": "Reboot", "appear_at": 2, "notice": 10, "started_for": 5}]}
    scenario = scenarios.from_json(data, "late")
    copy = PlatformCopy(scenario)
    assert copy.due(4.9, {}, lambda at: EPOCH + at) == []
    [scheduled] = copy.due(5.0, {}, lambda at: EPOCH + at)
    assert read(scheduled).event_time == EPOCH + 5
    assert [m.event_status for m in copy.due(20.0, {}, lambda at: EPOCH + at)] == ["Started", "Completed"]


def test_bodies_are_one_line_each(caplog: pytest.LogCaptureFixture) -> None:
    """A message is one line of JSON (the file output writes one per line)."""
    caplog.set_level(logging.INFO)
    for _, message in sweep(scenarios.load("demo")):
        assert b"\n" not in message.body
        json.loads(message.body)


def _call(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    request = urllib.request.Request(url, body, headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


def test_each_vm_is_served_on_its_path_and_blinded_through_the_control_api() -> None:
    """/vms/<name>/ is that VM's IMDS and control API (the first VM also at /); POST .../_simulator/blind hides one
    event from that VM only; a bad body is a 400 with its reason, an unknown VM a 404."""
    from se_exporter.simulator.server import start  # noqa: PLC0415

    clock = FakeClock()
    first, *others = every_vm(scenarios.load("fleet"), clock=clock)
    server = start(first, others=others)
    try:
        freeze = first.scenario.events[0].event_id
        clock.now += 10
        events = "/metadata/scheduledevents?api-version=2020-07-01"
        metadata = {"Metadata": "true"}
        status, compute = _call(server.vm_url("web_2") + "/metadata/instance/compute?api-version=2021-02-01", None,
                                metadata)
        assert (status, compute["name"], compute["vmScaleSetName"]) == (200, "web_2", "web")
        assert _call(server.url + "/metadata/instance/compute?api-version=2021-02-01", None, metadata)[1][
            "name"] == "web_0"
        status, answer = _call(server.vm_url("web_1") + "/_simulator/blind", json.dumps({"EventId": freeze}).encode())
        assert (status, answer) == (200, {})
        ids = {name: {e["EventId"] for e in _call(server.vm_url(name) + events, None, metadata)[1]["Events"]}
               for name in ("web_0", "web_1")}
        assert freeze in ids["web_0"] and freeze not in ids["web_1"]
        status, answer = _call(server.vm_url("web_1") + "/_simulator/blind", b'{"EventId": 7}')
        assert status == 400 and "EventId" in answer["error"]
        assert _call(server.url + "/vms/nobody" + events, None, metadata)[0] == 404
        assert _call(server.url + "/_simulator/platform") == (200, {"error": "the platform copy is not published"})
    finally:
        server.shutdown()
        server.server_close()


def test_an_event_not_announced_is_listed_by_imds_and_never_published() -> None:
    """``"announced": false``: every VM of its place lists it, the platform copy never tells of it (a delivery Event
    Grid lost), while the scenario's other events are published as ever; anything but true or false is refused."""
    data: dict[str, Any] = {"vm": {"vmScaleSetName": "web"}, "vms": [{"name": "web_0"}, {"name": "web_1"}],
                            "platform": {"duplicate_every": 0},
                            "events": [{"EventType": "Reboot", "Resources": ["web_0"], "announced": False},
                                       {"EventType": "Freeze", "Resources": ["web_1"], "appear_at": 1}]}
    scenario = scenarios.from_json(data, "lost")
    lost, freeze = (spec.event_id for spec in scenario.events)
    clock = FakeClock()
    sims = every_vm(scenario, clock=clock)
    clock.now += 2
    assert all({lost, freeze} <= listed(sim) for sim in sims)
    assert {message.event_id for _, message in sweep(scenario)} == {freeze}
    with pytest.raises(scenarios.ConfigError, match="announced must be true or false"):
        scenarios.from_json({"events": [{"EventType": "Reboot", "announced": "no"}]}, "bad")
