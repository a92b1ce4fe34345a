"""A partition's state as bytes and back: gzip'd JSON, every field checked on the way in.

The state is one gzip stream of members, each one block of a block blob: a BASE holding every VM and the position
(sequence number) they reflect, then DELTAs of what changed since the block before (docs/fleet.md, "State cost")::

    {"format": 3, "block": "5f0c1e2d3a4b", "partition_id": "3", "sequence_number": 4711,
     "vms": [{"key": ..., "vm_id": ..., "vm_name": ..., "vmss_name": ..., "location": ..., "installation": ...,
              "sequence": ..., "seen_at": ..., "body": ..., "imds": {"observed_at": ..., "last_success": ...,
              "failing": ...}, "subscription_id": ..., "resource_group": ...}, ...]}
    {"block": "9a8b7c6d5e4f", "sequence_number": 4790,
     "vms": [<a VM as in the base>, ...],                      # VMs new or changed beyond a heartbeat
     "touched": [[key, sequence, seen_at, observed_at, last_success, failing], ...],  # a heartbeat: no body
     "gone": [key, ...]}                                       # expired or forgotten

A delta's position never goes back, and any delta out of shape makes the whole state damaged: a prefix would be a
state at the wrong position. A reader ignores fields it does not know (a field ``VM_STATE_FIELDS`` stores
``when_known``, such as ``reported``, the kept properties by name, is written only when known); a change it must not
ignore takes a new format number. A row out of type or range is left out (counted as a "row", never written back); on
``DamagedState`` the partition is read from its checkpoint alone, and the next write replaces the state.
"""

from __future__ import annotations

import gzip
import json
import math
import operator
import sys
import zlib
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from se_exporter.core.model import encodable
from se_exporter.core.properties import KEPT
from se_exporter.fleet.message import (
    DEFAULT_BOUNDS,
    MAX_MESSAGE_ID,
    MAX_SEQUENCE,
    MAX_TEXT,
    MAX_TIME,
    MIN_TIME,
    NO_IMDS,
    VM_STATE_FIELDS,
    Bounds,
    Imds,
    InvalidMessage,
    Reported,
    VmState,
    read_events,
    read_pauses,
    reduced_body,
)

STATE_FORMAT = 3  # the one format this release reads and writes
MAX_MEMBERS = 1024  # gzip members (blocks) a state may hold: a writer compacts long before (statestore)
MAX_SKEW = 600.0  # seconds a row's seen_at may lie past this replica's clock (Event Hubs' clock, not ours)
MAX_STATE_BYTES = 512 * 1024**2  # decompressed: 100,000 VMs of 64 KiB bodies would be 6.4 GB; real ones are ~30 MB
MAX_ROW_BODY = 1024 * 1024  # a body as forwarded, up to the Event Hubs limit (kept reduced past bounds.body_bytes)
# JSON values a state may hold per VM it may keep, plus MAX_VALUES_TOP (a VM is about 15): each value costs Python
# 30-80 bytes however short its text, so under the inflated-bytes cap alone a few dozen KB of gzip held gigabytes. A
# blob of more is damaged, refused before it is parsed.
MAX_VALUES_PER_VM = 64
MAX_VALUES_TOP = 1024
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'"[{,:'))  # what the value count deletes before it splits strings
# What a VM's row must have, in the order ``_vm`` reads them (message.VM_STATE_FIELDS); other fields are ignored.
NAMED_FIELDS_ORDER = tuple(name for name, f in VM_STATE_FIELDS.items() if f.stored == "always")
NAMED_FIELDS = frozenset(NAMED_FIELDS_ORDER)
_always = operator.attrgetter(*NAMED_FIELDS_ORDER)


class DamagedState(ValueError):
    """A state blob that is not a state this release can read; ``reason`` is the label it is counted under."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NewerState(ValueError):
    """A state blob of a format newer than this release's: it must be left for the release that wrote it."""

    def __init__(self, found: int) -> None:
        super().__init__(f"state format {found} is newer than this release's {STATE_FORMAT}")
        self.format = found


