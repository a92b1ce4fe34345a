"""The fields of a platform event, each read and checked on its own: a wrong type refused (``InvalidMessage``
naming the field) where the event cannot do without it, left out with a warning where it can.

Strings are kept only as UTF-8 can carry them and a person can read them (``message.printable``), bounded in
length; numbers only as 64-bit integers; times only from 2000 to 2199 (``message.MIN_TIME``/``MAX_TIME``).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from se_exporter.core.model import encodable, json_kind, parse_not_before
from se_exporter.fleet.message import MAX_TEXT, MAX_TIME, MIN_TIME, InvalidMessage, printable

STATUSES = ("Scheduled", "Started", "Completed", "Canceled")
_MAX_INT_DIGITS = 20  # a signed 64-bit integer; longer literals are refused as wrong types, never parsed


class OutOfRangeNumber:
    """An integer literal past 20 digits, or NaN/Infinity: kept out of every number (a wrong type, where read)."""

    def __init__(self, text: str) -> None:
        self.text = text[:24]

    def __repr__(self) -> str:
        return f"<number {self.text}...>"


def int_literal(text: str) -> int | OutOfRangeNumber:
    return int(text) if len(text) <= _MAX_INT_DIGITS else OutOfRangeNumber(text)


def kind(value: object) -> str:
    """``json_kind``, saying "huge number" for a ``OutOfRangeNumber`` (an integer past 20 digits, NaN or Infinity)."""
    return "huge number" if isinstance(value, OutOfRangeNumber) else json_kind(value)


def object_field(parent: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    value = parent.get(name)
    if not isinstance(value, dict):
        raise InvalidMessage("invalid_platform_event", f"{where} has no object {name!r} (a JSON {kind(value)})")
    return value


def kept_text(value: str, limit: int) -> str:
    """A string kept: unpaired surrogates and control characters spelt out (``message.printable``); cut at
    8 x ``limit`` characters (the caller refuses what is longer than ``limit``)."""
    if value.isascii() and value.isprintable():  # nearly always: two scans in C
        return value[: 8 * limit]
    return printable(encodable(value[: 8 * limit]))


def required(parent: Mapping[str, Any], name: str, limit: int, where: str = "the envelope") -> str:
    value = parent.get(name)
    if not isinstance(value, str) or not value.strip():
        raise InvalidMessage("invalid_platform_event", f"{where} has no usable {name!r} (a JSON {kind(value)})")
    text = kept_text(value, limit)
    if len(text) > limit:
        raise InvalidMessage("invalid_platform_event", f"{where}'s {name!r} is longer than {limit} characters")
    return text


def optional(parent: Mapping[str, Any], name: str, limit: int, warnings: list[str]) -> str:
    """A string field that may be missing; a wrong type or an overlong value is left out with a warning."""
    value = parent.get(name)
    if value is None:
        return ""
    text = kept_text(value, limit) if isinstance(value, str) else None
    if text is None or len(text) > limit:
        warnings.append(f"{name} is {'too long' if text else 'a JSON ' + kind(value)}; left out")
        return ""
    return text


def event_status(value: object) -> str:
    """One of STATUSES, whatever the case (and "Cancelled" as Azure spells it elsewhere); anything else refused:
    a status that cannot be ordered would break "statuses only move forward"."""
    if isinstance(value, str):
        found = _STATUS_NAMES.get(value.strip().casefold())
        if found:
            return found
    raise InvalidMessage("invalid_platform_event", f"EventStatus {shown(value)} is none of {', '.join(STATUSES)}")


_STATUS_NAMES = {**{status.casefold(): status for status in STATUSES}, "cancelled": "Canceled"}

_SCOPES = {"virtualmachinescalesets": "scale_set", "availabilitysets": "availability_set",
           "virtualmachines": "virtual_machine"}


def arm_scope(*candidates: object) -> tuple[str, str, str, str]:
    """(scope type, scope name, subscription, resource group) from resourceInfo.id, else the subject (the same ARM
    id: ``/subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/<kind>/<name>/providers/...``);
    refused when neither is one, since neither the scope nor the VMs can be known then."""
    for value in candidates:
        scope = _arm_id(value) if isinstance(value, str) and len(value) <= 2048 else None
        if scope is not None:
            return scope
    raise InvalidMessage("invalid_platform_event", "neither data.resourceInfo.id nor subject is the ARM id of a "
                         "VM, scale set or availability set's scheduled event")


_ARM_WORDS = ("subscriptions", "resourcegroups", "providers", "microsoft.compute")


def _arm_id(value: str) -> tuple[str, str, str, str] | None:
    """``arm_scope`` of one ARM id, or None when it is not one."""
    parts = value.split("/", 9)
    if len(parts) < 9 or parts[0] != "" or (parts[1].casefold(), parts[3].casefold(), parts[5].casefold(),
                                            parts[6].casefold()) != _ARM_WORDS:
        return None
    sub, group, kind, name = parts[2], parts[4], parts[7], parts[8]
    # Nearly always printable ASCII, as kept_text would keep each part (its cut changes nothing here: a longer
    # part is refused below, a longer kind is none of _SCOPES): one look at the whole id instead of four.
    if not (value.isascii() and value.isprintable()):
        sub, group, kind, name = (kept_text(part, MAX_TEXT) for part in (sub, group, kind, name))
    if all((sub, group, name)) and max(len(sub), len(group), len(name)) <= MAX_TEXT:
        return _SCOPES.get(kind.casefold(), "unknown"), name, sub, group
    return None


def vm_names(value: object, limit: int, warnings: list[str], hit: list[str]) -> tuple[str, ...]:
    """Resources: distinct VM names (the first spelling of each, names compare without case), at most ``limit``."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidMessage("invalid_platform_event", f"Resources is a JSON {kind(value)}, not a list")
    names: dict[str, str] = {}  # name without case -> as first spelt
    odd = 0
    for item in value:
        text = kept_text(item, MAX_TEXT) if isinstance(item, str) else ""
        if not text.strip() or len(text) > MAX_TEXT:
            odd += 1
            continue
        folded = text.casefold()
        if folded in names:
            continue
        if len(names) >= limit:
            hit.append("platform_resources_per_event")
            break
        names[folded] = text
    if odd:
        warnings.append(f"Resources has {odd} entries that are not VM names; left out")
    return tuple(names.values())


