"""The pause detector: armed and idle, what it counts on /metrics, what it hands the poll loop, what bounds it."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from se_exporter.core import pause
from se_exporter.core.lifecycle import EventRecord, diff
from se_exporter.core.model import parse_document
from se_exporter.sidecar.lifecycle_store import LifecycleStore
from se_exporter.sidecar.metrics import Metrics
from se_exporter.sidecar.pauses import HELD, PauseDetector, cgroup_throttled, steal_time
from se_exporter.sidecar.poller import Poller
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import FanOut
from se_exporter.sidecar.snapshot import Snapshot
from tests.support.fakes.imds_http import scripted_imds

FREEZE = {"EventId": "F1", "EventStatus": "Started", "EventType": "Freeze", "ResourceType": "VirtualMachine",
          "Resources": ["vm0"], "NotBefore": "", "DurationInSeconds": 5}


def listed(*events: Mapping[str, object]) -> Mapping[str, EventRecord]:
    document = parse_document(json.dumps({"DocumentIncarnation": 1, "Events": list(events)}).encode())
    return diff({}, document, 1000.0).records


def detector(throttled: list[float | None] | None = None,
             steal: list[float | None] | None = None) -> tuple[PauseDetector, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = Metrics(registry, Snapshot)
    readings, stolen = iter(throttled or []), iter(steal or [])
    return PauseDetector(metrics, throttled=lambda: next(readings, None), steal=lambda: next(stolen, None)), registry


def pauses(registry: CollectorRegistry, event_type: str) -> tuple[float | None, float | None]:
    labels = {"event_type": event_type}
    return (registry.get_sample_value("azure_scheduled_events_pause_seconds_count", labels),
            registry.get_sample_value("azure_scheduled_events_pause_seconds_sum", labels))


def test_armed_a_late_look_is_a_pause_of_the_listed_event() -> None:
    found, registry = detector()
    found.listed(listed(FREEZE), "vm0", 100.0)
    assert found.armed
    found.check(100.04)
    found.check(102.08)  # due at 100.08: two seconds late
    assert pauses(registry, "Freeze") == (1.0, pytest.approx(2.0))
    [taken] = found.take(102.1)
    assert (taken.event_key, taken.seconds) == ("f1", pytest.approx(2.0))
    assert found.take(102.12) == []  # taken once


def test_armed_lateness_under_the_threshold_is_not_counted() -> None:
    found, registry = detector()
    found.listed(listed(FREEZE), "vm0", 100.0)
    found.check(100.04 + pause.ARMED_MIN - 0.01)
    assert pauses(registry, "Freeze") == (None, None)
    assert found.take(100.3) == []


def test_idle_only_the_poll_loops_oversleep_of_a_second_counts_and_as_unannounced() -> None:
    found, registry = detector()
    assert not found.armed
    found.overslept(100.0, 100.9)
    found.overslept(200.0, 203.0)
    assert pauses(registry, pause.UNANNOUNCED) == (1.0, pytest.approx(3.0))


def test_armed_the_poll_loops_oversleep_is_left_to_the_armed_looks() -> None:
    """One pause, one observation: armed, the poll loop's own lateness is not counted a second time."""
    found, registry = detector()
    found.listed(listed(FREEZE), "vm0", 100.0)
    found.overslept(101.0, 103.0)
    found.check(103.0)
    assert pauses(registry, "Freeze") == (1.0, pytest.approx(2.96))


def test_it_stays_armed_a_minute_after_the_last_event_is_gone_then_sleeps() -> None:
    found, _ = detector()
    found.listed(listed(FREEZE), "vm0", 100.0)
    found.listed({}, "vm0", 100.5)  # gone: armed until a minute after it was last listed
    now = 100.0
    while now + pause.TICK < 100.0 + pause.ARMED_FOR:
        now += pause.TICK
        found.check(now)
        assert found.armed
    found.check(100.0 + pause.ARMED_FOR + 0.01)
    assert not found.armed


def test_a_pause_the_cgroups_throttling_explains_is_counted_as_throttling() -> None:
    found, registry = detector(throttled=[10.0, 10.0, 10.0, 12.0])  # at start, two looks, after the pause
    found.listed(listed(FREEZE), "vm0", 100.0)
    found.check(100.04)
    found.check(100.08)
    found.check(102.5)
    assert registry.get_sample_value("azure_scheduled_events_throttled_pauses_total") == 1.0
    assert pauses(registry, "Freeze") == (None, None)


def test_pauses_held_for_the_poll_loop_are_bounded() -> None:
    found, registry = detector()
    for second in range(2 * HELD):
        found.overslept(10.0 * second, 10.0 * second + 2)
    assert len(found.take(100_000.0)) == HELD
    assert pauses(registry, pause.UNANNOUNCED)[0] == 2 * HELD  # counted on /metrics all the same