@dataclass
class Decoded:
    """A state read back: its VMs, the position they reflect, and the rows left out, by reason."""

    vms: dict[str, VmState]
    position: int
    dropped: Tally[str] = field(default_factory=Tally)
    blocks: list[tuple[str, int]] = field(default_factory=list)  # each block's id and gzip'd bytes


def encode_base(partition_id: str, position: int, vms: Iterable[VmState], block: str) -> bytes:
    """The first block: every VM, as forwarded plus what ordering needs (installation, sequence, seen_at)."""
    return _gzip({"format": STATE_FORMAT, "block": block, "partition_id": partition_id, "sequence_number": position,
                  "vms": [_named(vm) for vm in vms]})


def encode_delta(position: int, block: str, changed: Iterable[VmState], touched: Iterable[VmState],
                 gone: Iterable[str]) -> bytes:
    """A block after the base: whole VMs for what changed beyond a heartbeat, only the fields a heartbeat
    moves for ``touched``, the keys of ``gone``."""
    return _gzip({"block": block, "sequence_number": position, "vms": [_named(vm) for vm in changed],
                  "touched": [[vm.key, vm.sequence, vm.seen_at, vm.imds.observed_at, vm.imds.last_success,
                               vm.imds.failing] for vm in touched],
                  "gone": list(gone)})


def _gzip(state: dict[str, Any]) -> bytes:
    text = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return gzip.compress(text.encode("utf-8", "backslashreplace"), compresslevel=1)


def _named(vm: VmState) -> dict[str, Any]:
    named: dict[str, Any] = dict(zip(NAMED_FIELDS_ORDER, _always(vm), strict=True))  # VM_STATE_FIELDS' "always"
    named["body"] = vm.body.decode("utf-8", "replace")
    if vm.imds is not NO_IMDS:
        named["imds"] = {"observed_at": vm.imds.observed_at, "last_success": vm.imds.last_success,
                         "failing": vm.imds.failing}
    if vm.subscription_id or vm.resource_group:
        named["subscription_id"], named["resource_group"] = vm.subscription_id, vm.resource_group
    if vm.reported:
        named["reported"] = dict(vm.reported)
    return named


def decode(data: bytes, partition_id: str, now: float, bounds: Bounds = DEFAULT_BOUNDS) -> Decoded:
    """The inverse of ``encode_base`` and ``encode_delta``; raise ``DamagedState`` or ``NewerState``."""
    max_values = bounds.vms_per_partition * MAX_VALUES_PER_VM + MAX_VALUES_TOP
    members = inflated(data, MAX_STATE_BYTES)
    text, size = next(members)
    obj = _parse(text, max_values)
    del text
    if not isinstance(obj, dict):
        raise DamagedState("wrong_shape", f"the state is a JSON {type(obj).__name__}, not an object")
    found = obj.get("format")
    if type(found) is int and found > STATE_FORMAT:
        raise NewerState(found)
    if found != STATE_FORMAT or type(found) is not int:
        raise DamagedState("format", f"unknown state format {str(found)[:40]!r}")
    if obj.get("partition_id", partition_id) != partition_id:
        raise DamagedState("wrong_shape", f"the state is partition {str(obj.get('partition_id'))[:40]!r}'s")
    position, rows = obj.get("sequence_number"), obj.get("vms")
    if type(position) is not int or not -1 <= position <= MAX_SEQUENCE:
        raise DamagedState("wrong_shape", f"sequence_number {str(position)[:40]!r} is not an Event Hubs sequence "
                           "number")
    if not isinstance(rows, list):
        raise DamagedState("wrong_shape", "'vms' is not a list")
    decoded = Decoded({}, position, blocks=[(_block(obj), size)])
    for index, row in enumerate(rows):
        if len(decoded.vms) >= bounds.vms_per_partition:
            decoded.dropped["vms_per_partition"] += len(rows) - index  # the rows not read
            break
        vm = _vm(row, now, bounds)
        if vm is None or vm.key in decoded.vms:
            decoded.dropped["row"] += 1
            continue
        decoded.vms[vm.key] = vm
    for text, size in members:
        delta = _parse(text, max_values)
        del text
        decoded.blocks.append((_block(delta), size))
        _apply(decoded, delta, now, bounds)
    return decoded


