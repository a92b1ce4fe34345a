"""A partition's platform side as a blob beside its VM state: its picture at a position, its judgement, and what
was counted.

``<ns>/<hub>/<group>/fleet-platform/<id>``, gzip'd JSON with named fields (``saved.py`` writes the picture)::

    {"format": 1, "partition_id": "3", "sequence_number": 4711,
     "picture": {"records": [...], "ids": [...], "forgotten": [...]},
     "counted": [{"key": ..., "statuses": ["Scheduled", ...], "impact": 600.0, "duplicates": 0,
                  "missed": {vm: reason, ...}, "lag": [vm, ...], "unannounced": false, "gone_at": null}, ...],
     "judged": {"keys": [key, ...], "vms": {key: {vm: {"missed": reason or null, "lag": seconds or null}, ...}},
                "listed": {key: event_type, ...}}}

``counted`` (its EventIds homed here: ``counting.COUNTING`` rule 2) keeps a restart or a hand-over from counting them
again; ``judged`` (``counting.COVERAGE``) is kept because an ended event keeps the coverage decided while it was
open, and IMDS no longer shows anything to decide it again from. Written like the VM state (never backwards,
ETag-conditional), before it and so before the checkpoint. Fields this release does not know are ignored. Reading
trusts nothing: bounded inflation, every row checked; a damaged blob is counted and the picture starts empty.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from typing import Any

from se_exporter.fleet.message import MAX_TEXT
from se_exporter.fleet.platform.counting import Counted, Verdict
from se_exporter.fleet.platform.coverage import MISSED_REASONS
from se_exporter.fleet.platform.fields import STATUSES
from se_exporter.fleet.platform.records import PictureState
from se_exporter.fleet.platform.saved import state_from_json, state_to_json
from se_exporter.fleet.stateformat import DamagedState, inflated

PLATFORM_FORMAT = 1
MAX_PLATFORM_BYTES = 256 * 1024**2  # inflated: 10,000 events naming 1,000 VMs each is about 200 MB


def platform_blob_name(namespace: str, eventhub_name: str, consumer_group: str, partition_id: str) -> str:
    """Beside the partition's VM state (``statestore.state_blob_name``)."""
    return f"{namespace}/{eventhub_name}/{consumer_group}/fleet-platform/{partition_id}".lower()


@dataclass(frozen=True)
class VmVerdicts:
    """What a partition's owner judged (``counting.COVERAGE`` rule 1): the EventIds it knew, per EventId the verdicts
    of its named VMs (only where there are any), and the unannounced EventIds its live VMs listed (their type)."""

    keys: frozenset[str]
    vms: dict[str, dict[str, Verdict]]
    listed: dict[str, str] = field(default_factory=dict)


NOT_JUDGED = VmVerdicts(frozenset(), {})


@dataclass
class PlatformBlob:
    """A platform blob read back (``state`` None: no picture stored)."""

    state: PictureState | None = None
    position: int | None = None
    memory: dict[str, Counted] = field(default_factory=dict)
    judged: VmVerdicts = NOT_JUDGED
    damaged: str | None = None
    problem: str = ""
    rows: int = 0  # rows left out as damaged


def encode_platform(partition_id: str, position: int, state: PictureState, memory: dict[str, Counted],
                    judged: VmVerdicts = NOT_JUDGED) -> bytes:
    obj: dict[str, Any] = {"format": PLATFORM_FORMAT, "partition_id": partition_id, "sequence_number": position,
                           "picture": state_to_json(state),
                           "counted": [entry.to_json(key) for key, entry in memory.items()]}
    if judged.keys or judged.listed:
        obj["judged"] = {"keys": sorted(judged.keys), "listed": judged.listed, "vms": {
            key: {name: {"missed": reason, "lag": lag} for name, (reason, lag) in verdicts.items()}
            for key, verdicts in judged.vms.items()}}
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return gzip.compress(text.encode("utf-8", "backslashreplace"), compresslevel=1)


