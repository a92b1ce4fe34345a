"""The previous release's state format, kept as a test fixture: the format-1 reader and writer exactly as
released before format 2 existed (``se_exporter/fleet/stateformat.py`` at that release, its exception classes
aside: those are the ones the state store catches). ``python -m tests.fleet_format1 fleet ...`` runs
``se-exporter fleet`` with it in place of today's, as a replica of that release: it writes format 1 whatever
``--state-format`` says, and a format-2 state is a newer release's to it (left in place, not written over).
The rolling-upgrade test (``tests/integration/test_fleet_upgrade.py``) runs it beside today's replicas.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
import zlib
from collections import Counter as Tally
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from se_exporter.fleet import persistence, picture, stateformat, statestore
from se_exporter.fleet.message import (
    DEFAULT_BOUNDS,
    MAX_MESSAGE_ID,
    MAX_SEQUENCE,
    MAX_TEXT,
    NO_IMDS,
    Bounds,
    Imds,
    InvalidMessage,
    VmState,
    read_events,
    reduced_body,
)

DamagedState = stateformat.DamagedState  # the class the state store catches
STATE_FORMAT = 1
MAX_SKEW = 600.0  # seconds a row's seen_at may lie past this replica's clock (Event Hubs' clock, not ours)
MAX_STATE_BYTES = 512 * 1024**2  # decompressed: 100,000 VMs of 64 KiB bodies would be 6.4 GB; real ones are ~30 MB
MAX_ROW_BODY = 1024 * 1024  # older releases kept whole bodies up to the Event Hubs limit


class NewerState(stateformat.NewerState):
    """As the previous release said it (its format was 1); the class the state store catches."""

    def __init__(self, found: int) -> None:
        ValueError.__init__(self, f"state format {found} is newer than this release's {STATE_FORMAT}")
        self.format = found


@dataclass
class Decoded:
    """A state read back: its VMs, the position they reflect, and the rows left out, by reason."""

    vms: dict[str, VmState]
    position: int
    dropped: Tally[str] = field(default_factory=Tally)


def encode(partition_id: str, position: int, vms: Iterable[VmState]) -> bytes:
    """gzip'd JSON: the documents as forwarded, plus what ordering needs (installation, sequence, seen_at)."""
    rows, imds = [], {}
    for vm in vms:
        rows.append([vm.key, vm.vm_id, vm.vm_name, vm.vmss_name, vm.location, vm.installation, vm.sequence,
                     vm.seen_at, vm.body.decode("utf-8", "replace")])
        if vm.imds is not NO_IMDS:
            imds[vm.key] = [vm.imds.observed_at, vm.imds.last_success, vm.imds.failing]
    text = json.dumps({"format": STATE_FORMAT, "partition_id": partition_id, "sequence_number": position,
                       "vms": rows, "imds": imds}, ensure_ascii=False, separators=(",", ":"))
    return gzip.compress(text.encode("utf-8", "backslashreplace"), compresslevel=1)


def decode(data: bytes, partition_id: str, now: float, bounds: Bounds = DEFAULT_BOUNDS) -> Decoded:
    """The inverse of ``encode``; raise ``DamagedState`` or ``NewerState`` (see the module docstring)."""
    obj = _load(data)
    if not isinstance(obj, dict):
        raise DamagedState("wrong_shape", f"the state is a JSON {type(obj).__name__}, not an object")
    found = obj.get("format")
    if type(found) is int and found > STATE_FORMAT:
        raise NewerState(found)
    if found != STATE_FORMAT or type(found) is not int:
        raise DamagedState("format", f"unknown state format {str(found)[:40]!r}")
    if obj.get("partition_id", partition_id) != partition_id:
        raise DamagedState("wrong_shape", f"the state is partition {str(obj.get('partition_id'))[:40]!r}'s")
    position, rows, imds = obj.get("sequence_number"), obj.get("vms"), obj.get("imds", {})
    if type(position) is not int or not -1 <= position <= MAX_SEQUENCE:
        raise DamagedState("wrong_shape", f"sequence_number {str(position)[:40]!r} is not an Event Hubs sequence "
                           "number")
    if not isinstance(rows, list) or not isinstance(imds, dict):
        raise DamagedState("wrong_shape", "'vms' is not a list (or 'imds' not an object)")
    decoded = Decoded({}, position)
    for row in rows:
        if len(decoded.vms) >= bounds.vms_per_partition:
            decoded.dropped["vms_per_partition"] += len(rows) - len(decoded.vms)
            break
        vm = _row(row, imds, now, bounds)
        if vm is None or vm.key in decoded.vms:
            decoded.dropped["row"] += 1
            continue
        decoded.vms[vm.key] = vm
    return decoded