# ISO 8601 as Event Grid writes it: up to 7 fractional digits (more than datetime reads before 3.11), Z or offset.
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$", re.IGNORECASE)


def event_time(value: object, enqueued_at: float, warnings: list[str]) -> float:
    """eventTime as unix time, from 2000 to 2199; a missing or unreadable one is the enqueue time, with a warning."""
    found = _ISO.match(value.strip()) if isinstance(value, str) and len(value) <= 64 else None
    if found:
        whole, fraction, zone = found.groups()
        when = None
        with contextlib.suppress(ValueError):  # a day or an hour out of range
            when = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc)
        # The offset is taken off the unix time, not the datetime: year 1 or 9999 with an offset would overflow it.
        offset = _offset_seconds(zone)
        if when is not None and offset is not None:
            unix = when.timestamp() - offset + (int(fraction[:9]) / 10 ** len(fraction[:9]) if fraction else 0.0)
            if MIN_TIME <= unix < MAX_TIME:
                return unix
    warnings.append(f"eventTime {shown(value)} is not an ISO 8601 time from 2000 to 2199; the enqueue time is used")
    return enqueued_at


def _offset_seconds(zone: str | None) -> int | None:
    """An ISO 8601 UTC offset (``Z``, ``+02:00``) in seconds; None past +/-23:59."""
    if not zone or zone.upper() == "Z":
        return 0
    hours, minutes = int(zone[1:3]), int(zone[4:6])
    if hours > 23 or minutes > 59:
        return None
    return (1 if zone[0] == "+" else -1) * (hours * 3600 + minutes * 60)


def not_before(value: object, warnings: list[str]) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and len(value) <= 64:
        when = None
        with contextlib.suppress(ValueError, OverflowError):
            when = parse_not_before(value)
        # The year read must be the year written (give or take one: an offset may cross New Year), since email.utils
        # reads "0001" (any year below 100) as 2001.
        if when is not None and MIN_TIME <= when.timestamp() < MAX_TIME \
                and any(str(when.year + step) in value for step in (0, -1, 1)):
            return when.timestamp()
    warnings.append(f"NotBefore {shown(value)} is neither RFC 1123 nor ISO 8601 from 2000 to 2199; left out")
    return None


def duration(value: object, warnings: list[str]) -> float | None:
    """DurationInSeconds (-1: unknown, 0: no impact) as a float; a number past 64 bits or not whole is left out."""
    if value is None:
        return None
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and -(2**63) <= value < 2**63:
        return float(value)
    warnings.append(f"DurationInSeconds {shown(value)} is not a 64-bit integer; left out")
    return None


def shown(value: object) -> str:
    if isinstance(value, str):
        return repr(kept_text(value, 40)[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return repr(value) if abs(value) < 1e30 else "a huge number"
    return f"a JSON {kind(value)}"
