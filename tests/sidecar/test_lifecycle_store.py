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
    """What is saved is loaded back equal: the event as last listed, first seen, started at."""
    store = LifecycleStore(tmp_path)
    records = {"E1": EventRecord(EVENT, first_seen=100.5), "E2": EventRecord(
        ScheduledEvent("E2", "Reboot", "Started", None, (), None, None, None, None), 10.0, started_at=20.0)}
    store.save(records)
    assert LifecycleStore(tmp_path).load() == records


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