def _load(data: bytes) -> Any:
    try:
        inflate = zlib.decompressobj(wbits=31)  # gzip, bounded: a small blob must not inflate to gigabytes
        text = inflate.decompress(data, MAX_STATE_BYTES)
        if inflate.unconsumed_tail:
            raise DamagedState("unreadable", f"the state inflates past {MAX_STATE_BYTES} bytes")
        if not inflate.eof:
            raise DamagedState("unreadable", "the state is truncated gzip")
        return json.loads(text)
    except (zlib.error, ValueError, RecursionError) as exc:
        if isinstance(exc, DamagedState):
            raise
        raise DamagedState("unreadable", f"not gzip'd JSON ({str(exc)[:200] or type(exc).__name__})") from None


def _row(row: Any, imds: dict[str, Any], now: float, bounds: Bounds) -> VmState | None:
    """One VM of a state blob, or None when any field is out of type or range."""
    if not isinstance(row, list) or len(row) != 9:
        return None
    key, vm_id, vm_name, vmss_name, location, installation, sequence, seen_at, body = row
    valid = (all(_text(value, MAX_TEXT) for value in (vm_id, vm_name, vmss_name, location))
             and key == (vm_id or vm_name or "unknown") and _text(installation, MAX_MESSAGE_ID) and installation != ""
             and type(sequence) is int and 1 <= sequence <= MAX_SEQUENCE
             and type(seen_at) in (int, float) and math.isfinite(seen_at) and 0 <= seen_at <= now + MAX_SKEW
             and isinstance(body, str) and len(body) <= MAX_ROW_BODY)
    if not valid:
        return None
    try:
        raw = body.encode("utf-8")
        events, _warnings, _bounds = read_events(raw, vm_name, bounds)
    except (UnicodeEncodeError, InvalidMessage):
        return None
    if len(raw) > bounds.body_bytes:
        raw = reduced_body(events, vm_name)
    return VmState(key, vm_id, vm_name, vmss_name, location, installation, sequence, float(seen_at), raw, events,
                   _imds(imds.get(key)))


def _text(value: Any, limit: int) -> bool:
    """A string a label can carry: bounded, and no unpaired surrogate (JSON can spell one, UTF-8 cannot)."""
    if not isinstance(value, str) or len(value) > limit:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _imds(entry: Any) -> Imds:
    """A VM's IMDS health from the state; anything out of shape is unknown (as from an older sidecar)."""
    if not isinstance(entry, list) or len(entry) != 3:
        return NO_IMDS
    observed_at, last_success, failing = entry
    times = [value if type(value) in (int, float) and math.isfinite(value) else None
             for value in (observed_at, last_success)]
    flag = failing if isinstance(failing, bool) else None
    return NO_IMDS if times[1] is None and flag is None else Imds(times[0], times[1], flag)


def install() -> None:
    """Today's replica with the previous release's state format: every reader and writer of the state rebound."""
    def decode_format_1(data: bytes, partition_id: str, now: float, bounds: Bounds = DEFAULT_BOUNDS,
                        ) -> stateformat.Decoded:
        decoded = decode(data, partition_id, now, bounds)  # as that release read it; then in today's shape
        return stateformat.Decoded(decoded.vms, decoded.position, decoded.dropped, format=STATE_FORMAT)

    statestore.decode = decode_format_1

    def encode_format_1(partition_id: str, position: int, vms: Iterable[VmState], state_format: int = 1) -> bytes:
        return encode(partition_id, position, vms)

    picture.encode = encode_format_1
    persistence.encode = encode_format_1  # what the Keeper writes formats 1 and 2 with


if __name__ == "__main__":
    install()
    from se_exporter.__main__ import entry

    sys.exit(entry())
