"""A durable, bounded, ordered on-disk queue of envelopes waiting for Event Hubs.

One file per envelope, named by its sequence number, written atomically and fsynced before
``append`` returns: a document counts as accepted only once it is on disk, so it survives an Event
Hubs outage and a ``kill -9`` alike. The forwarder reads the oldest first and removes only what
Event Hubs acknowledged (at-least-once). Past ``max_bytes`` the oldest envelopes are dropped,
counted and logged: never silently, and never the newest.

File layout: ``<sequence:020d>.env`` = one line of JSON header, then the exact body bytes.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from se_exporter.errors import ConfigError
from se_exporter.files import fsync_dir, write_atomically
from se_exporter.sinks.envelope import Envelope

log = logging.getLogger("se_exporter.spool")
SUFFIX = ".env"


class Spool:
    def __init__(self, directory: Path, max_bytes: int, on_drop: Callable[[int], None] = lambda count: None) -> None:
        self._dir = directory
        self._max_bytes = max_bytes
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        self.changed = threading.Condition(self._lock)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for path in directory.glob(f"*{SUFFIX}"):
                self._sizes[int(path.stem)] = path.stat().st_size
            for leftover in directory.glob(".*.env.*"):
                leftover.unlink()  # a temp file from a write that never completed: never accepted
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--spool-dir {directory}: cannot use it ({exc})") from None
        if self._sizes:
            log.info("spool holds %d documents from before the restart", len(self._sizes))

    @property
    def count(self) -> int:
        return len(self._sizes)

    @property
    def size_bytes(self) -> int:
        return sum(self._sizes.values())

    @property
    def last_sequence(self) -> int:
        return max(self._sizes, default=0)

    def append(self, envelope: Envelope) -> None:
        header = json.dumps(envelope.header(), separators=(",", ":")).encode()
        path = self._path(envelope.sequence)
        write_atomically(path, header + b"\n" + envelope.body)
        with self._lock:
            self._sizes[envelope.sequence] = path.stat().st_size
            dropped = self._trim()
            self.changed.notify_all()
        if dropped:
            log.warning("spool over %d bytes: dropped the %d oldest documents (sequences %d-%d)",
                        self._max_bytes, len(dropped), dropped[0], dropped[-1])
            self._on_drop(len(dropped))

    def peek(self, limit: int) -> list[Envelope]:
        """The oldest ``limit`` envelopes, in order; unreadable files are dropped with a log line."""
        with self._lock:
            sequences = sorted(self._sizes)[:limit]
        envelopes = []
        for sequence in sequences:
            try:
                envelopes.append(self._read(sequence))
            except FileNotFoundError:
                continue  # trimmed meanwhile
            except (OSError, ValueError, KeyError) as exc:
                log.error("spooled document %d is unreadable and is dropped: %s", sequence, exc)
                self.remove([sequence])
                self._on_drop(1)
        return envelopes

    def remove(self, sequences: Iterable[int]) -> None:
        with self._lock:
            for sequence in sequences:
                self._sizes.pop(sequence, None)
                self._path(sequence).unlink(missing_ok=True)
        fsync_dir(self._dir)

    def wait(self, timeout: float) -> None:
        """Block until something is appended or ``timeout`` passes."""
        with self._lock:
            if not self._sizes:
                self.changed.wait(timeout)

    def _trim(self) -> list[int]:
        """Drop the oldest until within the limit; with more than one file left, the oldest is never the newest."""
        dropped: list[int] = []
        total = sum(self._sizes.values())
        while total > self._max_bytes and len(self._sizes) > 1:
            oldest = min(self._sizes)
            total -= self._sizes.pop(oldest)
            self._path(oldest).unlink(missing_ok=True)
            dropped.append(oldest)
        return dropped

    def _read(self, sequence: int) -> Envelope:
        data = self._path(sequence).read_bytes()
        header_line, _, body = data.partition(b"\n")
        header = json.loads(header_line)
        return Envelope(sequence=int(header["sequence"]), message_id=str(header["message_id"]),
                        partition_key=str(header["partition_key"]), properties=dict(header["properties"]),
                        body=body, observed_at=float(header["observed_at"]))

    def _path(self, sequence: int) -> Path:
        return self._dir / f"{sequence:020d}{SUFFIX}"
