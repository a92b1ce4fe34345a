"""A durable, bounded, ordered on-disk queue of envelopes waiting for Event Hubs.

What it guarantees (accepted means on disk, a full disk, the layout and why segments): docs/forwarding.md,
"Delivery guarantees". The records are ``[length u32][crc32 u32][header JSON line][exact body bytes]``; ``acked``
is two 16-byte cursor slots ``[sequence u64][crc32 u32][pad]`` written alternately, so a torn write leaves the other.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from se_exporter.core.errors import SpoolError
from se_exporter.infra.files import DISK, Disk, write_all
from se_exporter.infra.host_os import HOST_OS
from se_exporter.sidecar.forwarding.envelope import Envelope

log = logging.getLogger("se_exporter.spool")
SUFFIX = ".seg"
ACKED = "acked"
_RECORD = struct.Struct(">II")  # payload length, CRC-32 of the payload
_SLOT = struct.Struct(">QI4x")  # cursor sequence, CRC-32 of the packed sequence; 16 bytes
MAX_SEGMENT_BYTES = 1 << 20


@dataclass(frozen=True)
class _Location:
    segment: int  # first sequence of the segment = its file name
    offset: int
    size: int  # the whole record, prefix included


class Spool:
    """The Event Hubs ``BatchProcessor``'s durable queue (``batching.Queue``): ``append`` returns once on disk."""

    durable = True

    def __init__(self, directory: Path, max_bytes: int, on_drop: Callable[[int], None] = lambda count: None,
                 segment_bytes: int | None = None, disk: Disk = DISK) -> None:
        self._dir = directory
        self._disk = disk
        self._max_bytes = max_bytes
        self._on_drop = on_drop
        # A small limit gets small segments, so that dropping the oldest documents also frees their disk space.
        self._segment_bytes = segment_bytes or max(1, min(MAX_SEGMENT_BYTES, max_bytes // 16))
        self._lock = threading.Lock()
        self._index: dict[int, _Location] = {}  # unacknowledged records, oldest first
        self._bytes = 0
        self._segments: dict[int, int] = {}  # segment -> records in it not yet acknowledged
        self._writer: int | None = None  # fd of the segment being appended to
        self._writer_segment = 0
        self._writer_size = 0
        self._torn = False  # a failed append could not be cut off yet: the writer's tail is beyond _writer_size
        self._cursor_error: str | None = None
        self._undeleted: set[int] = set()  # acknowledged segments still open somewhere (Windows): removed later
        # What the last ``peek`` handed out (being sent), and those of them trimmed meanwhile: counted as dropped
        # only if their send does not succeed (``release``), so a document is never both dropped and delivered.
        self._leased: set[int] = set()
        self._doomed: dict[int, None] = {}
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._acked_fd = os.open(directory / ACKED, os.O_RDWR | os.O_CREAT | HOST_OS.open_flags, 0o600)
            self._cursor, self._slot = self._read_cursor()  # the next write takes the other slot
            self._highest = self._cursor
            segments = sorted(directory.glob(f"*{SUFFIX}"))
            for path in segments:
                self._load_segment(path, newest=path == segments[-1])
        except (OSError, ValueError) as exc:
            raise SpoolError(directory, f"cannot use it ({exc})") from None
        if self._index:
            log.info("spool holds %d documents from before the restart", len(self._index))

    def __len__(self) -> int:
        return len(self._index)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def last_sequence(self) -> int:
        """The highest sequence ever held, acknowledged ones included, so numbering never goes back."""
        return self._highest

    def close(self) -> None:
        """Release the spool's open files; what it holds stays on disk for the next ``Spool`` of the directory."""
        with self._lock:
            for fd in (self._writer, self._acked_fd):
                if fd is not None and fd >= 0:
                    os.close(fd)
            self._writer, self._acked_fd = None, -1

    def append(self, envelope: Envelope) -> None:
        """Accept one envelope: on return it is on disk; on OSError nothing changed (see the module docstring)."""
        header = json.dumps(envelope.header(), separators=(",", ":")).encode()
        payload = header + b"\n" + envelope.body
        record = _RECORD.pack(len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            fd = self._writable(envelope.sequence)
            offset = self._writer_size
            try:
                write_all(self._disk, fd, record)
                self._disk.fdatasync(fd)
            except OSError:
                self._cut_back(fd, offset)
                raise
            self._writer_size += len(record)
            self._index[envelope.sequence] = _Location(self._writer_segment, offset, len(record))
            self._segments[self._writer_segment] = self._segments.get(self._writer_segment, 0) + 1
            self._bytes += len(record)
            self._highest = max(self._highest, envelope.sequence)
            dropped = self._trim()
        if dropped:
            log.warning("spool over %d bytes: dropped the %d oldest documents (sequences %d-%d)",
                        self._max_bytes, len(dropped), dropped[0], dropped[-1])
            self._on_drop(len(dropped))

    def peek(self, limit: int) -> list[Envelope]:
        """The oldest ``limit`` envelopes, in order; damaged records are dropped with a log line."""
        with self._lock:
            wanted = list(islice(self._index.items(), limit))
            self._leased = {sequence for sequence, _location in wanted}
        envelopes: list[Envelope] = []
        handles: dict[int, int] = {}
        try:
            for sequence, location in wanted:
                try:
                    fd = handles.get(location.segment)
                    if fd is None:
                        fd = handles[location.segment] = os.open(self._segment_path(location.segment),
                                                                 os.O_RDONLY | HOST_OS.open_flags)
                    envelopes.append(_decode(HOST_OS.pread(fd, location.size, location.offset)))
                except FileNotFoundError:
                    continue  # dropped meanwhile
                except (OSError, ValueError, KeyError) as exc:
                    log.error("spooled document %d is unreadable and is dropped: %s", sequence, exc)
                    self._acknowledge([sequence])
                    self._on_drop(1)
        finally:
            for fd in handles.values():
                os.close(fd)
        if self._undeleted:
            with self._lock:
                self._delete_segments()
        return envelopes

    def remove(self, envelopes: Iterable[Envelope]) -> None:
        """Acknowledge: delivered (or refused for good, and counted by the caller)."""
        self._acknowledge(envelope.sequence for envelope in envelopes)

    def _acknowledge(self, sequences: Iterable[int]) -> None:
        with self._lock:
            for sequence in sequences:
                self._forget(sequence)
                self._doomed.pop(sequence, None)  # trimmed while being sent, but delivered: not a drop
            self._advance_cursor()
            self._delete_segments()

    def release(self) -> None:
        """The send of what ``peek`` handed out is over: whatever of it was trimmed meanwhile and not acknowledged
        (``remove``) is lost now, and counted and logged as dropped."""
        with self._lock:
            doomed = list(self._doomed)
            self._doomed.clear()
            self._leased.clear()
        if doomed:
            log.warning("spool over %d bytes: dropped the %d oldest documents (sequences %d-%d) while they were "
                        "being sent, which did not succeed", self._max_bytes, len(doomed), doomed[0], doomed[-1])
            self._on_drop(len(doomed))

    # --- under the lock ---

    def _writable(self, sequence: int) -> int:
        if self._torn and self._writer is not None:  # the last failed append left bytes behind: cut them first
            self._disk.ftruncate(self._writer, self._writer_size)
            self._torn = False
        if self._writer is not None and self._writer_size >= self._segment_bytes:
            os.close(self._writer)
            self._writer = None
            if self._writer_segment not in self._segments:  # every record in it was acknowledged already
                self._delete_segment(self._writer_segment)
        if self._writer is None:
            path = self._segment_path(sequence)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | HOST_OS.open_flags, 0o600)
            try:
                HOST_OS.sync_directory(self._dir)  # the new segment's name is durable before anything in it counts
            except OSError:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise
            self._writer, self._writer_segment, self._writer_size = fd, sequence, 0
        return self._writer

    def _cut_back(self, fd: int, size: int) -> None:
        """Undo a failed append: the segment ends where it ended before, so no later record sits behind garbage.

        A segment this append created is removed again. If even the truncation fails, the writer remembers
        it and the next append truncates before writing (or fails the same way), never appending after it.
        """
        if size == 0 and self._writer_segment not in self._segments:
            os.close(fd)
            self._writer = None
            self._segment_path(self._writer_segment).unlink(missing_ok=True)
            return
        try:
            self._disk.ftruncate(fd, size)
        except OSError:
            self._torn = True

    def _forget(self, sequence: int) -> None:
        location = self._index.pop(sequence, None)
        if location is None:
            return
        self._bytes -= location.size
        left = self._segments[location.segment] - 1
        if left:
            self._segments[location.segment] = left
            return
        del self._segments[location.segment]
        if location.segment == self._writer_segment and self._writer is not None:
            return  # still being appended to: removed when it is full and rotated (see _writable)
        self._delete_segment(location.segment)

    def _advance_cursor(self) -> None:
        """Save the cursor; if the disk refuses, the next advance tries again (until then, after a restart,
        documents already acknowledged are sent again with their message ids: duplicates, never losses)."""
        oldest = next(iter(self._index), self._highest + 1)
        cursor = oldest - 1
        if cursor <= self._cursor:
            return
        slot = self._slot ^ 1
        try:
            HOST_OS.pwrite(self._acked_fd, _SLOT.pack(cursor, zlib.crc32(cursor.to_bytes(8, "big"))),
                            slot * _SLOT.size)
            HOST_OS.datasync(self._acked_fd)
        except OSError as exc:
            if self._cursor_error is None:
                log.warning("cannot save the spool cursor in %s: %s; acknowledged documents may be sent again "
                            "after a restart", self._dir / ACKED, exc.strerror or exc)
            self._cursor_error = str(exc)
            return
        if self._cursor_error is not None:
            log.info("spool cursor saved again in %s", self._dir / ACKED)
        self._cursor, self._slot, self._cursor_error = cursor, slot, None

    def _delete_segment(self, segment: int) -> None:
        """Remove a fully acknowledged segment; if the OS refuses because it is still open (Windows: ``peek`` in
        another thread, a scanner), it is tried again after the next ``remove`` or ``peek``, never lost track of."""
        try:
            HOST_OS.remove(self._segment_path(segment))
        except PermissionError:
            self._undeleted.add(segment)
        else:
            self._undeleted.discard(segment)

    def _delete_segments(self) -> None:
        for segment in sorted(self._undeleted):
            self._delete_segment(segment)

    def _trim(self) -> list[int]:
        """Drop the oldest until within the limit; with more than one record left, never the newest."""
        dropped: list[int] = []
        while self._bytes > self._max_bytes and len(self._index) > 1:
            oldest = next(iter(self._index))
            self._forget(oldest)
            if oldest in self._leased:
                self._doomed[oldest] = None  # counted by ``release`` unless its send succeeds
            else:
                dropped.append(oldest)
        if dropped:
            self._advance_cursor()
        return dropped

    # --- start-up ---

    def _read_cursor(self) -> tuple[int, int]:
        data = HOST_OS.pread(self._acked_fd, 2 * _SLOT.size, 0)
        best, best_slot = 0, 1
        for slot in (0, 1):
            chunk = data[slot * _SLOT.size:(slot + 1) * _SLOT.size]
            if len(chunk) == _SLOT.size:
                sequence, crc = _SLOT.unpack(chunk)
                if crc == zlib.crc32(sequence.to_bytes(8, "big")) and sequence >= best:
                    best, best_slot = sequence, slot
        return best, best_slot

    def _load_segment(self, path: Path, newest: bool) -> None:
        segment = int(path.stem)
        data = path.read_bytes()
        offset = kept = 0
        while offset + _RECORD.size <= len(data):
            length = _RECORD.unpack_from(data, offset)[0]
            end = offset + _RECORD.size + length
            if end > len(data):
                break
            try:
                sequence = _decode(data[offset:end]).sequence
            except (ValueError, KeyError) as exc:
                log.error("spool segment %s: a damaged record at byte %d is dropped: %s", path.name, offset, exc)
                self._on_drop(1)
                offset = end
                continue
            if sequence > self._cursor:
                self._index[sequence] = _Location(segment, offset, end - offset)
                self._bytes += end - offset
                kept += 1
            self._highest = max(self._highest, sequence)
            offset = end
        if offset < len(data):
            if newest:  # a write cut short by a crash: append() never returned, so it was never accepted
                log.info("spool segment %s: %d bytes of an incomplete write removed", path.name, len(data) - offset)
            else:  # only the newest segment is ever written to: this is damage, not a crash
                log.error("spool segment %s: its last %d bytes are unreadable and are dropped", path.name,
                          len(data) - offset)
                self._on_drop(1)
            os.truncate(path, offset)
        if kept:
            self._segments[segment] = kept
        else:
            self._delete_segment(segment)  # held open elsewhere (Windows): removed on a later pass

    def _segment_path(self, segment: int) -> Path:
        return self._dir / f"{segment:020d}{SUFFIX}"


def _decode(record: bytes) -> Envelope:
    if len(record) < _RECORD.size:
        raise ValueError("record cut short")
    length, crc = _RECORD.unpack_from(record)
    payload = record[_RECORD.size:_RECORD.size + length]
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise ValueError("checksum mismatch")
    header_line, _, body = payload.partition(b"\n")  # the header JSON line, then the body
    header = json.loads(header_line)
    return Envelope(sequence=int(header["sequence"]), message_id=str(header["message_id"]),
                    partition_key=str(header["partition_key"]), properties=dict(header["properties"]),
                    body=body, observed_at=float(header["observed_at"]))