def test_the_thread_sleeps_without_a_timeout_idle_and_ends_on_close_or_stop() -> None:
    found, _ = detector()
    stop = threading.Event()
    thread = threading.Thread(target=found.run, args=(stop,))
    thread.start()
    found.listed(listed(FREEZE), "vm0", 0.0)  # armed: looks every TICK until stop
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    idle, _ = detector()
    thread = threading.Thread(target=idle.run, args=(threading.Event(),))
    thread.start()
    idle.close()
    thread.join(5)
    assert not thread.is_alive()


def test_no_cgroup_limit_means_nothing_is_read(tmp_path: Path) -> None:
    assert cgroup_throttled(tmp_path)() is None


def test_a_pause_says_the_steal_time_over_it_where_the_kernel_reports_one(tmp_path: Path) -> None:
    found, _ = detector(steal=[5.0, 5.5, 7.0])  # armed by the first poll, read at the next, after the pause
    found.listed(listed(FREEZE), "vm0", 100.0)
    found.listed(listed(FREEZE), "vm0", 101.0)
    found.check(103.0)
    [taken] = found.take(103.01)
    assert taken.steal_seconds == pytest.approx(1.5)
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 900 3 0 1 250 0 0\ncpu0 100 0 50 900 3 0 1 250 0 0\n")
    ticks, cpus = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
    assert steal_time(str(stat)) == pytest.approx(250 / ticks / cpus)
    stat.write_text("cpu  100 0 50\n")  # an old kernel without the column
    assert steal_time(str(stat)) is None


def test_the_longest_pause_gauge_is_shown_for_this_vms_events_only() -> None:
    """0 until a pause is felt, for each listed event that may be this VM's; a neighbour's event has none."""
    neighbour = {**FREEZE, "EventId": "N1", "Resources": ["vm1"]}
    records = pause.fold(listed(FREEZE, neighbour), [pause.Pause(5.0, 2.5, "f1", "Freeze")])
    registry = CollectorRegistry()
    Metrics(registry, lambda: Snapshot(records=records, vm_name="vm0", has_document=True))
    name = "azure_scheduled_event_longest_pause_seconds"
    assert registry.get_sample_value(name, {"event_id": "F1", "event_type": "Freeze"}) == 2.5
    assert registry.get_sample_value(name, {"event_id": "N1", "event_type": "Freeze"}) is None


def test_a_pause_longer_than_the_armed_minute_is_counted_once_whoever_looks_first() -> None:
    """The event gone before the pause and the minute after it over during it: the look that counts it disarms the
    detector, and the poll loop's wait, as late, does not count it again."""
    found, registry = detector()
    found.listed(listed(FREEZE), "vm0", 100.0)
    found.listed({}, "vm0", 100.5)
    found.check(100.04)
    found.check(170.1)  # stopped for 70 s: counted, and past the minute: disarmed
    assert not found.armed
    found.overslept(101.0, 170.15)  # the poll loop's wait, due long before: the same pause
    assert pauses(registry, pause.UNANNOUNCED)[0] == 1.0  # the Freeze was gone when it began


def test_it_stays_armed_through_a_poll_that_takes_minutes_while_this_vms_event_is_listed() -> None:
    found, registry = detector()
    found.listed(listed(FREEZE), "vm0", 100.0)  # then a poll hangs: no listing for minutes
    now = 100.0
    while now < 100.0 + 3 * pause.ARMED_FOR:
        now += pause.TICK
        found.check(now)
    assert found.armed
    found.check(now + 3.0)
    assert pauses(registry, "Freeze")[0] == 1.0


def test_a_look_late_because_this_process_itself_was_busy_is_no_pause() -> None:
    """A frozen VM or a stopped process burns no CPU; a huge document parsed by the poll thread does, and keeps the
    looking thread from running: that is not counted."""
    used = [0.0]
    registry = CollectorRegistry()
    found = PauseDetector(Metrics(registry, Snapshot), throttled=lambda: None, steal=lambda: None,
                          cpu=lambda: used[0])
    found.listed(listed(FREEZE), "vm0", 100.0)
    used[0] += 0.85  # the process ran for 0.85 s of the 0.9 s
    found.check(100.94)
    assert pauses(registry, "Freeze") == (None, None)
    found.check(102.5)  # then 1.5 s with no CPU used: a pause
    assert pauses(registry, "Freeze")[0] == 1.0


def test_the_restored_lifecycles_arm_it_before_the_first_poll(tmp_path: Path) -> None:
    """A first poll can take minutes (the first call's timeout): a VM restarted with an event open is armed at once."""
    store = LifecycleStore(tmp_path)
    store.save(listed(FREEZE))
    imds, _, _ = scripted_imds([], timeout=0.5, first_call_timeout=0.5, api_version=Settings().api_version)
    registry = CollectorRegistry()
    metrics = Metrics(registry, Snapshot)
    found = PauseDetector(metrics)
    Poller(imds, metrics, FanOut([], on_error=lambda name: None), Settings(vm_name="vm0"), store=store, pauses=found)
    assert found.armed
