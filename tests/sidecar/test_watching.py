"""How long the sidecar has watched IMDS (azure_scheduled_events_watching_since_timestamp_seconds): since its first
read, continued from the state directory after a restart, started again after a long gap in the reads."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from se_exporter.core.lifecycle import EventRecord
from se_exporter.core.model import parse_document
from se_exporter.sidecar.lifecycle_store import LifecycleStore
from se_exporter.sidecar.metrics import Metrics
from se_exporter.sidecar.poller import Poller
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import FanOut
from se_exporter.sidecar.snapshot import WATCH_GAP_SECONDS, CurrentState, Snapshot
from tests.fakes import imds_http
from tests.fakes.imds_http import scripted_imds

WATCHING = "azure_scheduled_events_watching_since_timestamp_seconds"
SCOPE = "http://imds.test"
REBOOT = {"EventId": "E1", "EventStatus": "Started", "EventType": "Reboot", "ResourceType": "VirtualMachine",
          "Resources": ["vm0"], "NotBefore": "", "EventSource": "Platform", "DurationInSeconds": -1}


def doc(incarnation: int, *events: dict[str, object]) -> httpx.Response:
    return httpx.Response(200, content=json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}))


class Clock:
    """A clock the test moves: each poll reads it once."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _close_servers() -> Iterator[None]:
    yield
    imds_http.close_all()


def poller(script: Iterable[httpx.Response], clock: Clock,
           store: LifecycleStore | None = None) -> tuple[Poller, CollectorRegistry]:
    settings = Settings(vm_name="vm0")
    imds, _, _ = scripted_imds(script, api_version=settings.api_version)
    registry = CollectorRegistry()
    state = CurrentState(Snapshot(vm_name="vm0", api_version=settings.api_version))
    metrics = Metrics(registry, state.get)
    sinks = FanOut([], on_error=lambda name: None)
    return Poller(imds, metrics, sinks, settings, state, clock=clock, store=store), registry


def test_a_fresh_sidecar_watches_from_its_first_read_and_exports_nothing_before() -> None:
    """No series before the first valid read; then the time of that read, which is also when the events of the
    first document were first seen (so an event Started there reads as not watched at all)."""
    clock = Clock(5000.0)
    polled, registry = poller([httpx.Response(500), doc(1, REBOOT), doc(1, REBOOT)], clock)
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) is None
    clock.now = 5010.0
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) == 5010.0
    assert polled.snapshot.records["e1"].first_seen == 5010.0
    clock.now = 5020.0
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) == 5010.0


def test_a_restart_with_its_state_continues_the_watch_and_one_without_starts_afresh(tmp_path: Path) -> None:
    """Restored state counts as watching: the sidecar that continues lifecycle.json exports the watch it saved;
    another IMDS endpoint's state, or none, starts a new watch at the first read."""
    clock = Clock(1000.0)
    first, _ = poller([doc(1)], clock, LifecycleStore(tmp_path, scope=SCOPE, clock=clock))
    first.poll_once()
    clock.now = 4600.0
    restarted, registry = poller([doc(1, REBOOT)], clock, LifecycleStore(tmp_path, scope=SCOPE, clock=clock))
    restarted.poll_once()
    assert registry.get_sample_value(WATCHING) == 1000.0
    elsewhere, registry = poller([doc(1)], clock, LifecycleStore(tmp_path, scope="http://other.test", clock=clock))
    elsewhere.poll_once()
    assert registry.get_sample_value(WATCHING) == 4600.0
    fresh, registry = poller([doc(1)], clock, LifecycleStore(tmp_path / "empty", scope=SCOPE, clock=clock))
    fresh.poll_once()
    assert registry.get_sample_value(WATCHING) == 4600.0


def test_a_gap_in_the_reads_starts_the_watch_again_and_the_state_keeps_it(tmp_path: Path) -> None:
    """Reads more than WATCH_GAP_SECONDS apart (IMDS unreadable meanwhile) may have missed an event's Scheduled
    phase: the watch starts again at the read after the gap, and lifecycle.json keeps the new start even though
    the document did not change, so a restart does not bring the old one back."""
    clock = Clock(1000.0)
    polled, registry = poller([doc(1), doc(1), httpx.Response(503), doc(1), doc(1)], clock,
                              LifecycleStore(tmp_path, scope=SCOPE, clock=clock))
    polled.poll_once()
    clock.now = 1000.0 + WATCH_GAP_SECONDS  # at the bound: still one watch
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) == 1000.0
    clock.now += 60
    polled.poll_once()  # failed
    clock.now += WATCH_GAP_SECONDS
    polled.poll_once()
    assert registry.get_sample_value(WATCHING) == clock.now
    restored = LifecycleStore(tmp_path, scope=SCOPE, clock=clock).restore()
    assert restored.watching_since == clock.now


@pytest.mark.parametrize("value", ["soon", True, [1], float("inf")])
def test_a_wrongly_typed_watch_in_the_state_file_is_ignored_with_the_file(tmp_path: Path, value: object,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Nothing in the file is trusted half-way: a watch that is not a finite number ignores the whole file."""
    LifecycleStore(tmp_path, clock=lambda: 1000.0).save({}, watching_since=10.0)
    data = json.loads((tmp_path / "lifecycle.json").read_text())
    data["watching_since"] = value
    (tmp_path / "lifecycle.json").write_text(json.dumps(data))
    restored = LifecycleStore(tmp_path, clock=lambda: 1000.0).restore()
    assert restored.watching_since is None and restored.records == {}
    assert "ignoring the lifecycle state file" in caplog.text


def test_the_watch_round_trips_with_the_records(tmp_path: Path) -> None:
    """What is saved is restored: the records and the watch; a file saved without a watch restores none."""
    event = parse_document(doc(1, REBOOT).content).events[0]
    records = {"E1": EventRecord(event, 100.0, started_at=100.0)}
    LifecycleStore(tmp_path, clock=lambda: 1000.0).save(records, watching_since=50.0)
    restored = LifecycleStore(tmp_path, clock=lambda: 1000.0).restore()
    facts = {k: (r.event, r.first_seen, r.started_at) for k, r in restored.records.items()}
    assert (facts, restored.watching_since) == ({"E1": (event, 100.0, 100.0)}, 50.0)
    LifecycleStore(tmp_path, clock=lambda: 1000.0).save(records)
    assert LifecycleStore(tmp_path, clock=lambda: 1000.0).restore().watching_since is None