def inflated(data: bytes, limit: int) -> Iterator[tuple[bytes, int]]:
    """Each gzip member's inflated text and its gzip'd size; at most ``MAX_MEMBERS`` of them, ``limit`` bytes
    inflated in all (a small blob must not inflate to gigabytes)."""
    budget, rest = limit, data
    for _member in range(MAX_MEMBERS):
        try:
            inflate = zlib.decompressobj(wbits=31)
            text = inflate.decompress(rest, budget)
        except zlib.error as exc:
            raise DamagedState("unreadable", f"not gzip ({str(exc)[:200]})") from None
        if inflate.unconsumed_tail or (len(text) == budget and not inflate.eof):
            raise DamagedState("unreadable", f"the state inflates past {limit} bytes")
        if not inflate.eof:
            raise DamagedState("unreadable", "the state is truncated gzip")
        budget -= len(text)
        size, rest = len(rest) - len(inflate.unused_data), inflate.unused_data
        yield text, size
        if not rest:
            return
        if budget <= 0:  # zlib reads a max_length of 0 as no limit at all
            raise DamagedState("unreadable", f"the state inflates past {limit} bytes")
    raise DamagedState("unreadable", f"the state has more than {MAX_MEMBERS} blocks")


def _parse(text: bytes, max_values: int) -> Any:
    """One member's JSON, its values counted before it is parsed."""
    if (values := _values(text, max_values)) > max_values:
        raise DamagedState("unreadable", f"the state holds more than {max_values} JSON values ({values}), more than "
                           "the VMs a partition keeps need")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DamagedState("unreadable", f"not gzip'd JSON ({str(exc)[:200] or type(exc).__name__})") from None


def _block(obj: Any) -> str:
    block = obj.get("block") if isinstance(obj, dict) else None
    if not isinstance(block, str) or not 1 <= len(block) <= 64:
        raise DamagedState("wrong_shape", "a block without its block id")
    return block


def _apply(decoded: Decoded, delta: Any, now: float, bounds: Bounds) -> None:
    """Fold one delta (a dict: ``_block`` read it) into what the blocks before it gave."""
    position, changed, touched, gone = (delta.get(name) for name in ("sequence_number", "vms", "touched", "gone"))
    if type(position) is not int or not decoded.position <= position <= MAX_SEQUENCE:
        raise DamagedState("wrong_shape", f"a delta's sequence_number {str(position)[:40]!r} is not one at or past "
                           f"{decoded.position}")
    if not (isinstance(changed, list) and isinstance(touched, list) and isinstance(gone, list)):
        raise DamagedState("wrong_shape", "a delta's 'vms', 'touched' or 'gone' is not a list")
    decoded.position = position
    vms = decoded.vms
    for key in gone:  # first: a delta's keys are distinct, and a VM gone makes room for a new one
        if not isinstance(key, str):
            raise DamagedState("wrong_shape", "a delta's 'gone' holds a key that is not a string")
        vms.pop(key, None)
    for named in changed:
        if (vm := _vm(named, now, bounds)) is None:
            decoded.dropped["row"] += 1
        elif vm.key not in vms and len(vms) >= bounds.vms_per_partition:
            decoded.dropped["vms_per_partition"] += 1
        else:
            vms[vm.key] = vm
    for entry in touched:
        if (vm := _touched(entry, vms, now)) is None:
            decoded.dropped["row"] += 1
        else:
            vms[vm.key] = vm


def _touched(entry: Any, vms: dict[str, VmState], now: float) -> VmState | None:
    """A held VM after a heartbeat (its sequence, seen_at and IMDS health), or None when out of type or range."""
    if not isinstance(entry, list) or len(entry) != 6 or not isinstance(entry[0], str) or entry[0] not in vms:
        return None
    key, sequence, seen_at, *imds = entry
    if not _sequenced(sequence, seen_at, now):
        return None
    return replace(vms[key], sequence=sequence, seen_at=float(seen_at), imds=_imds(*imds))


def _sequenced(sequence: Any, seen_at: Any, now: float) -> bool:
    """A VM's sequence in range, and its ``seen_at`` a finite time no later than ``now`` allows."""
    return type(sequence) is int and 1 <= sequence <= MAX_SEQUENCE and type(seen_at) in (int, float) \
        and math.isfinite(seen_at) and 0 <= seen_at <= now + MAX_SKEW


