"""The durable spool: order, durability, the size limit, the cursor, damaged and incomplete records."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from se_exporter.sidecar.forwarding.spool import Spool
from tests.support.fakes.documents import envelope


def test_spool_keeps_order_across_reopen(tmp_path: Path) -> None:
    """What was appended is read back oldest first, also by a new Spool on the same folder (a restart)."""
    spool = Spool(tmp_path, 1 << 20)
    for sequence in (1, 2, 3):
        spool.append(envelope(sequence))
    reopened = Spool(tmp_path, 1 << 20)
    assert [e.sequence for e in reopened.peek(10)] == [1, 2, 3]
    assert reopened.peek(1)[0] == envelope(1)
    reopened.remove(map(envelope, [1, 2]))
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [3]
    assert reopened.last_sequence == 3


def test_spool_appends_are_on_disk_before_returning(tmp_path: Path) -> None:
    """append() leaves a complete, checksummed record in the segment, so a kill -9 right after loses nothing."""
    Spool(tmp_path, 1 << 20).append(envelope(5, b"{}"))
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000005.seg", "acked"]
    data = (tmp_path / "00000000000000000005.seg").read_bytes()
    length, crc = struct.unpack(">II", data[:8])
    assert len(data) == 8 + length and zlib.crc32(data[8:]) == crc
    assert data.endswith(b"\n{}")
    assert Spool(tmp_path, 1 << 20).peek(10) == [envelope(5, b"{}")]


def test_full_spool_drops_the_oldest_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Past the byte limit the oldest documents go, with a count and a log line; the newest always stays."""
    dropped: list[int] = []
    spool = Spool(tmp_path, 1500, on_drop=dropped.append)
    for sequence in range(1, 11):
        spool.append(envelope(sequence, b"x" * 200))
    kept = [e.sequence for e in spool.peek(100)]
    assert kept[-1] == 10 and kept == list(range(kept[0], 11))
    assert spool.size_bytes <= 1500
    assert sum(dropped) == 10 - len(kept)
    assert "dropped the" in caplog.text
    assert [e.sequence for e in Spool(tmp_path, 1500).peek(100)] == kept  # dropped stays dropped after a restart
    on_disk = sum(path.stat().st_size for path in tmp_path.glob("*.seg"))
    assert on_disk <= 1500 + 1500 // 16 + 400  # the limit, plus at most one partly dropped small segment


@pytest.mark.parametrize("delivered", [True, False])
def test_documents_trimmed_while_being_sent_count_as_dropped_only_if_the_send_fails(tmp_path: Path,
                                                                                     delivered: bool) -> None:
    """The oldest documents may be trimmed while a send holds them: delivered, they are not counted as dropped
    (a document is never both); not delivered, they are, once the send is over."""
    dropped: list[int] = []
    spool = Spool(tmp_path, 1500, on_drop=dropped.append)
    for sequence in (1, 2, 3):
        spool.append(envelope(sequence, b"x" * 200))
    sending = spool.peek(2)
    for sequence in range(4, 11):  # the outage goes on: the spool fills past its limit while 1 and 2 are in flight
        spool.append(envelope(sequence, b"x" * 200))
    trimmed = 10 - len(spool)  # the oldest ones, 1 and 2 among them
    assert [e.sequence for e in sending] == [1, 2] and trimmed > 2
    assert sum(dropped) == trimmed - 2  # 1 and 2 are not counted while their send may still succeed
    if delivered:
        spool.remove(sending)
    spool.release()
    assert sum(dropped) == trimmed - (2 if delivered else 0)
    assert [e.sequence for e in spool.peek(100)] == list(range(trimmed + 1, 11))


