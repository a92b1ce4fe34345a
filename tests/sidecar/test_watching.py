"""How long the sidecar has watched IMDS (azure_scheduled_events_watching_since_timestamp_seconds): since its first
read, continued from the state directory after a short restart, started again after a long gap in the reads, a long
stop, or a wall clock that went back (core/watch.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from se_exporter.core.lifecycle import EventRecord
from se_exporter.core.model import parse_document
from se_exporter.core.watch import Read
from se_exporter.sidecar.lifecycle_store import LifecycleStore
from se_exporter.sidecar.metrics import Metrics
from se_exporter.sidecar.poller import Poller
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import FanOut
from se_exporter.sidecar.snapshot import CurrentState, Snapshot
from tests.support.fakes import imds_http
from tests.support.fakes.imds_http import scripted_imds

WATCHING = "azure_scheduled_events_watching_since_timestamp_seconds"
SCOPE = "http://imds.test"
REBOOT = {"EventId": "E1", "EventStatus": "Started", "EventType": "Reboot", "ResourceType": "VirtualMachine",
          "Resources": ["vm0"], "NotBefore": "", "EventSource": "Platform", "DurationInSeconds": -1}
SETTINGS = Settings(vm_name="vm0")
GAP = SETTINGS.watch_gap  # 60 s at the defaults: sixty 1 s polls


def doc(incarnation: int, *events: dict[str, object]) -> httpx.Response:
    return httpx.Response(200, content=json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}))


class Clock:
    """A machine's two clocks, which the test moves: ``wall`` (the poller's ``clock``) and ``monotonic``, which
    counts from boot for every process (``reboot`` starts it again) and never steps. ``advance`` moves both."""

    def __init__(self, now: float, monotonic: float = 10_000.0) -> None:
        self.now, self.mono = now, monotonic

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds


@pytest.fixture(autouse=True)
def _close_servers() -> Iterator[None]:
    yield
    imds_http.close_all()


def store(path: Path, clock: Clock, scope: str = SCOPE) -> LifecycleStore:
    return LifecycleStore(path, scope=scope, clock=clock, monotonic=clock.monotonic)


def poller(script: Iterable[httpx.Response], clock: Clock, state: LifecycleStore | None = None,
           settings: Settings = SETTINGS) -> tuple[Poller, CollectorRegistry]:
    imds, _, _ = scripted_imds(script, api_version=settings.api_version)
    registry = CollectorRegistry()
    current = CurrentState(Snapshot(vm_name="vm0", api_version=settings.api_version))
    metrics = Metrics(registry, current.get)
    sinks = FanOut([], on_error=lambda name: None)
    return Poller(imds, metrics, sinks, settings, current, clock=clock, store=state,
                  monotonic=clock.monotonic), registry


def watched_then_stopped(tmp_path: Path, clock: Clock) -> None:
    """A sidecar that watched an empty document for ten minutes (from 1000 on the wall clock, a read every 50 s,
    each written: more than half the allowed gap), then stopped at its last read (1600)."""
    first, _ = poller([doc(1)] * 13, clock, store(tmp_path, clock))
    for n in range(13):
        clock.advance(50 if n else 0)
        first.poll_once()


def saved(tmp_path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((tmp_path / "lifecycle.json").read_text())
    return data


def test_the_allowed_gap_is_derived_from_the_settings_and_never_above_five_minutes() -> None:
    """Sixty polls, or two of the longest waits after failures, whichever is longer, at most 300 s (a Terminate's
    shortest notice): a test's fast polls make it seconds, nothing makes it hide a whole notice."""
    assert SETTINGS.watch_gap == 60.0
    assert Settings(poll_interval=0.05, max_backoff=0.2).watch_gap == 3.0
    assert Settings(poll_interval=0.05, max_backoff=5).watch_gap == 10.0
    assert Settings(poll_interval=10).watch_gap == 300.0
    assert Settings(max_backoff=3600).watch_gap == 300.0


def test_a_fresh_sidecar_watches_from_its_first_read_and_exports_nothing_before() -> None:
    """No series before the first valid read; then the time of that read, which is also when the events of the
    first document were first seen (so an event Started there reads as not watched at all)."""
    clock = Clock(5000.0)
    polled, registry = poller([httpx.Response(500), doc(1, REBOOT), doc(1, REBOOT)], clock)
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) is None
    clock.advance(10)
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) == 5010.0
    assert polled.snapshot.records["e1"].first_seen == 5010.0
    clock.advance(10)
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) == 5010.0


