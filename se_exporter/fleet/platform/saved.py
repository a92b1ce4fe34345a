"""A platform picture as JSON with named fields, and back: what ``saving.py`` writes beside the checkpoint.

Named fields only, so a newer release can add one and an older one ignores it. Reading back trusts nothing (a
state blob is outside input too): a row of the wrong shape is left out and counted, never fatal, and every string
goes through the reader's checks and bounds (``fields.py``), so what is restored is what the reader could have kept.
"""

from __future__ import annotations

import math
from typing import Any

from se_exporter.core.model import event_key
from se_exporter.fleet.message import MAX_TEXT, MAX_TIME
from se_exporter.fleet.platform.fields import STATUSES, kept_text
from se_exporter.fleet.platform.reader import MAX_DESCRIPTION, SCOPE_TYPES, PlatformEvent
from se_exporter.fleet.platform.records import ENDED, MAX_COPIES, RANK, PictureState, PlatformRecord

_TEXT = ("grid_id", "event_id", "event_type", "event_source", "resource_type", "scope_name", "subscription_id",
         "resource_group", "location", "description", "schema")
_SAVED = (*_TEXT, "event_status", "scope_type", "event_time", "not_before", "duration_seconds")  # and resources


def state_to_json(state: PictureState) -> dict[str, Any]:
    return {"records": [record_to_json(record) for record in state.records],
            "ids": [{"id": grid_id, "at": at} for grid_id, at in state.ids],
            "forgotten": [{"key": key, "at": at} for key, at in state.forgotten]}


def record_to_json(record: PlatformRecord) -> dict[str, Any]:
    event = record.event
    return {**{name: getattr(event, name) for name in _SAVED}, "resources": list(event.resources),
            "times": dict(record.times), "ended_at": record.ended_at, "changed_at": record.changed_at,
            "copies": dict(record.copies)}


def state_from_json(obj: object) -> tuple[PictureState, int]:
    """The state in ``obj`` and how many rows were left out as damaged."""
    if not isinstance(obj, dict):
        return PictureState(), 1
    records: list[PlatformRecord] = []
    damaged = sum(name in obj and not isinstance(obj[name], list) for name in ("records", "ids", "forgotten"))
    for row in _rows(obj, "records"):
        try:
            records.append(record_from_json(row))
        except ValueError:
            damaged += 1
    pairs = {"ids": "id", "forgotten": "key"}
    remembered: dict[str, list[tuple[str, float]]] = {name: [] for name in pairs}
    for name, field in pairs.items():
        for row in _rows(obj, name):
            text = row.get(field) if isinstance(row, dict) else None
            try:
                if not (isinstance(text, str) and 0 < len(text) <= MAX_TEXT and kept_text(text, MAX_TEXT) == text):
                    raise ValueError(field)
                remembered[name].append((text, _time(row, "at")))
            except ValueError:
                damaged += 1
    return PictureState(tuple(records), tuple(remembered["ids"]), tuple(remembered["forgotten"])), damaged


def record_from_json(row: object) -> PlatformRecord:
    """One record; ValueError naming the field when the row is damaged."""
    if not isinstance(row, dict):
        raise ValueError("a record is not an object")
    texts = {name: _text(row, name) for name in _TEXT}
    status, scope_type = row.get("event_status"), row.get("scope_type")
    if status not in STATUSES or scope_type not in SCOPE_TYPES or not texts["event_id"].strip():
        raise ValueError("event_status, scope_type or event_id")
    event = PlatformEvent(**texts, key=event_key(texts["event_id"]), event_status=str(status),
                          resources=_resources(row), scope_type=str(scope_type),
                          event_time=_time(row, "event_time"), not_before=_optional_time(row, "not_before"),
                          duration_seconds=_number(row, "duration_seconds"))
    changed_at = _time(row, "changed_at")
    # ended_at is set exactly when the status is an end (retention counts from it), as the picture sets it
    ended_at = _optional_time(row, "ended_at", changed_at) if event.event_status in ENDED else None
    return PlatformRecord(event, _times(row, event.event_status), ended_at, changed_at, _copies(row.get("copies", {})))


def _copies(copies: object) -> tuple[tuple[str, int], ...]:
    """Deliveries per message: up to MAX_COPIES ids, each a positive count."""
    if not isinstance(copies, dict) or len(copies) > MAX_COPIES or not all(
            isinstance(seen, str) and 0 < len(seen) <= 64 and type(count) is int and 0 < count < 2**31
            for seen, count in copies.items()):
        raise ValueError("copies")
    return tuple(sorted(copies.items()))


def _resources(row: dict[str, Any]) -> tuple[str, ...]:
    resources = row.get("resources")
    if not isinstance(resources, list) or not all(isinstance(name, str) and name.strip() for name in resources):
        raise ValueError("resources")
    distinct: dict[str, str] = {}  # as the reader keeps them: one per name without case, the first spelling
    for name in resources:
        distinct.setdefault(name.casefold(), kept_text(name, MAX_TEXT))
    if any(len(name) > MAX_TEXT for name in distinct.values()):
        raise ValueError("resources")
    return tuple(distinct.values())


def _times(row: dict[str, Any], status: str) -> tuple[tuple[str, float], ...]:
    times = row.get("times")
    if not isinstance(times, dict) or not times or any(known not in STATUSES for known in times):
        raise ValueError("times")
    if status not in times or any(RANK[known] > RANK[status] for known in times):
        raise ValueError("event_status is not the furthest status of times")  # statuses only move forward
    return tuple((known, _time(times, known)) for known in STATUSES if known in times)


def _rows(obj: dict[str, Any], name: str) -> list[Any]:
    rows = obj.get(name)
    return rows if isinstance(rows, list) else []


def _text(row: dict[str, Any], name: str) -> str:
    """A string field within the reader's bound for it (label values: ``MAX_TEXT``)."""
    value = row.get(name, "")
    limit = MAX_DESCRIPTION if name == "description" else MAX_TEXT
    text = kept_text(value, limit) if isinstance(value, str) else None
    if text is None or len(text) > limit:
        raise ValueError(name)
    return text


def _number(row: dict[str, Any], name: str) -> float | None:
    value = row.get(name)
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value) or abs(value) >= 2**63:  # a bool is not one
        raise ValueError(name)
    return float(value)


def _time(row: dict[str, Any], name: str) -> float:
    """A unix time below 2200 (0 allowed: a clock passed in by tests may start there)."""
    value = _number(row, name)
    if value is None or not 0 <= value < MAX_TIME:
        raise ValueError(name)
    return value


def _optional_time(row: dict[str, Any], name: str, missing: float | None = None) -> float | None:
    return missing if row.get(name) is None else _time(row, name)
