"""A full disk at every byte: the spool and the forward file accept a document whole or not at all, and refused
documents are kept in memory and written, in order, once space comes back (the injected half; tests/integration/
test_disk.py fills a real tmpfs)."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from se_exporter.sidecar.forwarding.envelope import Envelope, Sequencer
from se_exporter.sidecar.forwarding.forward import ForwardMetrics, ForwardSink
from se_exporter.sidecar.forwarding.forward_file import FileTarget, file_line
from se_exporter.sidecar.forwarding.spool import Spool
from tests.conftest import Reliability
from tests.support.fakes.disk import FullDisk
from tests.support.fakes.documents import change
from tests.support.fakes.targets import Refusing
from tests.support.helpers import wait_until

BODY = b'{"DocumentIncarnation": 3, "Events": []}'


def envelope(sequence: int, body: bytes = BODY) -> Envelope:
    return Envelope(sequence, f"0f8fad5b-d9cb-469f-a165-70867728950e:{sequence}", "vm", {"sequence": sequence}, body,
                    1000.0 + sequence)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def record_size(sequence: int) -> int:
    header = json.dumps(envelope(sequence).header(), separators=(",", ":")).encode()
    return 8 + len(header) + 1 + len(BODY)


def open_files_under(directory: Path) -> list[str]:
    """What this process holds open under ``directory`` (Linux: /proc/self/fd)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself used is gone already
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [target for target in targets if target.startswith(f"{directory}/")]


def test_a_closed_spool_holds_no_files_and_keeps_what_it_held(tmp_path: Path) -> None:
    """close() releases the spool's descriptors (segment and cursor); a spool opened later on the directory holds
    every document appended before."""
    spool = Spool(tmp_path, 1 << 20, segment_bytes=1)
    spool.append(envelope(1))
    spool.append(envelope(2))
    assert open_files_under(tmp_path)
    spool.close()
    assert open_files_under(tmp_path) == []
    reopened = Spool(tmp_path, 1 << 20)
    assert [e.sequence for e in reopened.peek(10)] == [1, 2]
    reopened.close()


@pytest.mark.parametrize("segment_bytes", [1 << 20, 1], ids=["same segment", "new segment"])
def test_spool_full_at_every_offset_leaves_it_as_it_was(tmp_path: Path, segment_bytes: int,
                                                        reliability: Reliability) -> None:
    """At every byte of a record where the disk can fill (a short write, then ENOSPC, or a failed fdatasync), append
    raises and the spool's files are byte for byte what they were; the next append and a restart lose nothing."""
    size = record_size(3)
    for room in [*range(size), size]:
        folder = tmp_path / f"{segment_bytes}-{room}"
        disk = FullDisk()
        dropped: list[int] = []
        spool = Spool(folder, 1 << 20, on_drop=dropped.append, segment_bytes=segment_bytes, disk=disk)
        spool.append(envelope(1))
        spool.append(envelope(2))
        before = snapshot(folder)
        disk.room, disk.fail_sync = room, room == size  # the whole record fits: then the sync fails
        with pytest.raises(OSError) as refused:
            spool.append(envelope(3))
        assert refused.value.errno == errno.ENOSPC
        assert snapshot(folder) == before, f"room {room}"
        assert (len(spool), spool.last_sequence) == (2, 2)
        disk.room, disk.fail_sync = float("inf"), False
        spool.append(envelope(3))  # the same document, retried once there is space
        spool.append(envelope(4))
        spool.close()  # 333 offsets: unclosed spools held 666 descriptors of the suite's process
        reopened = Spool(folder, 1 << 20, on_drop=dropped.append)
        assert [e.sequence for e in reopened.peek(10)] == [1, 2, 3, 4], f"room {room}"
        assert reopened.peek(10)[2] == envelope(3)
        reopened.close()
        assert dropped == []
    reliability("Forwarding", f"spool append cut short at every byte of a record ({size + 1} offsets; short write then "
                "ENOSPC, or a failed fdatasync), in the current segment and in a new one",
                "append refused and the caller told; the spool byte-identical to before; the document accepted "
                "whole when retried; nothing dropped after a restart")


