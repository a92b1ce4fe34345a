"""A forwarded message read and checked: every property by type and range, the body by the sidecar's parser.

Nothing a VM sends is trusted, and a document changes only its own VM's picture, so it is accepted only under its
own partition key (``_key``; docs/architecture.md, "Who can change a VM's picture"). A bad message raises
``InvalidMessage`` with the reason it is counted under; nothing else ever leaves ``read_message`` (an exception in
the SDK's batch handler closes the partition, which is then claimed again and fails again).
"""

from __future__ import annotations

import functools
import json
import math
import operator
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any

from se_exporter.core.errors import InvalidDocument, SeExporterError
from se_exporter.core.model import (
    Document,
    ScheduledEvent,
    affects_label,
    affects_vm,
    encodable,
    event_to_json,
    parse_document,
)
from se_exporter.core.properties import KEPT, Property
from se_exporter.core.properties import NAMES as PROPERTY_NAMES
from se_exporter.infra.logs import shorten

# The envelope's properties (schemas/forwarded-document.schema.json); anything else is tolerated and counted.
KNOWN_PROPERTIES = PROPERTY_NAMES
INVALID_REASONS = ("too_large", "not_json", "invalid_document", "not_envelope", "bad_property", "wrong_partition_key")
MAX_SEQUENCE = 2**63 - 1  # the sidecar's numbering stays below 2**53; anything past a signed 64-bit value is forged
MAX_SEQUENCE_DIGITS = 20
MAX_TEXT = 256  # characters of a property or event field shown as a label (an Azure VM name has at most 64)
MAX_MESSAGE_ID = 300  # '<installation uuid>:<sequence>' is 57
MAX_TIME_TEXT = 40  # '2026-11-22T03:04:28.024Z' is 24
MIN_TIME = 946_684_800.0  # 2000-01-01T00:00:00Z: no sidecar read IMDS before (0001-01-01 became a -62135596800 gauge)
MAX_TIME = 7_258_118_400.0  # 2200-01-01T00:00:00Z: far past any real time, and still a plain gauge value
MAX_UNKNOWN_LISTED = 10
MAX_PAUSED, MAX_PAUSES_TEXT = 16, 24 * 1024  # the sidecar sends at most 16 events, each id at most 1,024 characters
MAX_PAUSE_SECONDS = 7 * 86400.0  # a pause past a week is a forged one


@dataclass(frozen=True)
class Bounds:
    """What one replica keeps at most, each limit reached counted (``bound_hits_total{bound}``) and logged once: room
    to spare for a 100,000-VM fleet on one partition, whose documents list a handful of events in under a KB."""

    vms_per_partition: int = 100_000
    vms_per_installation: int = 4  # one sidecar installation is one VM (known first by name, then by vm_id)
    events_per_vm: int = 64
    body_bytes: int = 64 * 1024  # a larger body is kept as the fleet's own reduction of it (what it shows)


DEFAULT_BOUNDS = Bounds()
BOUND_NAMES = (*(bound.name for bound in fields(Bounds)), "label_length")


class InvalidMessage(SeExporterError):
    """A message that is not a forwarded document; ``reason`` is the label it is counted under."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """One listed event, reduced to what the fleet shows (Resources reduced to affects_this_vm)."""

    event_id: str
    event_type: str
    event_status: str
    event_source: str
    affects_this_vm: str
    not_before: float | None
    duration_seconds: float | None

    @property
    def counts_for_vm(self) -> bool:
        """A neighbour's event listed in this VM's document does not make this VM pending."""
        return self.affects_this_vm != "false"


@dataclass(frozen=True, slots=True)
class Imds:
    """The VM's IMDS health as its sidecar last reported it; None where an older sidecar said nothing."""

    observed_at: float | None = None
    last_success: float | None = None
    failing: bool | None = None


NO_IMDS = Imds()


Reported = str | float | bool | int  # a kept property's value, as its kind reads (``read_property``)


