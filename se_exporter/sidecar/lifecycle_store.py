"""Open lifecycles on disk, so that a restarted sidecar continues them instead of starting over.

Without this, a restart would see every listed event as new: ``scheduled`` counted twice, and an event already
``Started`` mistaken for a host failure with no notice. What is kept and what is ignored: docs/traces.md,
"Restarts". Nothing in a file is trusted half-way: a wrongly typed value taken in here would fail later, in a
scrape or a diff, far from its cause.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from se_exporter.core.lifecycle import EventRecord
from se_exporter.core.model import ScheduledEvent, event_to_json, json_kind
from se_exporter.infra.files import StateFile, read_state_file

log = logging.getLogger("se_exporter.state")
VERSION = 2
# Scheduled Events switches itself off after 24 hours without a request, so older state describes a stream of
# events that has ended; continuing it would invent transitions.
MAX_AGE_SECONDS = 24 * 3600


def event_from_json(data: Any) -> ScheduledEvent:
    """The inverse of ``event_to_json``; ValueError for anything it could not have written."""
    if not isinstance(data, dict):
        raise ValueError("an event is not an object")
    not_before = _optional(data, "NotBefore", str)
    resources = data.get("Resources") or []
    if not isinstance(resources, list) or not all(isinstance(name, str) for name in resources):
        raise ValueError("Resources is not a list of strings")
    when = datetime.fromisoformat(not_before) if not_before else None
    if when is not None and when.tzinfo is None:
        raise ValueError("NotBefore has no time zone")
    duration = _optional(data, "DurationInSeconds", int)
    return ScheduledEvent(
        event_id=_required(data, "EventId"), event_type=_required(data, "EventType"),
        event_status=_required(data, "EventStatus"), resource_type=_optional(data, "ResourceType", str),
        resources=tuple(resources), not_before=when, description=_optional(data, "Description", str),
        event_source=_optional(data, "EventSource", str), duration_seconds=duration)


def _required(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} is not a non-empty string")
    return value


def _optional(data: Mapping[str, Any], key: str, kind: type[Any]) -> Any:
    value = data.get(key)
    if value is not None and (type(value) is not kind):  # type(), not isinstance(): True is not a duration
        raise ValueError(f"{key} is not a {kind.__name__}")
    return value


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
        if not self.path.exists():
            return {}
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
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("ignoring the lifecycle state file %s: %s", self.path, str(exc)[:300])
            return {}
        if scope != self._scope:
            log.info("not continuing lifecycles saved for another IMDS endpoint (%s)", scope)
            return {}
        age = self._clock() - saved_at
        if age > MAX_AGE_SECONDS:
            log.info("not continuing lifecycles saved %.0f hours ago", age / 3600)
            return {}
        if records:
            log.info("continuing %d open lifecycles from before the restart", len(records))
        return records

    def save(self, records: Mapping[str, EventRecord]) -> None:
        data = {"version": VERSION, "scope": self._scope, "saved_at": self._clock(), "records": [
            {"event": event_to_json(r.event), "first_seen": r.first_seen, "started_at": r.started_at}
            for r in records.values()]}
        self._file.save(json.dumps(data, separators=(",", ":")).encode(), make_parent=True)