def test_a_cut_back_that_fails_is_finished_before_the_next_append(tmp_path: Path) -> None:
    """If even the truncation after a failed write fails, the next append cuts the tail first, so no record ever
    sits behind garbage (today's cut-back measured from a wrong size extended the segment with zeros)."""
    disk = FullDisk()
    spool = Spool(tmp_path, 1 << 20, disk=disk)
    spool.append(envelope(1))
    disk.room, disk.fail_truncate = 30, 1
    with pytest.raises(OSError):
        spool.append(envelope(2))
    disk.fail_truncate = 1  # still failing at the next attempt: refused again, before writing anything
    with pytest.raises(OSError):
        spool.append(envelope(2))
    disk.room = float("inf")
    spool.append(envelope(2))
    dropped: list[int] = []
    assert [e.sequence for e in Spool(tmp_path, 1 << 20, on_drop=dropped.append).peek(10)] == [1, 2]
    assert dropped == []


def test_forward_file_full_at_every_offset_never_holds_a_refused_line(tmp_path: Path, reliability: Reliability) -> None:
    """At every byte of a line where the disk can fill, the file target raises and the file is unchanged: no line
    is both reported failed and written, and the next line starts on its own line."""
    metrics = ForwardMetrics(CollectorRegistry())
    line = file_line(envelope(2))
    for room in range(len(line) + 1):
        path = tmp_path / f"{room}.jsonl"
        disk = FullDisk()
        target = FileTarget(path, metrics, disk=disk)
        target.accept(envelope(1))
        before = path.read_bytes()
        disk.room, disk.fail_sync = room, room == len(line)
        with pytest.raises(OSError):
            target.accept(envelope(2))
        assert path.read_bytes() == before, f"room {room}"
        disk.room, disk.fail_sync = float("inf"), False
        target.accept(envelope(2))
        target.close(1)
        assert [json.loads(text)["sequence"] for text in path.read_text().splitlines()] == [1, 2]
    reliability("Forwarding", f"--forward-file line cut short at every byte ({len(line) + 1} offsets)",
                "line refused and counted, file unchanged; never a line both failed and written")


def test_a_torn_last_line_of_ours_is_cut_at_start_and_the_last_sequence_read(tmp_path: Path) -> None:
    """A line left incomplete by a crash was never accepted: removed when the file is opened again; the last whole
    line's sequence is what numbering must stay above."""
    path = tmp_path / "documents.jsonl"
    metrics = ForwardMetrics(CollectorRegistry())
    target = FileTarget(path, metrics)
    for sequence in (1, 2):
        target.accept(envelope(sequence))
    target.close(1)
    whole = path.read_bytes()
    path.write_bytes(whole + file_line(envelope(3))[:40])
    reopened = FileTarget(path, metrics)
    assert reopened.last_sequence == 2
    assert path.read_bytes() == whole
    reopened.close(1)
    other = tmp_path / "shared.log"
    other.write_bytes(b"someone else's text without a newline")
    shared = FileTarget(other, metrics)
    shared.accept(envelope(7))
    shared.close(1)
    assert other.read_bytes().splitlines()[1] == file_line(envelope(7)).rstrip(b"\n")


def forward_sink(tmp_path: Path, *targets: Refusing | FileTarget,
                 max_pending_bytes: int = 1 << 20) -> tuple[ForwardSink, CollectorRegistry]:
    registry = CollectorRegistry()
    return ForwardSink(Sequencer(tmp_path / "state"), targets, ForwardMetrics(registry),
                       max_pending_bytes=max_pending_bytes, retry_first=0.01, retry_max=0.05), registry