@dataclass(frozen=True, slots=True)
class VmState:
    """The latest document of one VM and where it came from."""

    key: str
    vm_id: str
    vm_name: str
    vmss_name: str
    location: str
    installation: str
    sequence: int
    seen_at: float  # when Event Hubs enqueued it: the same on every replica and after a replay
    body: bytes
    events: tuple[FleetEvent, ...]
    imds: Imds = NO_IMDS
    subscription_id: str = ""  # where the VM is, as its sidecar said: the platform stream is joined on these
    resource_group: str = ""
    reported: tuple[tuple[str, Reported], ...] = ()  # the properties the fleet keeps (``Property.kept``), as sent

    def value(self, name: str) -> Reported | None:
        """A kept property's value (``reported``), None when this VM's sidecar did not send it."""
        return next((value for key, value in self.reported if key == name), None)


@dataclass(frozen=True)
class StateField:
    """A ``VmState`` field's ``kind``: ``heartbeat`` what a heartbeat moves (a state write may only touch it),
    ``follows_body`` read from ``body`` (equal bodies, equal values), ``fact`` everything else (a change rewrites the
    VM whole). ``stored`` in a partition's state (``stateformat``): ``always`` in every row (a row without it is left
    out), ``when_known`` only when it holds something (absent reads as unknown), ``not`` never (read from ``body``)."""

    kind: str
    stored: str


# Every field of ``VmState``, declared once; tests/fleet/test_vms.py fails on a field left out, and the state format
# reads its required fields, in this order, from here.
VM_STATE_FIELDS: dict[str, StateField] = {
    "key": StateField("fact", "always"), "vm_id": StateField("fact", "always"),
    "vm_name": StateField("fact", "always"), "vmss_name": StateField("fact", "always"),
    "location": StateField("fact", "always"), "installation": StateField("fact", "always"),
    "sequence": StateField("heartbeat", "always"), "seen_at": StateField("heartbeat", "always"),
    "body": StateField("fact", "always"), "events": StateField("follows_body", "not"),
    "imds": StateField("heartbeat", "when_known"), "subscription_id": StateField("fact", "when_known"),
    "resource_group": StateField("fact", "when_known"), "reported": StateField("fact", "when_known"),
}
# The facts of a VM, body first (it differs most often), as one tuple: compared at C speed on every message.
vm_facts = operator.attrgetter(*sorted((name for name, f in VM_STATE_FIELDS.items() if f.kind == "fact"),
                                       key=lambda name: name != "body"))


@dataclass(frozen=True)
class Message:
    """A forwarded document as read from Event Hubs; ``bounds`` names the limits its reading reached."""

    vm: VmState
    message_id: str
    heartbeat: bool
    unknown_properties: tuple[str, ...] = ()
    document_warnings: int = 0
    bounds: tuple[str, ...] = ()
    retires_name: bool = False  # only retires the VM known by ``vm.vm_name`` (``vm.key``), applies nothing


def _key(vm_id: str, vm_name: str, partition_key: Any, retires_name: bool) -> str:
    """The VM's key (``vm_id``, else ``vm_name``), checked against the partition key it was sent with: its own, or
    for a message retiring a name, that name."""
    key = vm_id or vm_name or "unknown"  # as the sidecar keys a VM that knows neither yet
    sent_key = _bounded_text("partition key", partition_key, MAX_TEXT) if partition_key is not None else None
    if retires_name:  # sent under the old key, the name, and only by a sidecar that knows its vm_id
        if not vm_id or not vm_name or sent_key != vm_name:
            raise InvalidMessage("wrong_partition_key", f"partition key {_quote(sent_key)} of a message retiring a "
                                 f"name is not its vm_name {_quote(vm_name)} beside a vm_id")
        return vm_name
    if sent_key != key:
        raise InvalidMessage("wrong_partition_key", f"partition key {_quote(sent_key)} is not the document's "
                             f"vm_id or vm_name {_quote(key)}: a VM's documents are sent with its own key")
    return key


