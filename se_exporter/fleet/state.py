"""The fleet's core: forwarded messages read and checked, and the latest document of every VM, per partition.

No I/O and no clock reads: the consumer hands in what the SDK received and the time, and reads back
values. Every partition's state is a fold over that partition's events in order, so it can be written
beside the checkpoint and continued by whichever replica owns the partition next.

Ordering. A VM's documents all go to one partition (the partition key is its vm_id), in order.
Within one installation of the sidecar (the part of ``message_id`` before the colon) ``sequence``
decides: the same sequence again is a resend (counted, never applied twice), a lower one is older
(counted, never applied). A document from another installation of the same VM (its state directory
was lost, or the VM reinstalled) replaces the current one: the partition's order decides then.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from se_exporter.errors import InvalidDocument, SeExporterError
from se_exporter.model import Document, affects_label, affects_vm, document_from_json

# The envelope's properties (schemas/forwarded-document.schema.json); anything else is tolerated and counted.
KNOWN_PROPERTIES = frozenset({
    "vm_name", "vm_id", "vmss_name", "subscription_id", "resource_group", "location", "observed_at",
    "api_version", "exporter_version", "sequence", "document_incarnation", "heartbeat",
    "imds_last_success", "imds_failing"})
INVALID_REASONS = ("too_large", "not_json", "invalid_document", "not_envelope")
STATE_FORMAT = 1


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


@dataclass(frozen=True)
class Message:
    """A forwarded document as read from Event Hubs."""

    vm: VmState
    message_id: str
    heartbeat: bool
    unknown_properties: tuple[str, ...] = ()
    document_warnings: int = 0


def fleet_events(document: Document, vm_name: str) -> tuple[FleetEvent, ...]:
    return tuple(
        FleetEvent(event.event_id, event.event_type, event.event_status, event.event_source or "unknown",
                   affects_label(affects_vm(event, vm_name or None)),
                   event.not_before.timestamp() if event.not_before is not None else None,
                   float(event.duration_seconds) if event.duration_seconds is not None else None)
        for event in document.events)


def parse_body(body: bytes) -> Document:
    try:
        obj = json.loads(body.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidMessage("not_json", f"body is not UTF-8 JSON ({_short(exc)})") from None
    try:
        return document_from_json(obj)
    except InvalidDocument as exc:
        raise InvalidMessage("invalid_document", f"body is not a Scheduled Events document ({exc})") from None


def read_message(body: bytes, properties: Mapping[Any, Any], message_id: Any, partition_key: Any,
                 enqueued_at: float, max_bytes: int) -> Message:
    """Check one received event against the envelope and parse its document; raise ``InvalidMessage``.

    This runs for every message, so it reads the properties it needs straight from the SDK's dict (keys arrive
    as bytes) and decodes nothing else."""
    if len(body) > max_bytes:
        raise InvalidMessage("too_large", f"body of {len(body)} bytes is larger than --max-message-bytes {max_bytes}")
    message_text = _text(message_id) if message_id is not None else ""
    installation, colon, _number = message_text.rpartition(":")
    sequence = _property(properties, "sequence")
    if isinstance(sequence, (bytes, str)) and sequence.isdigit():
        sequence = int(sequence)
    if not colon or not installation or not isinstance(sequence, int) or isinstance(sequence, bool) \
            or sequence < 1:
        raise InvalidMessage("not_envelope", "not a forwarded document: needs a message id "
                             "'<installation>:<sequence>' and an integer 'sequence' property")
    vm_id, vm_name, vmss_name, location = (_string(_property(properties, name))
                                           for name in ("vm_id", "vm_name", "vmss_name", "location"))
    if vm_id is None or vm_name is None or vmss_name is None or location is None:
        raise InvalidMessage("not_envelope", "not a forwarded document: vm_id, vm_name, vmss_name and location "
                             "must be strings")
    key = vm_id or (_text(partition_key) if partition_key is not None else "") or vm_name
    if not key:
        raise InvalidMessage("not_envelope", "not a forwarded document: no vm_id, partition key or vm_name")
    body = bytes(body)
    events, warnings = read_events(body, vm_name)
    vm = VmState(key, vm_id, vm_name, vmss_name, location, installation, sequence, enqueued_at, body, events)
    unknown = [key for key in properties if key not in _KNOWN_KEYS]
    return Message(vm, message_text, _property(properties, "heartbeat") is True,
                   tuple(sorted(_text(key) for key in unknown)) if unknown else (), warnings)


def _property(properties: Mapping[Any, Any], name: str) -> Any:
    value = properties.get(_KEYS[name])
    return properties.get(name) if value is None else value


# Bodies of valid documents that list no event ({"DocumentIncarnation": 7, "Events": []} and its variants): a
# quiet fleet sends few distinct ones, so each is parsed once. Bounded: cleared when full.
_QUIET: set[bytes] = set()
QUIET_BODIES = 4096


def read_events(body: bytes, vm_name: str) -> tuple[tuple[FleetEvent, ...], int]:
    """The document's events for this VM, and how many warnings parsing it gave."""
    if body in _QUIET:  # most of a fleet, most of the time: parsed once, the same for every VM
        return (), 0
    document = parse_body(body)
    events, warnings = fleet_events(document, vm_name), len(document.warnings)
    if not events and not warnings and len(body) <= 256:
        if len(_QUIET) >= QUIET_BODIES:
            _QUIET.clear()
        _QUIET.add(body)
    return events, warnings