def test_refused_documents_are_retried_in_order_once_space_is_back(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                   reliability: Reliability) -> None:
    """Documents a full disk refused stay in memory, counted under disk_full, and are written in order without a
    new document to carry them; a healthy target is not held up; one log line when refusing, one when it recovers."""
    caplog.set_level(logging.INFO, "se_exporter")
    full, healthy = Refusing("file"), Refusing("eventhubs")
    healthy.open.set()
    sink, registry = forward_sink(tmp_path, full, healthy)
    for incarnation in (1, 2, 3):
        sink.on_change(change(b'{"DocumentIncarnation": %d, "Events": []}' % incarnation))
    wait_until(lambda: healthy.accepted == [1, 2, 3], what="the healthy target holding all three")
    assert full.accepted == []
    assert registry.get_sample_value("azure_scheduled_events_forward_pending_documents", {"sink": "file"}) == 3
    wait_until(lambda: (registry.get_sample_value("azure_scheduled_events_forward_errors_total",
                                                  {"sink": "file", "reason": "disk_full"}) or 0) >= 4,
               what="retries counted")
    full.open.set()  # space is back; IMDS says nothing new
    wait_until(lambda: "file accepts documents again" in caplog.text, what="the recovery logged")
    assert full.accepted == [1, 2, 3]
    assert registry.get_sample_value("azure_scheduled_events_forward_pending_documents", {"sink": "file"}) == 0
    refusals = [r for r in caplog.records if "refused document" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].exc_info is None
    sink.on_change(change(b'{"DocumentIncarnation": 4, "Events": []}'))
    wait_until(lambda: full.accepted == [1, 2, 3, 4], what="the fourth written after the three")
    sink.shutdown(1)
    reliability("Forwarding", "a target refusing documents (disk full) while another accepts them",
                "refused documents kept in memory, counted under reason disk_full, written in order once space "
                "came back without waiting for a new document; the other target unaffected; one log line each way")


def test_the_memory_queue_is_bounded_and_shutdown_says_what_is_lost(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Past its byte limit the queue gives up the oldest refused documents, counted and logged, never the newest;
    what is still refused when the sidecar stops is counted and logged as lost."""
    full = Refusing("file")
    bodies = [b'{"DocumentIncarnation": %3d, "Events": []}' % incarnation for incarnation in range(1, 11)]
    sink, registry = forward_sink(tmp_path, full, max_pending_bytes=3 * (len(bodies[0]) + 512))
    for body in bodies:
        sink.on_change(change(body))
    wait_until(lambda: registry.get_sample_value("azure_scheduled_events_forward_dropped_documents_total",
                                                 {"sink": "file"}) == 7, what="seven given up")
    assert registry.get_sample_value("azure_scheduled_events_forward_pending_documents", {"sink": "file"}) == 3
    with caplog.at_level(logging.ERROR):
        sink.shutdown(1)
    assert "never accepted 3 documents (document 8 to document 10)" in caplog.text
    assert registry.get_sample_value("azure_scheduled_events_forward_dropped_documents_total", {"sink": "file"}) == 10


def test_an_unwritable_state_directory_does_not_stop_forwarding(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                reliability: Reliability) -> None:
    """When forwarding.json cannot be saved, documents still reach the file with numbers kept in memory, one warning
    says so, and a restart numbers above what the file holds (the stale state file is not trusted alone)."""
    out = tmp_path / "out.jsonl"
    state = tmp_path / "state"
    registry = CollectorRegistry()
    sequencer = Sequencer(state)
    sink = ForwardSink(sequencer, [FileTarget(out, ForwardMetrics(registry))], ForwardMetrics(CollectorRegistry()))
    sink.on_change(change(b'{"DocumentIncarnation": 1, "Events": []}'))
    assert sink.force_flush(10_000)  # numbered and written: the state directory is left alone from now on
    saved = (state / "forwarding.json").read_bytes()
    (state / "forwarding.json").unlink()
    state.rmdir()  # from now on nothing can be saved there
    for incarnation in range(2, 9):
        sink.on_change(change(b'{"DocumentIncarnation": %d, "Events": []}' % incarnation))
    sink.shutdown(1)
    assert [json.loads(line)["sequence"] for line in out.read_text().splitlines()] == list(range(1, 9))
    assert caplog.text.count("cannot save") == 1 and "Traceback" not in caplog.text
    state.mkdir()
    (state / "forwarding.json").write_bytes(saved)  # the stale file: next_sequence 2
    restarted = Sequencer(state)
    restarted.advance_past(FileTarget(out, ForwardMetrics(CollectorRegistry())).last_sequence)
    assert restarted.next() == 9
    reliability("State", "state directory unwritable while --forward-file is elsewhere",
                "every document reached the file; one warning, no traceback; after a restart numbering continued "
                "above the file's last sequence")
