"""Open lifecycles on disk: round trip, and a missing or corrupt file is logged and ignored."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

from se_exporter.core.lifecycle import EventRecord
from se_exporter.core.model import ScheduledEvent
from se_exporter.sidecar.lifecycle_store import LifecycleStore
from se_exporter.sidecar.sinks.spans import EventIdGenerator, SpanSink

EVENT = ScheduledEvent("E1", "Freeze", "Scheduled", "VirtualMachine", ("vm0", "vm1"),
                       datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc), "Live migration", "Platform", 5)


def test_records_round_trip(tmp_path: Path) -> None:
    """What is saved is loaded back equal: the event as last listed, first seen, started at (timestamps), the
    monotonic readings of both, counted on the clock of the process that loads them, and the pauses felt."""
    store = LifecycleStore(tmp_path, clock=lambda: 1000.0, monotonic=lambda: 50.0)
    records = {"E1": EventRecord(EVENT, first_seen=100.5, first_seen_elapsed=40.0), "E2": EventRecord(
        ScheduledEvent("E2", "Reboot", "Started", None, (), None, None, None, None), 10.0, started_at=20.0,
        first_seen_elapsed=20.0, started_elapsed=30.0, longest_pause=2.5, paused_seconds=3.75)}
    store.save(records)
    assert LifecycleStore(tmp_path, clock=lambda: 1000.0, monotonic=lambda: 50.0).load() == records
    moved = LifecycleStore(tmp_path, clock=lambda: 1000.0, monotonic=lambda: 7050.0).load()
    assert (moved["E2"].first_seen_elapsed, moved["E2"].started_elapsed) == (7020.0, 7030.0)


@pytest.mark.parametrize("wall_at_load", [1000.0 + 120, 1000.0 - 3600], ids=["forward", "stepped-back"])
def test_durations_across_a_restart_count_the_downtime_from_the_wall_clock_never_below_zero(
        tmp_path: Path, wall_at_load: float) -> None:
    """A restart (a reboot: the monotonic clock starts again) counts the time down on the wall clock, from the
    save to the load: a notice begun 10 s before a 120 s downtime is 130 s old at the load; a wall clock stepped back
    meanwhile counts the downtime as 0, never a negative notice."""
    LifecycleStore(tmp_path, clock=lambda: 1000.0, monotonic=lambda: 5000.0).save(
        {"E1": EventRecord(EVENT, first_seen=990.0, first_seen_elapsed=4990.0)})
    (loaded,) = LifecycleStore(tmp_path, clock=lambda: wall_at_load, monotonic=lambda: 3.0).load().values()
    assert loaded.first_seen == 990.0  # the timestamp as it was read
    assert loaded.first_seen_elapsed is not None
    assert 3.0 - loaded.first_seen_elapsed == (130.0 if wall_at_load > 1000.0 else 10.0)


def test_state_of_another_imds_endpoint_is_not_continued(tmp_path: Path) -> None:
    """Lifecycles saved while polling one endpoint are not ours when polling another."""
    LifecycleStore(tmp_path, scope="http://127.0.0.1:1").save({"E1": EventRecord(EVENT, first_seen=1.0)})
    assert LifecycleStore(tmp_path, scope="http://127.0.0.1:2").load() == {}
    assert LifecycleStore(tmp_path, scope="http://127.0.0.1:1").load() != {}


def test_state_older_than_a_day_is_not_continued(tmp_path: Path) -> None:
    """After 24 h without requests Scheduled Events is off: saved lifecycles describe an ended stream."""
    LifecycleStore(tmp_path, clock=lambda: 1_000.0).save({"E1": EventRecord(EVENT, first_seen=1.0)})
    assert LifecycleStore(tmp_path, clock=lambda: 1_000.0 + 23 * 3600).load() != {}
    assert LifecycleStore(tmp_path, clock=lambda: 1_000.0 + 25 * 3600).load() == {}


def test_missing_file_is_an_empty_start(tmp_path: Path) -> None:
    """No file yet: nothing to continue, no complaint."""
    assert LifecycleStore(tmp_path).load() == {}


@pytest.mark.parametrize("content", ["{not json", '{"version": 99, "records": []}', '{"version": 2}',
                                     '{"version": 2, "scope": "", "saved_at": 9e18, "records": [{"event": {}}]}'])
def test_corrupt_file_is_logged_and_ignored(tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture) -> None:
    """A damaged lifecycle file never stops the sidecar: it says so and starts afresh."""
    (tmp_path / "lifecycle.json").write_text(content)
    assert LifecycleStore(tmp_path).load() == {}
    assert "ignoring the lifecycle state file" in caplog.text


def test_corrupt_span_state_is_logged_and_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The span events file is optional too."""
    (tmp_path / "spans.json").write_text(json.dumps({"E1": [["scheduled", "not a time", {}]]}))
    ids = EventIdGenerator()
    SpanSink(TracerProvider(id_generator=ids), ids, tmp_path)
    assert "ignoring the span state file" in caplog.text
