"""State files of every shape: a damaged lifecycle.json, spans.json or forwarding.json is logged and ignored, never a
crash, and the forwarding sequence never goes back; one sidecar per state directory."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from se_exporter.core.lifecycle import EventRecord, diff
from se_exporter.core.model import ScheduledEvent, parse_document
from se_exporter.infra.dirlock import DirectoryBusy, lock_directory
from se_exporter.sidecar.forwarding.envelope import Sequencer
from se_exporter.sidecar.forwarding.spool import Spool
from se_exporter.sidecar.lifecycle_store import LifecycleStore
from se_exporter.sidecar.sinks import DocumentChange
from se_exporter.sidecar.sinks.spans import EventIdGenerator, SpanSink
from tests.conftest import Reliability
from tests.support.fakes.documents import envelope

EVENT = ScheduledEvent("E1", "Freeze", "Scheduled", "VirtualMachine", ("vm0",),
                       datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc), "Live migration", "Platform", 5)
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
INSTALLATION = "0f8fad5b-d9cb-469f-a165-70867728950e"
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=12)
WRONG_SHAPES = ["null", "[]", "[1, 2]", '"str"', "7", "true", "{}", "{not json", '{"version": 2', "\udcff",
                "[" * 100_000]


def valid_lifecycle(tmp_path: Path) -> dict[str, Any]:
    LifecycleStore(tmp_path, clock=lambda: 1000.0).save({"E1": EventRecord(EVENT, 100.0, started_at=None)})
    data: dict[str, Any] = json.loads((tmp_path / "lifecycle.json").read_text())
    return data


def mutations(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every field of a valid lifecycle file replaced by values of each wrong JSON type."""
    wrong: list[Any] = [None, True, -1, 1.5, "x", "", [], [1], {}, {"a": 1}, 10**30, float("nan")]
    paths = [("saved_at",), ("scope",), ("records",), ("records", 0), ("records", 0, "first_seen"),
             ("records", 0, "started_at"), ("records", 0, "event")]
    paths += [("records", 0, "event", key) for key in data["records"][0]["event"]]
    cases = []
    for path in paths:
        for value in wrong:
            mutated = json.loads(json.dumps(data))
            target = mutated
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            cases.append(("/".join(map(str, path)) + f"={value!r}", mutated))
    return cases


def assert_well_typed(records: dict[str, EventRecord], case: str = "") -> None:
    for event_id, record in records.items():
        assert isinstance(record, EventRecord), case
        event = record.event
        assert isinstance(event_id, str) and event_id == event.event_id, case
        assert isinstance(record.first_seen, float) and math.isfinite(record.first_seen), case
        assert record.started_at is None or (isinstance(record.started_at, float)
                                             and math.isfinite(record.started_at)), case
        assert all(isinstance(name, str) for name in event.resources), case
        assert event.not_before is None or event.not_before.tzinfo is not None, case
        assert event.duration_seconds is None or type(event.duration_seconds) is int, case
        for text in (event.event_type, event.event_status):
            assert isinstance(text, str) and text, case
        for optional in (event.resource_type, event.description, event.event_source):
            assert optional is None or isinstance(optional, str), case


