"""Open lifecycles on disk, so that a restarted sidecar continues them instead of starting over.

Without this, a restart would see every listed event as new: ``scheduled`` counted twice, and an event already
``Started`` mistaken for a host failure with no notice. What is kept and what is ignored: docs/traces.md,
"Restarts". Nothing in a file is trusted half-way: a wrongly typed value taken in here would fail later, in a
scrape or a diff, far from its cause.

The file also keeps since when this sidecar's lineage has been watching IMDS (``watching_since``): a sidecar that
continues the state continues the watch, so the rules can tell an event it first saw Started after watching for
an hour (a host failure) from one it found Started at its first read (docs/alerting.md, "Watched long enough").
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


def records_from_json(items: Any) -> dict[str, EventRecord]:
    if not isinstance(items, list):
        raise ValueError("records is not a list")
    records: dict[str, EventRecord] = {}
    for item in items:
        if not isinstance(item, dict):
            raise ValueError("a record is not an object")
        event = event_from_json(item.get("event"))
        started_at = item.get("started_at")
        records[event.event_id] = EventRecord(event=event, first_seen=_time(item.get("first_seen"), "first_seen"),
                                              started_at=None if started_at is None else _time(started_at,
                                                                                                "started_at"))
    return records


@dataclass(frozen=True)
class Restored:
    """What a restart continues: the open lifecycles, and since when the sidecar that saved them watched (None: the
    file said nothing, or there was no file to continue: a fresh watch)."""

    records: dict[str, EventRecord] = field(default_factory=dict)
    watching_since: float | None = None


class LifecycleStore:
    """Saved state belongs to one IMDS endpoint (``scope``): another endpoint's lifecycles are not ours."""

    def __init__(self, state_dir: Path, scope: str = "", clock: Callable[[], float] = time.time) -> None:
        self.path = state_dir / "lifecycle.json"
        self._scope = scope
        self._clock = clock
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
            records = records_from_json(data.get("records"))
            watching = data.get("watching_since")
            watching_since = None if watching is None else _time(watching, "watching_since")
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("ignoring the lifecycle state file %s: %s", self.path, str(exc)[:300])
            return Restored()
        if scope != self._scope:
            log.info("not continuing lifecycles saved for another IMDS endpoint (%s)", scope)
            return Restored()
        age = self._clock() - saved_at
        if age > MAX_AGE_SECONDS:
            log.info("not continuing lifecycles saved %.0f hours ago", age / 3600)
            return Restored()
        if records:
            log.info("continuing %d open lifecycles from before the restart", len(records))
        return Restored(records, watching_since)

    def save(self, records: Mapping[str, EventRecord], watching_since: float | None = None) -> None:
        data = {"version": VERSION, "scope": self._scope, "saved_at": self._clock(),
                "watching_since": watching_since, "records": [
                    {"event": event_to_json(r.event), "first_seen": r.first_seen, "started_at": r.started_at}
                    for r in records.values()]}
        self._file.save(json.dumps(data, separators=(",", ":")).encode(), make_parent=True)