def _values(text: bytes, enough: int) -> int:
    """At most how many JSON values (object keys included) ``text`` holds: one plus the ``[ { , :`` outside strings
    (every value but the first follows one of them). Counted over the whole text first (in C, no copy), and only
    when that passes ``enough`` again without what is inside strings: escaped backslashes and quotes taken out,
    then all but quotes and ``[ { , :``, so every quote left opens or closes a string."""
    rough = 1 + text.count(b"[") + text.count(b"{") + text.count(b",") + text.count(b":")
    if rough <= enough:
        return rough
    reduced = text.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    return 1 + len(b"".join(reduced.split(b'"')[::2]))


def _vm(named: Any, now: float, bounds: Bounds) -> VmState | None:
    """One VM of a state (fields it does not know ignored), or None when any is out of type or range."""
    if not isinstance(named, dict) or not named.keys() >= NAMED_FIELDS:
        return None
    key, vm_id, vm_name, vmss_name, location, installation, sequence, seen_at, body = (
        named[name] for name in NAMED_FIELDS_ORDER)
    if not (all(_text(value, MAX_TEXT) for value in (vm_id, vm_name, vmss_name, location))
            and key == (vm_id or vm_name or "unknown") and _text(installation, MAX_MESSAGE_ID) and installation != ""
            and _sequenced(sequence, seen_at, now) and isinstance(body, str) and len(body) <= MAX_ROW_BODY):
        return None
    try:
        raw = body.encode("utf-8")
        events, _warnings, _bounds = read_events(raw, vm_name, bounds)
    except (UnicodeEncodeError, InvalidMessage):
        return None
    if len(raw) > bounds.body_bytes:
        raw = reduced_body(events, vm_name)
    entry = named.get("imds")
    imds = _imds(entry.get("observed_at"), entry.get("last_success"), entry.get("failing")) \
        if isinstance(entry, dict) else NO_IMDS
    return VmState(key, vm_id, vm_name, sys.intern(vmss_name), sys.intern(location), installation, sequence,
                   float(seen_at), raw, events, imds,  # interned as message.read_message does
                   _place(named.get("subscription_id", "")), _place(named.get("resource_group", "")),
                   _reported(named.get("reported")))


def _reported(entry: Any) -> tuple[tuple[str, Reported], ...]:
    """A VM's kept properties from the state, in their declared order; one out of its kind's type or range (or a
    newer release's) is left out, as a sidecar that did not send it."""
    return tuple((p.name, entry[p.name]) for p in KEPT if _of_kind(entry.get(p.name), p.kind)) \
        if isinstance(entry, dict) else ()


def _of_kind(value: Any, kind: str) -> bool:
    """Whether ``value`` is one ``message.read_property`` gives for ``kind``."""
    if kind == "time":
        return type(value) in (int, float) and MIN_TIME <= value < MAX_TIME
    if kind in ("flag", "mark"):
        return isinstance(value, bool)
    if kind in ("sequence", "integer"):
        return type(value) is int and abs(value) <= MAX_SEQUENCE
    if kind == "pauses":
        try:
            return isinstance(value, str) and read_pauses(value) == value
        except InvalidMessage:
            return False
    return _text(value, MAX_TEXT) and value != ""


def _place(value: Any) -> str:
    """A VM's subscription or resource group, interned (many VMs share one); out of shape: unknown (empty)."""
    return sys.intern(value) if _text(value, MAX_TEXT) else ""


def _text(value: Any, limit: int) -> bool:
    """A string a label can carry: bounded, and no unpaired surrogate (JSON can spell one, UTF-8 cannot)."""
    return isinstance(value, str) and len(value) <= limit and encodable(value) == value


def _imds(observed_at: Any, last_success: Any, failing: Any) -> Imds:
    """A VM's IMDS health from the state; anything out of shape is unknown (as from an older sidecar)."""
    times = [value if type(value) in (int, float) and math.isfinite(value) else None
             for value in (observed_at, last_success)]
    flag = failing if isinstance(failing, bool) else None
    return NO_IMDS if times[1] is None and flag is None else Imds(times[0], times[1], flag)