@pytest.mark.parametrize("content", WRONG_SHAPES)
def test_lifecycle_file_of_any_shape_is_ignored(tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture) -> None:
    """null, a list, a string, a truncated object, bytes that are not UTF-8, deep nesting: logged, an empty start."""
    (tmp_path / "lifecycle.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    assert LifecycleStore(tmp_path).load() == {}
    assert "ignoring the lifecycle state file" in caplog.text


def test_every_wrongly_typed_field_of_a_lifecycle_file_is_ignored(tmp_path: Path, reliability: Reliability) -> None:
    """A valid file with any one field of the wrong JSON type loads as an empty start or as well-typed records:
    nothing wrongly typed gets through to fail later in a scrape or a diff."""
    data = valid_lifecycle(tmp_path)
    cases = mutations(data)
    for name, mutated in cases:
        (tmp_path / "lifecycle.json").write_text(json.dumps(mutated))
        records = LifecycleStore(tmp_path, clock=lambda: 1000.0).load()
        assert_well_typed(records, name)
        diff(records, parse_document(b'{"DocumentIncarnation": 1, "Events": []}'), 2000.0)  # usable, by name
    reliability("State", f"lifecycle.json of {len(WRONG_SHAPES)} wrong shapes (null, [], a string, truncated, not "
                f"UTF-8, deep nesting), {len(cases)} wrongly typed fields and generated JSON",
                "loaded as an empty start with one warning, never an exception; nothing wrongly typed taken in")


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(value=json_values)
def test_lifecycle_file_of_generated_json_never_raises(tmp_path: Path, value: Any) -> None:
    """Any JSON value at all, as the whole file or as the records, loads to well-typed records or nothing."""
    for content in (value, {"version": 2, "scope": "", "saved_at": 1000.0, "records": value}):
        (tmp_path / "lifecycle.json").write_text(json.dumps(content))
        assert_well_typed(LifecycleStore(tmp_path, clock=lambda: 1000.0).load())


SPAN_SHAPES = ["[1, 2]", "null", '"str"', '{"E1": 5}', '{"E1": [[1, 2]]}', '{"E1": [["x", 1.5, {}]]}',
               '{"E1": [["x", 1, {"a": {"b": 1}}]]}', '{"E1": [["x", 1, []]]}', "[" * 100_000]


@pytest.mark.parametrize("content", SPAN_SHAPES)
def test_span_file_of_any_shape_is_ignored_and_exports_go_on(tmp_path: Path, content: str,
                                                             caplog: pytest.LogCaptureFixture,
                                                             reliability: Reliability) -> None:
    """A damaged spans.json is one warning at start; every export afterwards works and ends spans."""
    (tmp_path / "spans.json").write_text(content)
    exporter = InMemorySpanExporter()
    ids = EventIdGenerator()
    provider = TracerProvider(id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = SpanSink(provider, ids, tmp_path)
    records: dict[str, EventRecord] = {}
    for when, raw in enumerate([b'{"DocumentIncarnation": 1, "Events": [{"EventId": "E1", "EventType": "Freeze", '
                                b'"EventStatus": "Scheduled", "NotBefore": ""}]}',
                                b'{"DocumentIncarnation": 2, "Events": []}']):
        document = parse_document(raw)
        step = diff(records, document, 1000.0 + when)
        records = step.records
        sink.on_change(DocumentChange(raw, document, step.transitions, step.records, 1000.0 + when, "vm0", None,
                                   "2020-07-01"))
    assert caplog.text.count("ignoring the span state file") == 1
    assert "scheduled_event" in {span.name for span in exporter.get_finished_spans()}
    reliability("State", f"spans.json of {len(SPAN_SHAPES)} wrong shapes", "one warning at start; every export "
                "afterwards ended its spans (before: a traceback at every export)")


FORWARDING_SHAPES = [*WRONG_SHAPES, '{"next_sequence": "abc"}', '{"installation_id": "x"}',
                     *(f'{{"installation_id": "{INSTALLATION}", "next_sequence": {value}}}'
                       for value in ("true", "0", "1e400", str(10**30), "1.5", '"7"', "null"))]


@pytest.mark.parametrize("content", FORWARDING_SHAPES)
def test_damaged_forwarding_state_starts_a_new_installation_above_the_spool(tmp_path: Path, content: str,
                                                                             caplog: pytest.LogCaptureFixture,
                                                                             reliability: Reliability) -> None:
    """A damaged forwarding.json is logged naming the file; a new installation id means no message id can repeat,
    and numbering continues above what the spool holds."""
    spool = Spool(tmp_path / "spool", 1 << 20)
    for sequence in (40, 41):
        spool.append(envelope(sequence))
    spool.remove([envelope(40)])
    (tmp_path / "forwarding.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    sequencer = Sequencer(tmp_path)
    sequencer.advance_past(Spool(tmp_path / "spool", 1 << 20).last_sequence)
    assert UUID.match(sequencer.installation_id) and sequencer.installation_id != INSTALLATION
    assert sequencer.next() == 42
    assert f"ignoring the damaged forwarding state file {tmp_path / 'forwarding.json'}" in caplog.text
    saved = json.loads((tmp_path / "forwarding.json").read_text())
    assert saved == {"installation_id": sequencer.installation_id, "next_sequence": 43}
    reliability("State", f"forwarding.json of {len(FORWARDING_SHAPES)} wrong shapes or values (null, a string, "
                '{"next_sequence": "abc"}, truncated, 1e400, ...)', "logged naming the file; a new installation "
                "id, so no message id can repeat; numbering went on above the spool's last sequence")


def test_a_valid_forwarding_state_is_kept(tmp_path: Path) -> None:
    """The check is not over-eager: a file the sequencer wrote is continued as before."""
    (tmp_path / "forwarding.json").write_text(json.dumps({"installation_id": INSTALLATION, "next_sequence": 17}))
    sequencer = Sequencer(tmp_path)
    assert (sequencer.installation_id, sequencer.next()) == (INSTALLATION, 17)


def test_an_unreadable_forwarding_state_names_the_file(tmp_path: Path) -> None:
    """A state file that cannot be read at all (here: a folder in its place) stops start-up naming that file."""
    (tmp_path / "forwarding.json").mkdir()
    with pytest.raises(Exception, match=re.escape(f"cannot read {tmp_path / 'forwarding.json'}")):
        Sequencer(tmp_path)


def test_a_second_lock_on_a_directory_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    """The lock is exclusive and says who holds it; released, it can be taken again."""
    with lock_directory(tmp_path):
        with pytest.raises(DirectoryBusy) as busy:
            lock_directory(tmp_path)
        assert busy.value.pid == os.getpid()
    lock_directory(tmp_path).close()


def test_ignoring_is_logged_once_not_per_document(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A lifecycle file that cannot be written is one warning and, once it can, one info line: not one per save."""
    caplog.set_level(logging.INFO, "se_exporter")
    folder = tmp_path / "state"
    store = LifecycleStore(folder)
    store.save({})
    os.rename(folder, tmp_path / "away")
    (tmp_path / "state").write_text("a file where the folder was")
    for _ in range(5):
        store.save({"E1": EventRecord(EVENT, 1.0)})
    (tmp_path / "state").unlink()
    os.rename(tmp_path / "away", folder)
    store.save({})
    assert caplog.text.count("cannot write the lifecycle state file") == 1
    assert caplog.text.count("lifecycle.json written again") == 1


def _in_time(load: Any) -> Any:
    """Run ``load`` in a thread and fail, instead of hanging the suite, if it has not returned within 10 s."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(load())
        except BaseException as error:  # handed to the test's thread
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the load blocked"
    if errors:
        raise errors[0]
    return result[0]


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_a_state_file_that_is_not_a_regular_file_is_refused_without_blocking_or_reading_for_ever(
        tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """A FIFO in place of a state file blocked start-up for ever; a link to /dev/zero read 2.5 GB in 4 s. Now the
    lifecycle and span files are logged and ignored, and the sequence file stops start-up naming the file."""
    for name in ("lifecycle.json", "spans.json", "forwarding.json"):
        if kind == "fifo":
            os.mkfifo(tmp_path / name)
        else:
            (tmp_path / name).symlink_to("/dev/zero")
    assert _in_time(LifecycleStore(tmp_path).load) == {}
    assert "ignoring the lifecycle state file" in caplog.text and "not a regular file" in caplog.text
    provider = TracerProvider()
    _in_time(lambda: SpanSink(provider, EventIdGenerator(), tmp_path))
    assert "ignoring the span state file" in caplog.text
    with pytest.raises(Exception, match=re.escape(f"cannot read {tmp_path / 'forwarding.json'} (not a regular file)")):
        _in_time(lambda: Sequencer(tmp_path))
