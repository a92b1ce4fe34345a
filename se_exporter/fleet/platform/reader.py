"""A platform message read and checked: Azure's own copy of a scheduled event, from Event Grid.

Recognised by content, so the platform stream may share a hub with the sidecars' documents: an Event Grid event
(an object, or an array of them as Event Grid delivers) in the Event Grid schema (``eventType``) or CloudEvents
1.0 (``specversion`` and ``type``). A type ending in ``MaintenanceResources.ScheduledEventEmitted`` is a platform
event; another event type is refused as ``other_event_type``; a body that is neither (no envelope key at the top
level) is not a platform message at all (``read_platform`` returns None) and is left to ``message.read_message``.

Nothing in it is trusted, as in ``message.py``: the byte cap is checked before parsing, the containers in the
body are counted before parsing (which bounds both depth and size of every value: a real event has six), integer
literals past 20 digits and NaN/Infinity never become numbers, every string kept is checked (unpaired surrogates
and control characters spelt out, length bounded), counts are bounded (``PlatformBounds``, each hit reported), and
a wrong type is refused with the field it concerns. Only ``InvalidMessage`` ever leaves ``read_platform``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from se_exporter.core.model import encodable, event_key, json_kind, parse_not_before
from se_exporter.fleet.message import MAX_TEXT, MAX_TIME, MIN_TIME, InvalidMessage, printable

EVENT_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
_TYPE_SUFFIX = "maintenanceresources.scheduledeventemitted"
# The reasons a message recognised as Event Grid's is counted under (besides message.py's too_large): another
# event type, or a ScheduledEventEmitted event that cannot be read (the message says which field).
PLATFORM_INVALID_REASONS = ("other_event_type", "invalid_platform_event")
PLATFORM_BOUND_NAMES = ("platform_events_per_message", "platform_resources_per_event")
STATUSES = ("Scheduled", "Started", "Completed", "Canceled")
SCOPE_TYPES = ("scale_set", "availability_set", "virtual_machine", "unknown")
MAX_DESCRIPTION = 1024
_MAX_INT_DIGITS = 20  # a signed 64-bit integer; longer literals are refused as wrong types, never parsed


@dataclass(frozen=True)
class PlatformBounds:
    """What one platform message may hold; each limit reached is reported in ``PlatformMessage.bounds``."""

    containers: int = 1024  # JSON objects and arrays in one body (a real event has 6): bounds depth and size
    events_per_message: int = 16  # Event Grid delivers one event per message today
    resources_per_event: int = 1000  # VMs one event names (an atomic operation on one host names a handful)


DEFAULT_PLATFORM_BOUNDS = PlatformBounds()


@dataclass(frozen=True, slots=True)
class PlatformEvent:
    """One status of one scheduled event, as the platform published it; names from the spec."""

    grid_id: str  # Event Grid's id of this message (duplicates repeat it), not the EventId
    event_id: str  # as sent (printable); ``key`` identifies it (event_key: GUIDs ignore case)
    key: str
    event_type: str
    event_status: str  # one of STATUSES
    event_source: str
    resource_type: str
    resources: tuple[str, ...]  # VM instance names (for a VM scope without Resources: the VM itself)
    scope_type: str  # one of SCOPE_TYPES, from resourceInfo.id
    scope_name: str
    subscription_id: str
    resource_group: str
    location: str
    event_time: float  # the envelope's eventTime (CloudEvents: time): when the platform published this status
    not_before: float | None
    duration_seconds: float | None
    description: str
    schema: str  # "eventgrid" or "cloudevents"


@dataclass(frozen=True)
class PlatformMessage:
    """What one received message held: its platform events, the Event Grid events of the array skipped (each a
    reason and a line saying why), tolerated oddities, and the bounds its reading reached."""

    events: tuple[PlatformEvent, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    bounds: tuple[str, ...] = ()


def looks_like_platform(body: bytes) -> bool:
    """A cheap first look (no parsing): could this body be an Event Grid event? A sidecar's document is an object
    holding neither envelope key; a false positive only costs one ``read_platform`` that returns None."""
    start = body.lstrip()[:1]
    return start == b"[" or (start == b"{" and (b'"eventType"' in body or b'"specversion"' in body))


def read_platform(body: bytes, max_bytes: int, enqueued_at: float,
                  bounds: PlatformBounds = DEFAULT_PLATFORM_BOUNDS) -> PlatformMessage | None:
    """The platform events of ``body``; None when it is not Event Grid's at all; ``InvalidMessage`` when it is
    but holds no platform event that can be read. ``enqueued_at`` stands in for a missing eventTime."""
    if len(body) > max_bytes:
        raise InvalidMessage("too_large", f"body of {len(body)} bytes is larger than --max-message-bytes {max_bytes}")
    if _containers(body) > bounds.containers:
        if body.lstrip()[:1] == b"[":  # never a sidecar's document: Event Grid's array, or garbage
            raise InvalidMessage("invalid_platform_event", f"body holds more than {bounds.containers} JSON objects "
                                 "and arrays (an event has 5): not read")
        return None
    found = _decode(body, None)
    if found is None:
        return None
    items = found if isinstance(found, list) else [found]
    if not items or not all(isinstance(item, dict) and _schema(item) for item in items):
        return None  # not (only) Event Grid events: whatever it is, message.read_message says what is wrong
    hit: list[str] = []
    if len(items) > bounds.events_per_message:
        hit.append("platform_events_per_message")
        items = items[: bounds.events_per_message]
    events: list[PlatformEvent] = []
    skipped: list[tuple[str, str]] = []
    warnings: list[str] = []
    for index, item in enumerate(items):
        where = f"event [{index}]" if isinstance(found, list) else "event"
        try:
            events.append(_event(item, enqueued_at, bounds, warnings, hit))
        except InvalidMessage as exc:
            skipped.append((exc.reason, f"{where}: {exc}"))
    if not events:
        reason, line = skipped[0]
        raise InvalidMessage(reason, line + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""))
    return PlatformMessage(tuple(events), tuple(skipped), tuple(warnings), tuple(dict.fromkeys(hit)))


class _Huge:
    """An integer literal past 20 digits, or NaN/Infinity: kept out of every number (a wrong type, where read)."""

    def __init__(self, text: str) -> None:
        self.text = text[:24]

    def __repr__(self) -> str:
        return f"<number {self.text}...>"


def _int_literal(text: str) -> int | _Huge:
    return int(text) if len(text) <= _MAX_INT_DIGITS else _Huge(text)


def _decode(body: bytes, bounds: PlatformBounds | None) -> object | None:
    """The JSON of ``body`` when it is UTF-8 JSON of at most ``bounds.containers`` containers (None: counted
    already), else None."""
    if bounds is not None and _containers(body) > bounds.containers:
        return None
    try:
        found: object = json.loads(body.decode("utf-8-sig"), parse_int=_int_literal, parse_constant=_Huge)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return found


def _containers(body: bytes) -> int:
    """An upper bound on the JSON objects and arrays in ``body`` (brackets inside strings count too), at the cost
    of two scans in C: it bounds the depth and the size of what parsing builds."""
    return body.count(b"{") + body.count(b"[")


def _schema(item: Mapping[str, Any]) -> str:
    return "cloudevents" if "specversion" in item else "eventgrid" if "eventType" in item else ""


def _event(item: Mapping[str, Any], enqueued_at: float, bounds: PlatformBounds, warnings: list[str],
           hit: list[str]) -> PlatformEvent:
    schema = _schema(item)
    kind = item.get("type" if schema == "cloudevents" else "eventType")
    if not isinstance(kind, str) or not kind.casefold().endswith(_TYPE_SUFFIX):
        raise InvalidMessage("other_event_type", f"{schema} event of type {_shown(kind)}, not {EVENT_TYPE}")
    grid_id = _required(item, "id", MAX_TEXT)
    data = _data(item, schema)
    info = _object(data, "resourceInfo", "data")
    props = _object(info, "properties", "data.resourceInfo")
    event_id = _required(props, "EventId", MAX_TEXT, "properties")
    scope = _scope(info.get("id"), item.get("subject"))
    status = _status(props.get("EventStatus"))
    resources = _resources(props.get("Resources"), bounds, warnings, hit)
    if not resources and scope[0] == "virtual_machine":
        resources = (scope[1],)  # a VM's own event: the VM is the one affected
    return PlatformEvent(
        grid_id=grid_id, event_id=event_id, key=event_key(event_id),
        event_type=_optional(props, "EventType", MAX_TEXT, warnings) or "unknown", event_status=status,
        event_source=_optional(props, "EventSource", MAX_TEXT, warnings) or "unknown",
        resource_type=_optional(props, "ResourceType", MAX_TEXT, warnings),
        resources=resources, scope_type=scope[0], scope_name=scope[1], subscription_id=scope[2],
        resource_group=scope[3], location=_optional(info, "location", MAX_TEXT, warnings),
        event_time=_event_time(item.get("time" if schema == "cloudevents" else "eventTime"), enqueued_at, warnings),
        not_before=_not_before(props.get("NotBefore"), warnings),
        duration_seconds=_duration(props.get("DurationInSeconds"), warnings),
        description=_optional(props, "Description", MAX_DESCRIPTION, warnings), schema=schema)


def _data(item: Mapping[str, Any], schema: str) -> Mapping[str, Any]:
    """``data``; for CloudEvents also ``data_base64`` holding JSON (binary data of a JSON content type)."""
    if schema == "cloudevents" and "data" not in item and "data_base64" in item:
        content = item.get("datacontenttype")
        if content is not None and not (isinstance(content, str) and "json" in content.casefold()):
            raise InvalidMessage("invalid_platform_event", f"data_base64 of content type {_shown(content)}, not JSON")
        encoded = item["data_base64"]
        decoded = None
        if isinstance(encoded, str):
            try:
                decoded = _decode(base64.b64decode(encoded, validate=True), DEFAULT_PLATFORM_BOUNDS)
            except (binascii.Error, ValueError):
                decoded = None
        if not isinstance(decoded, dict):
            raise InvalidMessage("invalid_platform_event", "data_base64 is not base64 of a JSON object")
        return decoded
    return _object(item, "data", "the envelope")


def _object(parent: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    value = parent.get(name)
    if not isinstance(value, dict):
        raise InvalidMessage("invalid_platform_event", f"{where} has no object {name!r} (a JSON {json_kind(value)})")
    return value


def _text(value: str, limit: int) -> str:
    """A string kept: unpaired surrogates and control characters spelt out (``message.printable``); cut at
    8 x ``limit`` characters (the caller refuses what is longer than ``limit``)."""
    if value.isascii() and value.isprintable():  # nearly always: two scans in C
        return value[: 8 * limit]
    return printable(encodable(value[: 8 * limit]))


def _required(parent: Mapping[str, Any], name: str, limit: int, where: str = "the envelope") -> str:
    value = parent.get(name)
    if not isinstance(value, str) or not value.strip():
        raise InvalidMessage("invalid_platform_event", f"{where} has no usable {name!r} (a JSON {json_kind(value)})")
    text = _text(value, limit)
    if len(text) > limit:
        raise InvalidMessage("invalid_platform_event", f"{where}'s {name!r} is longer than {limit} characters")
    return text


def _optional(parent: Mapping[str, Any], name: str, limit: int, warnings: list[str]) -> str:
    """A string field that may be missing; a wrong type or an overlong value is left out with a warning."""
    value = parent.get(name)
    if value is None:
        return ""
    text = _text(value, limit) if isinstance(value, str) else None
    if text is None or len(text) > limit:
        warnings.append(f"{name} is {'too long' if text else 'a JSON ' + json_kind(value)}; left out")
        return ""
    return text


def _status(value: object) -> str:
    """One of STATUSES, whatever the case (and "Cancelled" as Azure spells it elsewhere); anything else refused:
    a status that cannot be ordered would break "statuses only move forward"."""
    if isinstance(value, str):
        found = _STATUS_NAMES.get(value.strip().casefold())
        if found:
            return found
    raise InvalidMessage("invalid_platform_event",
                         f"EventStatus {_shown(value)} is none of {', '.join(STATUSES)}")


_STATUS_NAMES = {**{status.casefold(): status for status in STATUSES}, "cancelled": "Canceled"}

_SCOPES = {"virtualmachinescalesets": "scale_set", "availabilitysets": "availability_set",
           "virtualmachines": "virtual_machine"}


def _scope(*candidates: object) -> tuple[str, str, str, str]:
    """(scope type, scope name, subscription, resource group) from resourceInfo.id, else the subject (the same ARM
    id: ``/subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/<kind>/<name>/providers/...``);
    refused when neither is one, since neither the scope nor the VMs can be known then."""
    for value in candidates:
        parts = value.split("/", 9) if isinstance(value, str) and len(value) <= 2048 else []
        if len(parts) >= 9 and parts[0] == "" and (parts[1].casefold(), parts[3].casefold(), parts[5].casefold(),
                                                   parts[6].casefold()) == _ARM_WORDS:
            sub, group, kind, name = (_text(part, MAX_TEXT) for part in (parts[2], parts[4], parts[7], parts[8]))
            if all((sub, group, name)) and max(len(sub), len(group), len(name)) <= MAX_TEXT:
                return _SCOPES.get(kind.casefold(), "unknown"), name, sub, group
    raise InvalidMessage("invalid_platform_event", "neither data.resourceInfo.id nor subject is the ARM id of a "
                         "VM, scale set or availability set's scheduled event")


_ARM_WORDS = ("subscriptions", "resourcegroups", "providers", "microsoft.compute")


def _resources(value: object, bounds: PlatformBounds, warnings: list[str], hit: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidMessage("invalid_platform_event", f"Resources is a JSON {json_kind(value)}, not a list")
    names: dict[str, None] = {}
    odd = 0
    for item in value:
        text = _text(item, MAX_TEXT) if isinstance(item, str) else ""
        if not text.strip() or len(text) > MAX_TEXT:
            odd += 1
            continue
        if len(names) >= bounds.resources_per_event:
            hit.append("platform_resources_per_event")
            break
        names[text] = None
    if odd:
        warnings.append(f"Resources has {odd} entries that are not VM names; left out")
    return tuple(names)


# ISO 8601 as Event Grid writes it: up to 7 fractional digits (more than datetime reads before 3.11), Z or offset.
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$", re.IGNORECASE)


def _event_time(value: object, enqueued_at: float, warnings: list[str]) -> float:
    """eventTime as unix time, from 2000 to 2199; a missing or unreadable one is the enqueue time, with a warning."""
    found = _ISO.match(value.strip()) if isinstance(value, str) and len(value) <= 64 else None
    if found:
        whole, fraction, zone = found.groups()
        try:
            when = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc)
        except ValueError:
            when = None
        if when is not None:
            if zone and zone.upper() != "Z":
                sign = 1 if zone[0] == "+" else -1
                when -= sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
            unix = when.timestamp() + (int(fraction[:9]) / 10 ** len(fraction[:9]) if fraction else 0.0)
            if MIN_TIME <= unix < MAX_TIME:
                return unix
    warnings.append(f"eventTime {_shown(value)} is not an ISO 8601 time from 2000 to 2199; the enqueue time is used")
    return enqueued_at


def _not_before(value: object, warnings: list[str]) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and len(value) <= 64:
        try:
            when = parse_not_before(value)
        except (ValueError, OverflowError):
            when = None
        if when is not None and MIN_TIME <= when.timestamp() < MAX_TIME:
            return when.timestamp()
    warnings.append(f"NotBefore {_shown(value)} is neither RFC 1123 nor ISO 8601 from 2000 to 2199; left out")
    return None


def _duration(value: object, warnings: list[str]) -> float | None:
    """DurationInSeconds (-1: unknown, 0: no impact) as a float; a number past 64 bits or not whole is left out."""
    if value is None:
        return None
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and -(2**63) <= value < 2**63:
        return float(value)
    warnings.append(f"DurationInSeconds {_shown(value)} is not a 64-bit integer; left out")
    return None


def _shown(value: object) -> str:
    if isinstance(value, str):
        return repr(_text(value, 40)[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return repr(value) if abs(value) < 1e30 else "a huge number"
    return f"a JSON {json_kind(value)}" if not isinstance(value, _Huge) else "a huge number"