def _imds(properties: Mapping[Any, Any]) -> Imds:
    """What the sidecar says of its IMDS reads, checked."""
    last_success, failing = _time(properties, "imds_last_success"), _flag(properties, "imds_failing")
    if last_success is None and failing is None:
        return NO_IMDS  # an older sidecar: unknown, and shared by most of a fleet until sidecars are upgraded
    # observed_at is used only beside imds_last_success (see vms.imds_unreachable)
    observed = _time(properties, "observed_at") if last_success is not None else None
    return Imds(observed, last_success, failing)


def read_message(body: bytes, properties: Mapping[Any, Any], message_id: Any, partition_key: Any,
                 enqueued_at: float, max_bytes: int, bounds: Bounds = DEFAULT_BOUNDS) -> Message:
    """Check one received event against the envelope and parse its document; raise ``InvalidMessage``."""
    if len(body) > max_bytes:
        raise InvalidMessage("too_large", f"body of {len(body)} bytes is larger than --max-message-bytes {max_bytes}")
    message_text = _bounded_text("message id", message_id, MAX_MESSAGE_ID) if message_id is not None else ""
    installation, colon, _number = message_text.rpartition(":")
    raw_sequence = _property(properties, "sequence")
    if not colon or not installation or raw_sequence is None:
        raise InvalidMessage("not_envelope", "not a forwarded document: needs a message id "
                             "'<installation>:<sequence>' and an integer 'sequence' property")
    sequence = _sequence(raw_sequence)
    vm_id, vm_name, vmss_name, location = _labels(properties, _IDENTITY)
    retires_name = _flag(properties, "retires_name") is True
    key = _key(vm_id, vm_name, partition_key, retires_name)
    imds = _imds(properties)
    heartbeat = _flag(properties, "heartbeat") is True
    body = bytes(body)
    events, warnings, hit = read_events(body, vm_name, bounds)
    if len(body) <= bounds.body_bytes:
        kept = _QUIET.get(body, body)  # a quiet body: the one copy its VMs share
    else:
        kept = reduced_body(events, vm_name)
        hit = (*hit, "body_bytes")
    subscription_id, resource_group = _labels(properties, _PLACE)
    # Shared by many VMs (a scale set, a region): one string each, not one per VM held (about 10 % of a held VM).
    vm = VmState(key, vm_id, vm_name, sys.intern(vmss_name), sys.intern(location), installation, sequence, enqueued_at,
                 kept, events, imds, sys.intern(subscription_id), sys.intern(resource_group), _reported(properties))
    listed: tuple[str, ...] = ()
    if not properties.keys() <= _KNOWN_KEYS:  # compared in C, no set made: a current sidecar sends no other
        listed = tuple(sorted(_bounded_name(name) for name in properties.keys() - _KNOWN_KEYS))[:MAX_UNKNOWN_LISTED]
    return Message(vm, message_text, heartbeat, listed, warnings, hit, retires_name)


Listed = tuple[tuple[FleetEvent, ...], int, tuple[str, ...]]  # what ``read_events`` gives


def read_events(body: bytes, vm_name: str, bounds: Bounds = DEFAULT_BOUNDS) -> Listed:
    """The document's events for this VM (at most ``bounds.events_per_vm``, none with a field longer than a label),
    its parse warnings and the bounds reached."""
    if body in _QUIET:  # most of a fleet, most of the time: parsed once, the same for every VM
        return (), 0, ()
    if (known := _LISTING.read.get((body, vm_name, bounds))) is not None:  # a heartbeat repeating its VM's document
        return known
    document = parse_body(body)
    events, hit = fleet_events(document, vm_name, bounds)
    warnings = len(document.warnings)
    if not events and not warnings and not hit and len(body) <= 256:
        if len(_QUIET) >= QUIET_BODIES:
            _QUIET.clear()
        _QUIET[body] = body
    else:
        _LISTING.keep((body, vm_name, bounds), (events, warnings, hit))
    return events, warnings, hit