def test_a_short_restart_with_its_state_continues_the_watch_and_one_without_starts_afresh(tmp_path: Path) -> None:
    """Restored state counts as watching when the sidecar was down no longer than the allowed gap (a quick pod
    restart): the restarted sidecar exports the watch it saved, and says nothing before its first read; another
    IMDS endpoint's state, or none, starts a new watch at the first read."""
    clock = Clock(1000.0)
    watched_then_stopped(tmp_path, clock)
    clock.advance(GAP / 2)  # within half a gap of the last write, whenever the sidecar stopped
    restarted, registry = poller([doc(1, REBOOT)], clock, store(tmp_path, clock))
    assert registry.get_sample_value(WATCHING) is None
    restarted.poll_once()
    assert registry.get_sample_value(WATCHING) == 1000.0
    elsewhere, registry = poller([doc(1)], clock, store(tmp_path, clock, scope="http://other.test"))
    elsewhere.poll_once()
    assert registry.get_sample_value(WATCHING) == clock.now
    fresh, registry = poller([doc(1)], clock, store(tmp_path / "empty", clock))
    fresh.poll_once()
    assert registry.get_sample_value(WATCHING) == clock.now


@pytest.mark.parametrize("down", [GAP + 1, 3600.0])
def test_a_restart_after_a_long_stop_starts_a_new_watch(tmp_path: Path, down: float) -> None:
    """The defect of issue 43: a sidecar stopped for longer than the allowed gap (a node drained for an hour, the
    VM rebooted by the very event) may have missed an event's whole notice. Its state keeps the records, but the
    watch starts again at the first read, so an event it finds Started warns instead of paging as a host failure."""
    clock = Clock(1000.0)
    watched_then_stopped(tmp_path, clock)
    last_read = saved(tmp_path)["last_read"]
    assert isinstance(last_read, float) and clock.now - last_read <= GAP / 2
    clock.now = last_read + down
    clock.mono += down
    restarted, registry = poller([doc(2, REBOOT)], clock, store(tmp_path, clock))
    restarted.poll_once()
    assert registry.get_sample_value(WATCHING) == clock.now
    assert restarted.snapshot.records["e1"].first_seen == clock.now  # first seen at the watch's start: it warns


def test_a_quiet_sidecar_rewrites_its_state_every_half_gap_not_every_poll(tmp_path: Path) -> None:
    """Nothing changes on an idle VM: the file is written at the first read, then once every half gap (so that a
    restart measures its downtime from a read at most that old), not once a poll."""
    clock = Clock(1000.0)
    polled, _ = poller([doc(1)] * 200, clock, store(tmp_path, clock))
    reads: list[object] = []
    for _ in range(200):
        polled.poll_once()
        reads.append(saved(tmp_path)["last_read"])
        clock.advance(1)
    writes = sorted({read for read in reads if isinstance(read, float)})
    assert writes == [1000.0 + n * GAP / 2 for n in range(len(writes))]
    assert len(writes) == 1 + int(199 // (GAP / 2))


def test_a_gap_in_the_reads_starts_the_watch_again_and_the_state_keeps_it(tmp_path: Path) -> None:
    """Reads more than the allowed gap apart (IMDS unreadable meanwhile) may have missed an event's Scheduled
    phase: the watch starts again at the read after the gap, and lifecycle.json keeps the new start even though
    the document did not change, so a restart does not bring the old one back."""
    clock = Clock(1000.0)
    polled, registry = poller([doc(1), doc(1), httpx.Response(503), doc(1), doc(1)], clock, store(tmp_path, clock))
    polled.poll_once()
    clock.advance(GAP)  # at the bound: still one watch
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) == 1000.0
    clock.advance(10)
    polled.poll_once()  # failed
    clock.advance(GAP - 9)
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) == clock.now
    restored = store(tmp_path, clock).restore()
    assert restored.watching_since == clock.now


def test_a_wall_clock_stepped_back_starts_a_new_watch_never_one_in_the_future(tmp_path: Path) -> None:
    """A wall clock that went back between two reads (NTP, a host's correction) would leave the watch starting after
    now: the watch starts again at the read, which warns for a minute rather than paging on a timeline in doubt."""
    clock = Clock(1000.0)
    polled, registry = poller([doc(1)] * 3, clock, store(tmp_path, clock))
    polled.poll_once()
    clock.advance(1)
    polled.poll_once()
    clock.now -= 3600  # stepped back an hour
    clock.mono += 1
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) == clock.now