_KEYS = {name: name.encode() for name in KNOWN_PROPERTIES}  # the SDK hands property names over as bytes
_KNOWN_KEYS = frozenset(KNOWN_PROPERTIES) | frozenset(_KEYS.values())


def _string(value: Any) -> str | None:
    """A string property as text; absent is empty; anything else None (not our envelope)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return None


@dataclass
class PartitionState:
    """The VMs of one partition and the sequence number of the last event folded into them."""

    vms: dict[str, VmState] = field(default_factory=dict)
    position: int | None = None  # Event Hubs sequence number of the last event handled
    restored_position: int | None = None  # events at or below it are already in ``vms`` (from the state blob)


class Fleet:
    """Every owned partition's state. The consumer's loop changes it; scrapes read it from other threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[str, PartitionState] = {}

    def claim(self, partition_id: str, state: PartitionState | None = None) -> None:
        with self._lock:
            self._partitions[partition_id] = state or PartitionState()

    def release(self, partition_id: str) -> int:
        """Forget a partition (its VMs leave /metrics with it); how many VMs it held."""
        with self._lock:
            state = self._partitions.pop(partition_id, None)
        return len(state.vms) if state else 0

    def owned(self) -> list[str]:
        with self._lock:
            return sorted(self._partitions)

    def already_applied(self, partition_id: str, sequence_number: int) -> bool:
        """An event replayed from the checkpoint that the restored state already holds."""
        state = self._partitions.get(partition_id)
        restored = state.restored_position if state else None
        return restored is not None and sequence_number <= restored

    def handled(self, partition_id: str, sequence_number: int) -> None:
        """Record that an event was dealt with (applied, dropped or invalid): the next checkpoint may pass it."""
        with self._lock:
            state = self._partitions.get(partition_id)
            if state is not None and (state.position is None or sequence_number > state.position):
                state.position = sequence_number

    def apply(self, partition_id: str, message: Message, sequence_number: int | None = None) -> str:
        """Fold one document in: 'applied', 'resend' or 'older' (see the module docstring); 'unowned' if the
        partition was released meanwhile. With ``sequence_number``, also what ``handled`` records."""
        new = message.vm
        with self._lock:
            state = self._partitions.get(partition_id)
            if state is None:
                return "unowned"
            if sequence_number is not None and (state.position is None or sequence_number > state.position):
                state.position = sequence_number
            current = state.vms.get(new.key)
            if current is not None and current.installation == new.installation:
                if new.sequence == current.sequence:
                    return "resend"
                if new.sequence < current.sequence:
                    return "older"
            state.vms[new.key] = new
            return "applied"

    def expire(self, cutoffs: Mapping[str, float]) -> list[VmState]:
        """Forget the VMs of each partition last seen before its cutoff; return them."""
        gone: list[VmState] = []
        with self._lock:
            for partition_id, oldest in cutoffs.items():
                state = self._partitions.get(partition_id)
                if state is None:
                    continue
                stale = [key for key, vm in state.vms.items() if vm.seen_at < oldest]
                gone.extend(state.vms.pop(key) for key in stale)
        return gone

    def vms(self) -> list[VmState]:
        """A consistent list for one scrape (the values are immutable; only the dicts change)."""
        with self._lock:
            return [vm for state in self._partitions.values() for vm in state.vms.values()]

    def position(self, partition_id: str) -> int | None:
        with self._lock:
            state = self._partitions.get(partition_id)
            return state.position if state else None

    def dump(self, partition_id: str) -> tuple[bytes, int] | None:
        """The partition's state as bytes and the position they reflect, or None before any event."""
        with self._lock:
            state = self._partitions.get(partition_id)
            if state is None or state.position is None:
                return None
            position, vms = state.position, list(state.vms.values())
        return encode(partition_id, position, vms), position


def encode(partition_id: str, position: int, vms: Iterable[VmState]) -> bytes:
    """gzip'd JSON: the documents as forwarded, plus what ordering needs (installation, sequence, seen_at)."""
    rows = [[vm.key, vm.vm_id, vm.vm_name, vm.vmss_name, vm.location, vm.installation, vm.sequence, vm.seen_at,
             vm.body.decode("utf-8")] for vm in vms]
    text = json.dumps({"format": STATE_FORMAT, "partition_id": partition_id, "sequence_number": position,
                       "vms": rows}, ensure_ascii=False, separators=(",", ":"))
    return gzip.compress(text.encode(), compresslevel=1)


def decode(data: bytes) -> PartitionState:
    """The inverse of ``encode``; raise ValueError on anything else (the caller must not overwrite it)."""
    try:
        obj = json.loads(gzip.decompress(data))
        if obj.get("format") != STATE_FORMAT:
            raise ValueError(f"unknown state format {obj.get('format')!r}")
        position = int(obj["sequence_number"])
        vms = {}
        for key, vm_id, vm_name, vmss_name, location, installation, sequence, seen_at, body in obj["vms"]:
            raw = body.encode("utf-8")
            vms[key] = VmState(key, vm_id, vm_name, vmss_name, location, installation, int(sequence), float(seen_at),
                               raw, read_events(raw, vm_name)[0])
    except (OSError, EOFError, KeyError, TypeError, ValueError, InvalidMessage) as exc:
        raise ValueError(f"unreadable fleet state ({_short(exc)})") from None
    return PartitionState(vms=vms, position=position, restored_position=position)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."