# Bodies of valid documents listing no event ({"DocumentIncarnation": 7, "Events": []} and variants): a quiet fleet
# sends few distinct ones, so each is parsed once and the VMs holding one share one copy (about 80 bytes a VM).
_QUIET: dict[bytes, bytes] = {}
QUIET_BODIES = 4096


class Listings:
    """What each recent document listing events gave, by body and VM name, so that a VM's heartbeats repeating it
    parse it once (``scripts/fleet_scale_bench.py``). Bounded in bodies and bytes; only the consumer's loop uses it."""

    def __init__(self, max_bodies: int = 32_768, max_bytes: int = 8 * 1024**2, max_body: int = 4096) -> None:
        self.max_bodies, self.max_bytes, self.max_body = max_bodies, max_bytes, max_body
        self.read: dict[tuple[bytes, str, Bounds], Listed] = {}
        self._bytes = 0

    def keep(self, key: tuple[bytes, str, Bounds], read: Listed) -> None:
        size = len(key[0]) + len(key[1])
        if size > self.max_body:
            return
        if len(self.read) >= self.max_bodies or self._bytes + size > self.max_bytes:
            self.read.clear()
            self._bytes = 0
        self.read[key] = read
        self._bytes += size


_LISTING = Listings()


def parse_body(body: bytes) -> Document:
    """The sidecar's parser; its refusals split into the two reasons the fleet has always counted."""
    try:
        return parse_document(body)
    except InvalidDocument as exc:
        text = str(exc)
        reason = "not_json" if text.startswith(_NOT_JSON) else "invalid_document"
        what = "UTF-8 JSON" if reason == "not_json" else "a Scheduled Events document"
        raise InvalidMessage(reason, f"body is not {what} ({shorten(text, 200)})") from None


# How parse_document words a body that is not JSON at all (tests/fleet/test_vms.py pins each reason).
_NOT_JSON = ("body is not UTF-8", "body is empty", "body is not JSON", "body is JSON nested too deeply")


def fleet_events(document: Document, vm_name: str, bounds: Bounds = DEFAULT_BOUNDS,
                 ) -> tuple[tuple[FleetEvent, ...], tuple[str, ...]]:
    events: list[FleetEvent] = []
    hit: list[str] = []
    for event in document.events:
        # The EventId in the core's one canonical case (``event_key``): one GUID spelt in two cases by two VMs is
        # one event, one series of both VMs, on every replica.
        fields = (printable(event.key), printable(event.event_type), printable(event.event_status),
                  printable(event.event_source or "unknown"))
        if any(len(text) > MAX_TEXT for text in fields):
            hit.append("label_length")
            continue
        if len(events) >= bounds.events_per_vm:
            hit.append("events_per_vm")
            break
        events.append(FleetEvent(*fields, affects_label(affects_vm(event, vm_name or None)),
                                 event.not_before.timestamp() if event.not_before is not None else None,
                                 float(event.duration_seconds) if event.duration_seconds is not None else None))
    return tuple(events), tuple(dict.fromkeys(hit))


def reduced_body(events: tuple[FleetEvent, ...], vm_name: str) -> bytes:
    """A document of what the fleet shows of ``events`` (``event_to_json``): parsed again, the same events."""
    resources = {"true": (vm_name,), "false": ("_",)}  # by affects_this_vm; "unknown" lists none
    listed = [event_to_json(ScheduledEvent(
        event_id=e.event_id, event_type=e.event_type, event_status=e.event_status, event_source=e.event_source,
        resources=resources.get(e.affects_this_vm, ()),
        not_before=None if e.not_before is None else datetime.fromtimestamp(e.not_before, timezone.utc),
        duration_seconds=None if e.duration_seconds is None else int(e.duration_seconds))) for e in events]
    return json.dumps({"Events": listed}, separators=(",", ":")).encode()


def _property(properties: Mapping[Any, Any], name: str) -> Any:
    value = properties.get(_KEYS[name])
    return properties.get(name) if value is None else value


