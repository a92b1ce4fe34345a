"""Open lifecycles on disk, so that a restarted sidecar continues them instead of starting over.

Without this, a restart would see every listed event as new: ``scheduled`` counted twice, and an
event already ``Started`` mistaken for a host failure with no notice. The file holds the records
of the last valid document (first seen, started at, the event as last listed); it is written
atomically after each document change. A missing or unreadable file is logged and ignored.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from se_exporter.files import write_atomically
from se_exporter.lifecycle import EventRecord
from se_exporter.model import ScheduledEvent

log = logging.getLogger("se_exporter.state")
VERSION = 2
# Scheduled Events switches itself off after 24 hours without a request, so older state describes a stream of
# events that has ended; continuing it would invent transitions.
MAX_AGE_SECONDS = 24 * 3600


def event_to_json(event: ScheduledEvent) -> dict[str, Any]:
    return {"EventId": event.event_id, "EventType": event.event_type, "EventStatus": event.event_status,
            "ResourceType": event.resource_type, "Resources": list(event.resources),
            "NotBefore": event.not_before.isoformat() if event.not_before else None,
            "Description": event.description, "EventSource": event.event_source,
            "DurationInSeconds": event.duration_seconds}


def event_from_json(data: Mapping[str, Any]) -> ScheduledEvent:
    not_before = data.get("NotBefore")
    return ScheduledEvent(
        event_id=str(data["EventId"]), event_type=str(data["EventType"]), event_status=str(data["EventStatus"]),
        resource_type=data.get("ResourceType"), resources=tuple(data.get("Resources") or ()),
        not_before=datetime.fromisoformat(not_before) if not_before else None,
        description=data.get("Description"), event_source=data.get("EventSource"),
        duration_seconds=data.get("DurationInSeconds"))


class LifecycleStore:
    """Saved state belongs to one IMDS endpoint (``scope``): another endpoint's lifecycles are not ours."""

    def __init__(self, state_dir: Path, scope: str = "", clock: Callable[[], float] = time.time) -> None:
        self.path = state_dir / "lifecycle.json"
        self._scope = scope
        self._clock = clock

    def load(self) -> dict[str, EventRecord]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            scope, saved_at = data["scope"], float(data["saved_at"])
            if scope != self._scope:
                log.info("not continuing lifecycles saved for another IMDS endpoint (%s)", scope)
                return {}
            age = self._clock() - saved_at
            if age > MAX_AGE_SECONDS:
                log.info("not continuing lifecycles saved %.0f hours ago", age / 3600)
                return {}
            records = {
                item["event"]["EventId"]: EventRecord(event=event_from_json(item["event"]),
                                                      first_seen=float(item["first_seen"]),
                                                      started_at=None if item.get("started_at") is None
                                                      else float(item["started_at"]))
                for item in data["records"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the lifecycle state file %s: %s", self.path, exc)
            return {}
        if records:
            log.info("continuing %d open lifecycles from before the restart", len(records))
        return records

    def save(self, records: Mapping[str, EventRecord]) -> None:
        data = {"version": VERSION, "scope": self._scope, "saved_at": self._clock(), "records": [
            {"event": event_to_json(r.event), "first_seen": r.first_seen, "started_at": r.started_at}
            for r in records.values()]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps(data, separators=(",", ":")).encode())
        except OSError as exc:
            log.warning("cannot write the lifecycle state file %s: %s", self.path, exc)