def test_acknowledged_segments_are_removed_and_numbering_never_goes_back(tmp_path: Path) -> None:
    """Segments go once every record in them is acknowledged; an empty spool still knows the last sequence."""
    spool = Spool(tmp_path, 1 << 20, segment_bytes=300)
    for sequence in range(1, 11):
        spool.append(envelope(sequence, b"x" * 200))
    assert len(list(tmp_path.glob("*.seg"))) == 10  # each record fills a 300-byte segment
    spool.remove(map(envelope, range(1, 6)))
    assert sorted(int(path.stem) for path in tmp_path.glob("*.seg")) == [6, 7, 8, 9, 10]
    spool.remove(map(envelope, range(6, 11)))
    assert len(spool) == 0 and spool.size_bytes == 0
    # The segment being appended to stays until it is full: no file is created and deleted per document.
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000010.seg", "acked"]
    spool.append(envelope(11, b"x" * 200))  # segment 10 is full: rotated, and deleted as all of it is acknowledged
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000011.seg", "acked"]
    spool.remove([envelope(11)])
    reopened = Spool(tmp_path, 1 << 20)
    assert len(reopened) == 0 and reopened.last_sequence == 11
    assert os.listdir(tmp_path) == ["acked"]  # a fully acknowledged segment found at start is removed


def test_records_at_or_below_the_cursor_are_not_sent_again(tmp_path: Path) -> None:
    """The cursor survives a restart even while the segment holding acknowledged records is still there."""
    spool = Spool(tmp_path, 1 << 20)
    for sequence in (1, 2, 3):
        spool.append(envelope(sequence))
    spool.remove(map(envelope, [1, 2]))
    assert len(list(tmp_path.glob("*.seg"))) == 1  # record 3 keeps the segment
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [3]


def test_a_torn_cursor_write_falls_back_to_the_older_cursor(tmp_path: Path) -> None:
    """A damaged cursor slot means a few documents are resent (same message ids), never that any is lost."""
    spool = Spool(tmp_path, 1 << 20)
    for sequence in (1, 2, 3, 4):
        spool.append(envelope(sequence))
    spool.remove([envelope(1)])
    spool.remove([envelope(2)])  # written to the other slot
    acked = bytearray((tmp_path / "acked").read_bytes())
    newest = 0 if struct.unpack(">Q", acked[:8])[0] == 2 else 16
    acked[newest + 9] ^= 0xFF  # its checksum no longer matches
    (tmp_path / "acked").write_bytes(bytes(acked))
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [2, 3, 4]


def test_damaged_record_is_dropped_visibly(tmp_path: Path) -> None:
    """A damaged record does not block the queue: it is dropped and counted, the rest flows."""
    dropped: list[int] = []
    spool = Spool(tmp_path, 1 << 20, on_drop=dropped.append)
    spool.append(envelope(1))
    spool.append(envelope(2))
    segment = tmp_path / "00000000000000000001.seg"
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF  # inside record 1's header
    segment.write_bytes(bytes(data))
    assert [e.sequence for e in spool.peek(10)] == [2]
    assert dropped == [1]
    reopened: list[int] = []
    assert [e.sequence for e in Spool(tmp_path, 1 << 20, on_drop=reopened.append).peek(10)] == [2]


def test_an_incomplete_write_is_cut_off_and_later_appends_survive(tmp_path: Path) -> None:
    """A record cut short by a crash was never accepted: it is removed at start, and what follows is readable."""
    spool = Spool(tmp_path, 1 << 20)
    spool.append(envelope(1))
    spool.append(envelope(2))
    segment = tmp_path / "00000000000000000001.seg"
    whole = segment.stat().st_size
    with segment.open("ab") as handle:
        handle.write(struct.pack(">II", 500, 0) + b'{"sequence":3')
    reopened = Spool(tmp_path, 1 << 20)
    assert len(reopened) == 2 and segment.stat().st_size == whole
    reopened.append(envelope(3))
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [1, 2, 3]


def test_a_failed_write_leaves_no_half_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """append() that fails (disk full, I/O error) raises and leaves the segment as it was for the next append."""
    spool = Spool(tmp_path, 1 << 20)
    spool.append(envelope(1))
    real = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        spool.append(envelope(2))
    monkeypatch.setattr(os, "fdatasync", real)
    spool.append(envelope(3))
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [1, 3]