_KEYS = {name: name.encode() for name in KNOWN_PROPERTIES}  # the SDK hands property names over as bytes
_KNOWN_KEYS = frozenset(KNOWN_PROPERTIES) | frozenset(_KEYS.values())


def _reported(properties: Mapping[Any, Any]) -> tuple[tuple[str, Reported], ...]:
    """The kept properties sent (``Property.kept``), in their declared order."""
    return tuple((p.name, value) for p in KEPT if (value := read_property(properties, p)) is not None)


def read_property(properties: Mapping[Any, Any], declared: Property) -> Reported | None:
    """A property's value as its kind says (``core/properties.KINDS``), None when absent; ``InvalidMessage`` when
    it is not of its kind."""
    name, kind = declared.name, declared.kind
    if kind == "time":
        return _time(properties, name)
    if kind in ("flag", "mark"):
        return _flag(properties, name)
    if kind in ("sequence", "integer"):
        value = _property(properties, name)
        return None if value is None else _sequence(value, name, 1 if kind == "sequence" else -MAX_SEQUENCE)
    if kind == "pauses":
        value = _property(properties, name)
        return None if value in (None, "", b"") else read_pauses(value)
    return _labels(properties, _label_names(name))[0] or None  # text: empty is not known


def read_pauses(value: Any) -> str:
    """The ``pauses`` property (each event's longest and total pause, ``sidecar/forwarding/envelope.py``) checked
    and written again in one form: EventIds as ``event_key``s, sorted; ``InvalidMessage`` when out of shape."""
    try:
        text = bytes(value).decode() if isinstance(value, (bytes, bytearray)) else value
        pauses: Any = json.loads(text) if isinstance(text, str) and len(text) <= MAX_PAUSES_TEXT else None
        kept = dict(_pause(key, entry) for key, entry in pauses.items()) if len(pauses) <= MAX_PAUSED else {}
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        kept = {}
    if not kept or len(kept) != len(pauses):
        raise InvalidMessage("bad_property", f"property 'pauses' is not an object of EventId to type, longest and "
                             f"total ({_describe(value)})")
    return json.dumps(dict(sorted(kept.items())), separators=(",", ":"))


def _pause(key: Any, entry: Any) -> tuple[str, dict[str, Any]]:
    """One event's pauses, checked (``ValueError`` when out of range)."""
    # As every text a VM sends: unpaired surrogates and control characters spelt out (a label must be UTF-8)
    event_key, kind = printable(encodable(key.strip().lower())), printable(encodable(entry["type"]))
    longest, total = float(entry["longest"]), float(entry["total"])
    if len(event_key) > MAX_TEXT or len(kind) > MAX_TEXT or not 0 <= longest <= total <= MAX_PAUSE_SECONDS:
        raise ValueError("out of range")
    return event_key, {"type": kind, "longest": longest, "total": total}