def test_a_restart_whose_wall_clock_went_back_by_its_downtime_starts_a_new_watch(tmp_path: Path) -> None:
    """Stopped for an hour in the same boot, restarted with the wall clock an hour behind: the wall clock says a
    second passed, the monotonic clock (which counts from boot for every process, and cannot step) says an hour, and
    the larger is believed."""
    clock = Clock(1000.0)
    watched_then_stopped(tmp_path, clock)
    clock.mono += 3600
    clock.now += 1  # the wall clock stepped back by all but a second of the downtime
    restarted, registry = poller([doc(1)], clock, store(tmp_path, clock))
    restarted.poll_once()
    assert registry.get_sample_value(WATCHING) == clock.now


def test_a_restart_after_a_reboot_goes_by_the_wall_clock(tmp_path: Path) -> None:
    """After a reboot the monotonic clock counts again from 0: it says nothing of the downtime, and the wall clock
    decides (a short reboot keeps the watch, a long one does not); a clock before the last read starts a new one."""
    clock = Clock(1000.0)
    watched_then_stopped(tmp_path, clock)
    last, before = clock.now, (tmp_path / "lifecycle.json").read_bytes()
    for wall, continues in [(last + GAP / 2, True), (last + GAP + 1, False), (last - 1, False)]:
        (tmp_path / "lifecycle.json").write_bytes(before)  # each case restarts from the ten-minute watch
        clock.now, clock.mono = wall, 30.0  # rebooted 30 s ago
        restarted, registry = poller([doc(1)], clock, store(tmp_path, clock))
        restarted.poll_once()
        assert registry.get_sample_value(WATCHING) == (1000.0 if continues else wall), wall


@pytest.mark.parametrize("change", [{"last_read": None, "last_read_monotonic": None}, {"watching_since": 1601.0}])
def test_a_saved_watch_that_cannot_be_checked_is_not_continued(tmp_path: Path, change: dict[str, object]) -> None:
    """A file with a watch but no last read (nothing to measure the downtime from), or a watch that began after the
    last read (written by a clock since stepped), is not evidence of watching: a new watch starts."""
    clock = Clock(1000.0)
    watched_then_stopped(tmp_path, clock)
    data = saved(tmp_path) | change
    (tmp_path / "lifecycle.json").write_text(json.dumps(data))
    clock.advance(1)
    restarted, registry = poller([doc(1)], clock, store(tmp_path, clock))
    restarted.poll_once()
    assert registry.get_sample_value(WATCHING) == clock.now


@pytest.mark.parametrize("key", ["watching_since", "last_read", "last_read_monotonic"])
@pytest.mark.parametrize("value", ["soon", True, [1], float("inf")])
def test_a_wrongly_typed_watch_in_the_state_file_is_ignored_with_the_file(tmp_path: Path, key: str, value: object,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Nothing in the file is trusted half-way: a watch or a last read that is not a finite number ignores the whole
    file."""
    LifecycleStore(tmp_path, clock=lambda: 1000.0).save({}, watching_since=10.0, last_read=Read(999.0, 5.0))
    data = json.loads((tmp_path / "lifecycle.json").read_text())
    data[key] = value
    (tmp_path / "lifecycle.json").write_text(json.dumps(data))
    restored = LifecycleStore(tmp_path, clock=lambda: 1000.0).restore()
    assert restored.watching_since is None and restored.records == {}
    assert "ignoring the lifecycle state file" in caplog.text


def test_the_watch_round_trips_with_the_records(tmp_path: Path) -> None:
    """What is saved is restored: the records, the watch and the last read; a file saved without a watch restores
    none."""
    event = parse_document(doc(1, REBOOT).content).events[0]
    records = {"E1": EventRecord(event, 100.0, started_at=100.0)}
    LifecycleStore(tmp_path, clock=lambda: 1000.0).save(records, watching_since=50.0, last_read=Read(999.5, 7.25))
    restored = LifecycleStore(tmp_path, clock=lambda: 1000.0).restore()
    facts = {k: (r.event, r.first_seen, r.started_at) for k, r in restored.records.items()}
    assert (facts, restored.watching_since, restored.last_read) == ({"E1": (event, 100.0, 100.0)}, 50.0,
                                                                    Read(999.5, 7.25))
    LifecycleStore(tmp_path, clock=lambda: 1000.0).save(records)
    restored = LifecycleStore(tmp_path, clock=lambda: 1000.0).restore()
    assert (restored.watching_since, restored.last_read) == (None, None)

