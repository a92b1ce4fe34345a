"""A platform message read and checked: Azure's own copy of a scheduled event, from Event Grid.

Recognised by content, so the platform stream may share a hub with the sidecars' documents: an Event Grid event (an
object, or an array of them) in the Event Grid schema (``eventType``) or CloudEvents 1.0 (``specversion`` and
``type``), of one of ``EVENT_TYPES`` (by their ending, in any case). Nothing in it is trusted, as in ``message.py``:
docs/platform-stream.md, "What a message may be", says what each kind of bad input gives. Only ``InvalidMessage``
ever leaves ``read_platform``.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from se_exporter.core.model import event_key
from se_exporter.fleet.message import MAX_TEXT, InvalidMessage
from se_exporter.fleet.platform import fields

_WRITE_TYPE = "microsoft.maintenance/scheduledevents/write"
EVENT_TYPES = ("Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted",
               "Microsoft.Maintenance.ScheduledEvents.ScheduledEventEmitted", _WRITE_TYPE)
_TYPE_ENDINGS = ("maintenanceresources.scheduledeventemitted", "maintenance.scheduledevents.scheduledeventemitted")
# The reasons an Event Grid message is counted under besides message.py's too_large: another event type, an event
# that cannot be read, or one on the sidecars' hub while the platform's own is read (``PlatformReader.handle``).
PLATFORM_INVALID_REASONS = ("other_event_type", "invalid_platform_event", "platform_on_sidecars_hub")
PLATFORM_BOUND_NAMES = ("platform_events_per_message", "platform_resources_per_event")
SCOPE_TYPES = ("scale_set", "availability_set", "virtual_machine", "unknown")
MAX_DESCRIPTION = 1024


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
    event_status: str  # one of fields.STATUSES
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
    """What one received message held; ``skipped``: each Event Grid event of the array left out, a reason and why."""

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
    but holds no platform event that can be read. ``enqueued_at`` stands in for a missing eventTime. A sidecar's
    document costs only ``looks_like_platform``'s look: nothing is parsed twice on the fleet's common path."""
    if len(body) > max_bytes:
        raise InvalidMessage("too_large", f"body of {len(body)} bytes is larger than --max-message-bytes {max_bytes}")
    if not looks_like_platform(body):
        return None
    found = _parsed(body, bounds)
    items = found if isinstance(found, list) else [found]  # None: not JSON, refused below as not an object
    if not items:
        return None
    for item in items:  # a loop, not all() over a generator: most messages hold one event
        if not (isinstance(item, dict) and _schema(item)):
            return None  # not (only) Event Grid events: whatever it is, message.read_message says what is wrong
    hit = ["platform_events_per_message"] if len(items) > bounds.events_per_message else []
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


def _parsed(body: bytes, bounds: PlatformBounds) -> object | None:
    """The JSON of a body that may be Event Grid's; None when it is not JSON within the bounds and may be a
    sidecar's document (for ``message.read_message`` to say what is wrong); an array never is one: refused here."""
    array = body.lstrip()[:1] == b"["
    if _containers(body) > bounds.containers:
        if array:  # never a sidecar's document: Event Grid's array, or garbage
            raise InvalidMessage("invalid_platform_event", f"body holds more than {bounds.containers} JSON objects "
                                 "and arrays (an event has 5): not read")
        return None
    found = _decode(body)
    if found is None and array:  # never a sidecar's document, whose reader would ask for its envelope
        raise InvalidMessage("not_json", "an array that is not UTF-8 JSON (cut short, or nested too deeply): not read")
    return found


# One decoder for every message: ``json.loads`` with parse_int builds a new one per call (a tenth of reading a
# platform message, measured in ``scripts/fleet_bench.py --platform``).
_DECODER = json.JSONDecoder(parse_int=fields.int_literal, parse_constant=fields.OutOfRangeNumber)


def _decode(body: bytes) -> object | None:
    """``body``'s UTF-8 JSON, or None when it is not."""
    try:  # a BOM taken off by hand: the utf-8-sig codec is Python code, utf-8 is C (a twentieth of reading one)
        found: object = _DECODER.decode((body[3:] if body.startswith(codecs.BOM_UTF8) else body).decode("utf-8"))
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
    if not isinstance(kind, str) or not (kind.casefold().endswith(_TYPE_ENDINGS) or kind.casefold() == _WRITE_TYPE):
        raise InvalidMessage("other_event_type", f"{schema} event of type {fields.shown(kind)}, none of "
                             f"{', '.join(EVENT_TYPES)}")
    grid_id = fields.required(item, "id", MAX_TEXT)
    data = _data(item, schema)
    info = fields.object_field(data, "resourceInfo", "data")
    props = fields.object_field(info, "properties", "data.resourceInfo")
    event_id = fields.required(props, "EventId", MAX_TEXT, "properties")
    scope = fields.arm_scope(info.get("id"), item.get("subject"))
    status = fields.event_status(props.get("EventStatus"))
    resources = fields.vm_names(props.get("Resources"), bounds.resources_per_event, warnings, hit)
    if not resources and scope[0] == "virtual_machine":
        resources = (scope[1],)  # a VM's own event: the VM is the one affected
    return PlatformEvent(
        grid_id=grid_id, event_id=event_id, key=event_key(event_id),
        event_type=fields.optional(props, "EventType", MAX_TEXT, warnings) or "unknown", event_status=status,
        event_source=fields.optional(props, "EventSource", MAX_TEXT, warnings) or "unknown",
        resource_type=fields.optional(props, "ResourceType", MAX_TEXT, warnings),
        resources=resources, scope_type=scope[0], scope_name=scope[1], subscription_id=scope[2],
        resource_group=scope[3], location=fields.optional(info, "location", MAX_TEXT, warnings),
        event_time=fields.event_time(item.get("time" if schema == "cloudevents" else "eventTime"), enqueued_at,
                                     warnings),
        not_before=fields.not_before(props.get("NotBefore"), warnings),
        duration_seconds=fields.duration(props.get("DurationInSeconds"), warnings),
        description=fields.optional(props, "Description", MAX_DESCRIPTION, warnings), schema=schema)


def _data(item: Mapping[str, Any], schema: str) -> Mapping[str, Any]:
    """``data``; for CloudEvents also ``data_base64`` holding JSON (binary data of a JSON content type)."""
    if schema == "cloudevents" and "data" not in item and "data_base64" in item:
        content = item.get("datacontenttype")
        if content is not None and not (isinstance(content, str) and "json" in content.casefold()):
            raise InvalidMessage("invalid_platform_event",
                                 f"data_base64 of content type {fields.shown(content)}, not JSON")
        encoded = item["data_base64"]
        decoded = None
        if isinstance(encoded, str):
            with contextlib.suppress(ValueError):  # not base64 (binascii.Error is a ValueError), or not ASCII
                raw = base64.b64decode(encoded, validate=True)
                decoded = _decode(raw) if _containers(raw) <= DEFAULT_PLATFORM_BOUNDS.containers else None
        if not isinstance(decoded, dict):
            raise InvalidMessage("invalid_platform_event", "data_base64 is not base64 of a JSON object")
        return decoded
    return fields.object_field(item, "data", "the envelope")