def _sequence(value: Any, name: str = "sequence", least: int = 1) -> int:
    """An int from ``least`` to 2**63-1, or its ASCII digits (the envelope sends numbers past 32 bits as text)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("ascii", "replace")
    if isinstance(value, str) and value.isascii() and value.removeprefix("-").isdigit() \
            and len(value) <= MAX_SEQUENCE_DIGITS:
        value = int(value)
    if type(value) is not int or not least <= value <= MAX_SEQUENCE:
        shown = least if least == 1 else "-(2**63-1)"
        raise InvalidMessage("bad_property", f"property {name!r} is not an integer from {shown} to 2**63-1 "
                             f"({_describe(value)})")
    return value


def _labels(properties: Mapping[Any, Any], names: tuple[tuple[str, bytes, str], ...]) -> list[str]:
    """String properties shown as labels, in order: absent is empty, anything but text (or longer than a label)
    refused; each looked up under its bytes form (the SDK's) first."""
    texts = []
    get = properties.get
    for name, key, what in names:
        if (value := get(key)) is None:
            value = get(name)
        if value is None:
            texts.append("")
        elif isinstance(value, (str, bytes, bytearray)):
            texts.append(_bounded_text(what, value, MAX_TEXT))
        else:
            raise InvalidMessage("bad_property", f"property {name!r} is not a string ({_describe(value)})")
    return texts


def _label_names(*names: str) -> tuple[tuple[str, bytes, str], ...]:
    """Each name as sent by the SDK (bytes) and as an error says it, made once."""
    return tuple((name, name.encode(), f"property {name!r}") for name in names)


_IDENTITY = _label_names("vm_id", "vm_name", "vmss_name", "location")
_PLACE = _label_names("subscription_id", "resource_group")

def _bounded_text(what: str, value: Any, limit: int) -> str:
    """Text UTF-8 can carry (bytes decoded with replacement, unpaired surrogates spelt out), ``limit`` characters."""
    if type(value) is bytes and len(value) <= limit:  # the SDK's usual case: no character count needed
        if value.isascii():  # printable ASCII is what it is: checked in C, no pattern search
            text = value.decode("ascii")
            if text.isprintable():
                return text
        else:
            text = value.decode("utf-8", "replace")
        if not _CONTROL.search(text):
            return text
    elif isinstance(value, (bytes, bytearray)):
        if len(value) > 4 * limit:
            raise InvalidMessage("bad_property", f"{what} is {len(value)} bytes long (at most {limit} characters)")
        text = bytes(value).decode("utf-8", "replace")
    elif isinstance(value, str):
        text = encodable(value)
    else:
        text = str(value)[: limit + 1]
    text = printable(text)
    if len(text) > limit:
        raise InvalidMessage("bad_property", f"{what} is longer than {limit} characters")
    return text


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline are not: the exposition escapes newline


def printable(text: str) -> str:
    """``text`` with control characters but tab and newline spelt out as ``\\xNN``: labels, logs and the state carry
    what a VM sent visibly, never raw. Idempotent, so a state read back is equal."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text) if _CONTROL.search(text) else text


def _time(properties: Mapping[Any, Any], name: str) -> float | None:
    """An RFC 3339 time from 2000 to 2199 (``observed_at``, ``imds_last_success``) as unix time; absent is None."""
    value = _property(properties, name)
    if value is None or value in ("", b""):  # empty: not known (a VM that has not read IMDS yet)
        return None
    if type(value) is bytearray:
        value = bytes(value)
    unix = _unix(value) if isinstance(value, (str, bytes)) and len(value) <= MAX_TIME_TEXT else None
    if unix is None:
        raise InvalidMessage("bad_property", f"property {name!r} is not an RFC 3339 time ({_describe(value)})")
    if not MIN_TIME <= unix < MAX_TIME:  # else a VM unreachable for ever, or never
        raise InvalidMessage("bad_property", f"property {name!r} is {unix:.0f}, not a time from 2000 to 2199")
    return unix


@functools.lru_cache(maxsize=256)
def _unix(value: str | bytes) -> float | None:
    """The time ``value`` says as unix time; None when it is not one. Remembered: a healthy sidecar sends one
    instant as both ``observed_at`` and ``imds_last_success`` (it read IMDS when it observed)."""
    text = value if isinstance(value, str) else value.decode("ascii", "replace")
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        return None
    unix = (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp()
    return unix if math.isfinite(unix) else None


def _flag(properties: Mapping[Any, Any], name: str) -> bool | None:
    value = _property(properties, name)
    if value is None or isinstance(value, bool):
        return value
    raise InvalidMessage("bad_property", f"property {name!r} is not a boolean ({_describe(value)})")


def _bounded_name(name: Any) -> str:
    text = name.decode("utf-8", "replace") if isinstance(name, (bytes, bytearray)) else encodable(str(name))
    return text if len(text) <= 64 else text[:64] + "..."


def _describe(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past the int-string limit
        text = "..."
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def _quote(text: str | None) -> str:
    return "none" if text is None else repr(text[:80])

