"""Open lifecycles on disk, so that a restarted sidecar continues them instead of starting over.

Without this, a restart would see every listed event as new: ``scheduled`` counted twice, and an event already
``Started`` mistaken for a host failure with no notice. What is kept and what is ignored: docs/traces.md,
"Restarts". Nothing in a file is trusted half-way: a wrongly typed value taken in here would fail later, in a
scrape or a diff, far from its cause.

Each record keeps its timestamps (the wall clock's) and, for its durations, how long before the save each moment was
on the monotonic clock (``first_seen_ago``, ``started_ago``): no monotonic reading survives a reboot, so the time the
sidecar was down is the one duration read from the wall clock (the file's ``saved_at`` to now), never below zero.

The file also keeps since when this sidecar's lineage has been watching IMDS (``watching_since``) and when it last
read IMDS (``last_read``, on the wall clock and the monotonic one), so that the rules can tell an event first seen
Started after watching for an hour (a host failure) from one found Started at the first read (docs/alerting.md,
"Why an event first seen Started does not always page"). A restarted sidecar continues the watch only if its first
read comes within the allowed gap of ``last_read`` (``core/watch.py``): one stopped for an hour, while an event was
announced and started, starts a new watch, and that event warns instead of paging.

``last_read`` is written with the records, not on every poll: the file is rewritten when the document or the watch
changes, and on a quiet VM again once half the allowed gap has passed since the last write (every 30 s at the default
1 s poll: one small write for 30 reads; ``Poller._refresh_due``). So the recorded read is at most half a gap older
than the real last one: a restart's downtime is over-estimated by at most that, never under-estimated, and a
restart within half a gap always keeps the watch. (The file's own mtime would save the rewrite but is not evidence:
a copy of the directory, or a restore from a backup, makes it new.)
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from se_exporter.core.lifecycle import EventRecord
from se_exporter.core.model import event_from_json, event_to_json, json_kind
from se_exporter.core.watch import Read
from se_exporter.infra.files import StateFile, read_state_file

log = logging.getLogger("se_exporter.state")
VERSION = 2
# Scheduled Events switches itself off after 24 hours without a request, so older state describes a stream of
# events that has ended; continuing it would invent transitions.
MAX_AGE_SECONDS = 24 * 3600


def _time(value: Any, key: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(f"{key} is not a finite number")
    return float(value)


def _ago(value: Any, key: str) -> float:
    seconds = _time(value, key)
    if seconds < 0:
        raise ValueError(f"{key} is negative")
    return seconds


def records_from_json(items: Any, elapsed: float = 0.0) -> dict[str, EventRecord]:
    """The saved records; ``elapsed``: the monotonic clock's reading at the save, as this process counts (what each
    record's ``*_ago`` is counted back from)."""
    if not isinstance(items, list):
        raise ValueError("records is not a list")
    records: dict[str, EventRecord] = {}
    for item in items:
        if not isinstance(item, dict):
            raise ValueError("a record is not an object")
        event = event_from_json(item.get("event"))
        started_at = item.get("started_at")
        started = None if started_at is None else _time(started_at, "started_at")
        records[event.event_id] = EventRecord(
            event=event, first_seen=_time(item.get("first_seen"), "first_seen"), started_at=started,
            first_seen_elapsed=elapsed - _ago(item.get("first_seen_ago"), "first_seen_ago"),
            started_elapsed=None if started is None else elapsed - _ago(item.get("started_ago"), "started_ago"),
            longest_pause=_ago(item.get("longest_pause", 0.0), "longest_pause"),
            paused_seconds=_ago(item.get("paused_seconds", 0.0), "paused_seconds"))
    return records


def _since(reading: float | None, elapsed: float) -> float:
    """Seconds from a monotonic reading to ``elapsed`` (0 for a record made without one)."""
    return 0.0 if reading is None else max(0.0, elapsed - reading)


def _optional(value: Any, key: str) -> float | None:
    return None if value is None else _time(value, key)


@dataclass(frozen=True)
class Restored:
    """What a restart continues: the open lifecycles, since when the sidecar that saved them watched and when it last
    read IMDS (None: the file said nothing, or there was no file to continue: a fresh watch)."""

    records: dict[str, EventRecord] = field(default_factory=dict)
    watching_since: float | None = None
    last_read: Read | None = None


class LifecycleStore:
    """Saved state belongs to one IMDS endpoint (``scope``): another endpoint's lifecycles are not ours."""

    def __init__(self, state_dir: Path, scope: str = "", clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = state_dir / "lifecycle.json"
        self._scope = scope
        self._clock, self._monotonic = clock, monotonic  # the poller's: timestamps, and what durations count on
        self._file = StateFile(self.path, log, "cannot write the lifecycle state file %s: %s; open lifecycles will "
                               "not survive a restart until it can be written again",
                               "lifecycle state file %s written again")

    def load(self) -> dict[str, EventRecord]:
        return self.restore().records

    def restore(self) -> Restored:
        if not self.path.exists():
            return Restored()
        try:
            data = json.loads(read_state_file(self.path))
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {json_kind(data)}, not an object")
            if data.get("version") != VERSION:
                raise ValueError(f"unknown version {str(data.get('version'))[:40]!r}")
            scope, saved_at = data.get("scope"), _time(data.get("saved_at"), "saved_at")
            if not isinstance(scope, str):
                raise ValueError("scope is not a string")
            age = self._clock() - saved_at
            records = records_from_json(data.get("records"), self._monotonic() - max(0.0, age))
            watching_since = _optional(data.get("watching_since"), "watching_since")
            read = _optional(data.get("last_read"), "last_read")
            read_monotonic = _optional(data.get("last_read_monotonic"), "last_read_monotonic")
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("ignoring the lifecycle state file %s: %s", self.path, str(exc)[:300])
            return Restored()
        if scope != self._scope:
            log.info("not continuing lifecycles saved for another IMDS endpoint (%s)", scope)
            return Restored()
        if age > MAX_AGE_SECONDS:
            log.info("not continuing lifecycles saved %.0f hours ago", age / 3600)
            return Restored()
        if records:
            log.info("continuing %d open lifecycles from before the restart", len(records))
        return Restored(records, watching_since, None if read is None else Read(read, read_monotonic))

    def save(self, records: Mapping[str, EventRecord], watching_since: float | None = None,
             last_read: Read | None = None) -> bool:
        """Write the state; False (logged once) when it could not be written."""
        elapsed = self._monotonic()
        data = {"version": VERSION, "scope": self._scope, "saved_at": self._clock(),
                "watching_since": watching_since, "last_read": None if last_read is None else last_read.wall,
                "last_read_monotonic": None if last_read is None else last_read.monotonic, "records": [
                    {"event": event_to_json(r.event), "first_seen": r.first_seen, "started_at": r.started_at,
                     "first_seen_ago": _since(r.first_seen_elapsed, elapsed),
                     "started_ago": None if r.started_at is None else _since(r.started_elapsed, elapsed),
                     **({"longest_pause": r.longest_pause, "paused_seconds": r.paused_seconds}
                        if r.paused_seconds else {})}
                    for r in records.values()]}
        return self._file.save(json.dumps(data, separators=(",", ":")).encode(), make_parent=True)