def decode_platform(data: bytes, partition_id: str) -> PlatformBlob:
    """The blob's content; a blob that cannot be read at all is ``PlatformBlob(damaged=reason)``."""
    try:
        text, _size = next(inflated(data, MAX_PLATFORM_BYTES))  # one member: written as a single base
        obj = json.loads(text)
    except DamagedState as damage:
        return PlatformBlob(damaged=damage.reason, problem=str(damage))
    except (ValueError, RecursionError) as exc:
        return PlatformBlob(damaged="unreadable", problem=f"not gzip'd JSON ({str(exc)[:200]})")
    if not isinstance(obj, dict):
        return PlatformBlob(damaged="wrong_shape", problem="the platform state is not a JSON object")
    found, position = obj.get("format"), obj.get("sequence_number")
    if type(found) is not int or found < 1:
        return PlatformBlob(damaged="format", problem=f"unknown platform state format {str(found)[:40]!r}")
    if obj.get("partition_id", partition_id) != partition_id or type(position) is not int or position < -1:
        return PlatformBlob(damaged="wrong_shape",
                            problem="the platform state is another partition's, or has no position")
    state, rows = state_from_json(obj.get("picture"))
    counted = obj.get("counted")
    entries = [_counted(row) for row in counted] if isinstance(counted, list) else []
    memory = dict(entry for entry in entries if entry is not None)
    judged, damaged = _judged(obj.get("judged"))
    return PlatformBlob(state, position, memory, judged, rows=rows + entries.count(None) + damaged)


def _judged(judged: object) -> tuple[VmVerdicts, int]:
    """The judgement stored, and 1 if damaged: left out whole, since an EventId not judged is never ``no_sidecar``."""
    if not isinstance(judged, dict):
        return NOT_JUDGED, 0
    keys, vms, listed = judged.get("keys"), judged.get("vms"), judged.get("listed", {})
    if not (isinstance(keys, list) and all(_text(key) for key in keys) and isinstance(vms, dict) and all(
            _text(key) and isinstance(verdicts, dict) and all(_text(name) and _verdict(verdict) is not None
                                                              for name, verdict in verdicts.items())
            for key, verdicts in vms.items()) and isinstance(listed, dict)
            and all(_text(key) and _text(event_type) for key, event_type in listed.items())):
        return NOT_JUDGED, 1
    return VmVerdicts(frozenset(keys), {key: {name: _verdict(verdict) or (None, None)
                                              for name, verdict in verdicts.items()}
                                        for key, verdicts in vms.items()}, dict(listed)), 0


def _verdict(row: object) -> Verdict | None:
    """(reason, lag) of a stored verdict; None when damaged."""
    if not isinstance(row, dict):
        return None
    reason, lag = row.get("missed"), row.get("lag")
    if not (reason is None or reason in MISSED_REASONS) or not (lag is None or _count(lag, 1 - 2**53)):
        return None
    return reason, None if lag is None else float(lag)


def _counted(row: object) -> tuple[str, Counted] | None:
    if not isinstance(row, dict) or not _text(row.get("key")):
        return None
    statuses, missed, lag = row.get("statuses", []), row.get("missed", {}), row.get("lag", [])
    if not isinstance(statuses, list) or not all(status in STATUSES for status in statuses) \
            or not isinstance(lag, list) or not all(_text(name) for name in lag) or not isinstance(missed, dict) \
            or not all(_text(name) and reason in MISSED_REASONS for name, reason in missed.items()):
        return None
    impact, unannounced = row.get("impact", 0.0), row.get("unannounced", False)
    duplicates, gone_at = row.get("duplicates", 0), row.get("gone_at")
    if not _count(impact) or not _count(duplicates) or not isinstance(unannounced, bool) \
            or not (gone_at is None or _count(gone_at)):
        return None
    return row["key"], Counted(set(statuses), float(impact), dict(missed), set(lag), unannounced, int(duplicates),
                              None if gone_at is None else float(gone_at))


def _count(value: object, least: int = 0) -> bool:
    """A number from ``least`` to below 2**53, not a bool (NaN and infinities fail the comparisons)."""
    return type(value) in (int, float) and least <= value < 2**53  # type: ignore[operator]


def _text(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_TEXT
