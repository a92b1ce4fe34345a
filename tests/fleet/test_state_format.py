"""The state format: a base block and delta blocks as concatenated gzip members, read back whole or refused whole,
and the change tracking in the fleet's core that decides what a delta carries."""

from __future__ import annotations

import dataclasses
import gzip
import json
from typing import Any

import pytest

from se_exporter.core.properties import Property
from se_exporter.fleet import message as messages
from se_exporter.fleet import stateformat
from se_exporter.fleet.message import VM_STATE_FIELDS, Bounds, Message, VmState
from se_exporter.fleet.stateformat import DamagedState, NewerState, decode, encode_base, encode_delta
from se_exporter.fleet.vms import Fleet
from tests.fleet.test_vms import FREEZE, GOOD, NOW, VM_ID, message, props, read_message

BIG = json.dumps({"DocumentIncarnation": 9, "Events": [
    {"EventId": f"EVENT-{n:04d}-{'x' * 40}", "EventType": "Freeze", "ResourceType": "VirtualMachine",
     "Resources": [f"WestNO_{n}"], "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT",
     "EventSource": "Platform", "DurationInSeconds": 5, "Description": f"maintenance {n}"}
    for n in range(20)]}).encode()


def vm(key: str, sequence: int = 1, seen_at: float = 1000.0, body: bytes = FREEZE, **extra: Any) -> VmState:
    return read_message(body, props(sequence, vm_id=key, **extra), f"inst-{key}:{sequence}".encode(), key.encode(),
                        seen_at, 1024 * 1024).vm


def member(obj: object) -> bytes:
    return gzip.compress(json.dumps(obj).encode())


def test_a_base_and_its_deltas_read_back_as_the_state_they_add_up_to() -> None:
    """Changed VMs replace, touched ones take the heartbeat's fields, gone ones leave; the position is the last
    delta's and each block's id and size are known."""
    a, b, c = vm("vm-a"), vm("vm-b"), vm("vm-c")
    base = encode_base("0", 5, [a, b, c], "block-000001")
    a2 = vm("vm-a", 2, 1100.0, body=b'{"DocumentIncarnation": 4, "Events": []}')
    b2 = vm("vm-b", 3, 1200.0, imds_last_success="2026-11-22T03:00:00.000Z", imds_failing=True)
    first = encode_delta(8, "block-000002", [a2], [b2], ["vm-c"])
    d = vm("vm-d", seen_at=1300.0)
    second = encode_delta(9, "block-000003", [d], [], [])
    decoded = decode(base + first + second, "0", NOW)
    assert (decoded.position, decoded.dropped) == (9, {})
    assert decoded.vms == {"vm-a": a2, "vm-b": b2, "vm-d": d}
    assert decoded.blocks == [("block-000001", len(base)), ("block-000002", len(first)),
                              ("block-000003", len(second))]


def test_a_heartbeat_costs_bytes_in_proportion_to_itself_not_to_the_vms_document() -> None:
    """A VM whose only change is a heartbeat is written as its key, sequence, time and IMDS health: a delta far
    smaller than the VM's document, and smaller still than the VM written whole."""
    big = vm("vm-a", body=BIG)
    beat = vm("vm-a", 2, 1300.0, body=BIG)
    heartbeat = encode_delta(9, "block-000002", [], [beat], [])
    whole = encode_delta(9, "block-000002", [beat], [], [])
    assert len(BIG) > 5_000 and len(heartbeat) < 200, (len(BIG), len(heartbeat))
    assert len(heartbeat) * 4 < len(whole)
    assert decode(encode_base("0", 5, [big], "block-000001") + heartbeat, "0", NOW).vms == {"vm-a": beat}


@pytest.mark.parametrize("delta", [
    b"not gzip",
    gzip.compress(b'{"block": "b2", "sequence_number": 9, "vms": []')[:-3],  # truncated
    member({"block": "b2", "sequence_number": 9, "vms": [], "touched": []}),  # no gone
    member({"block": "b2", "sequence_number": 4, "vms": [], "touched": [], "gone": []}),  # moves back
    member({"block": "b2", "sequence_number": 9, "vms": [], "touched": [], "gone": [5]}),
    member({"sequence_number": 9, "vms": [], "touched": [], "gone": []}),  # no block id
    member([1, 2]),
])
def test_a_damaged_delta_makes_the_whole_state_damaged(delta: bytes) -> None:
    """No prefix of the blocks is used: it would be a state at a position it does not hold."""
    with pytest.raises(DamagedState):
        decode(encode_base("0", 5, [vm("vm-a")], "b1") + delta, "0", NOW)


def test_a_bad_vm_or_heartbeat_in_a_delta_is_a_row_left_out_and_counted() -> None:
    """Within a delta a VM out of range, or a heartbeat for a VM the state does not hold, is one row dropped."""
    bad = {"key": "vm-x", "vm_id": 5}
    delta = member({"block": "b2", "sequence_number": 9, "vms": [bad], "gone": [],
                    "touched": [["vm-unknown", 2, 1000.0, None, None, None], ["vm-a", 0, 1000.0, None, None, None]]})
    decoded = decode(encode_base("0", 5, [vm("vm-a")], "b1") + delta, "0", NOW)
    assert list(decoded.vms) == ["vm-a"] and decoded.dropped == {"row": 3} and decoded.position == 9


def test_a_base_past_the_vm_bound_counts_each_row_left_out_once() -> None:
    """Rows past vms_per_partition are counted under that bound, a row out of shape before them under "row" only."""
    data = member({"format": 3, "block": "b1", "partition_id": "0", "sequence_number": 9,
                   "vms": [{"key": "vm-x", "vm_id": 5}, *(json.loads(gzip.decompress(encode_base(
                       "0", 9, [vm("vm-a"), vm("vm-b"), vm("vm-c")], "b0")))["vms"])]})
    decoded = decode(data, "0", NOW, Bounds(vms_per_partition=2))
    assert list(decoded.vms) == ["vm-a", "vm-b"] and decoded.dropped == {"row": 1, "vms_per_partition": 1}


def test_reading_is_bounded_in_blocks_inflated_bytes_and_values_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """More blocks than MAX_MEMBERS, more bytes inflated over all blocks than MAX_STATE_BYTES, or a block of more
    JSON values than the VMs a partition keeps need: damaged, before the rest is read."""
    base, empty = encode_base("0", 5, [vm("vm-a")], "b1"), encode_delta(5, "b2", [], [], [])
    monkeypatch.setattr(stateformat, "MAX_MEMBERS", 4)
    decode(base + empty * 3, "0", NOW)
    with pytest.raises(DamagedState, match="more than 4 blocks"):
        decode(base + empty * 4, "0", NOW)
    monkeypatch.setattr(stateformat, "MAX_STATE_BYTES", len(gzip.decompress(base)) + 10)
    with pytest.raises(DamagedState, match="inflates past"):
        decode(base + empty, "0", NOW)
    monkeypatch.undo()
    many = member({"block": "b2", "sequence_number": 9, "vms": [], "touched": [], "gone": ["k"] * 2000})
    with pytest.raises(DamagedState, match="JSON values"):
        decode(base + many, "0", NOW, Bounds(vms_per_partition=2))


def test_a_format_above_this_releases_is_a_newer_releases_whatever_follows_it() -> None:
    """Format 4, with blocks after it or not, is the error the state store meets by leaving the state in place."""
    newer = member({"format": 4, "partition_id": "0", "sequence_number": 7})
    for data in (newer, newer + encode_delta(9, "b2", [], [], []), newer + b"not gzip"):
        with pytest.raises(NewerState) as caught:
            decode(data, "0", NOW)
        assert caught.value.format == 4


def test_a_base_names_every_field_and_reads_back_the_same_vms() -> None:
    """A VM is an object of named fields, IMDS health and its place included, and decodes to what was encoded."""
    failing = message(imds_last_success="2026-11-22T03:00:00.000Z", imds_failing=True,
                      observed_at="2026-11-22T03:04:28.024Z").vm
    data = encode_base("0", 9, [failing], "b1")
    assert set(json.loads(gzip.decompress(data))["vms"][0]) == {
        "key", "vm_id", "vm_name", "vmss_name", "location", "installation", "sequence", "seen_at", "body", "imds",
        "subscription_id", "resource_group"} == {name for name, f in VM_STATE_FIELDS.items()
                                                 if f.stored == "always" or f.kind == "heartbeat" or
                                                 name in ("subscription_id", "resource_group")}
    decoded = decode(data, "0", NOW)
    assert (decoded.position, list(decoded.vms.values())) == (9, [failing])
    assert (failing.subscription_id, failing.resource_group) == ("sub", "rg")


def test_a_field_stored_when_known_is_left_out_while_unknown_and_read_back_as_unknown() -> None:
    """Each ``when_known`` field of ``VM_STATE_FIELDS`` is absent from the row of a VM that does not know it, and
    such a row reads back as that VM; the ``always`` fields are in every row."""
    vm = message().vm
    unknown = dataclasses.replace(vm, **{f.name: f.default for f in dataclasses.fields(VmState)
                                         if VM_STATE_FIELDS[f.name].stored == "when_known"})
    [row] = json.loads(gzip.decompress(encode_base("0", 1, [unknown], "b1")))["vms"]
    assert set(row) == {name for name, f in VM_STATE_FIELDS.items() if f.stored == "always"}
    assert list(decode(encode_base("0", 1, [unknown], "b1"), "0", NOW).vms.values()) == [unknown]


def test_fields_a_reader_does_not_know_are_ignored_and_a_bad_place_is_unknown() -> None:
    """A field added later is not damage: the VM is read without it; a subscription or resource group out of shape
    reads as unknown, and the VM is kept."""
    text = json.dumps({"format": 3, "block": "b1", "partition_id": "0", "sequence_number": 9, "later": 1,
                       "vms": [{**GOOD, "zone": "1", "imds": {"failing": True, "later": 2}, "subscription_id": 5,
                                "resource_group": "\ud800"}]})
    [vm] = decode(gzip.compress(text.encode()), "0", NOW).vms.values()
    assert (vm.vm_name, vm.imds.failing, vm.subscription_id, vm.resource_group) == ("WestNO_0", True, "", "")


def fleet_with(*vms: VmState) -> Fleet:
    fleet = Fleet()
    fleet.claim("0")
    for number, each in enumerate(vms, 1):
        fleet.apply("0", message_of(each), number)
    return fleet


def message_of(state: VmState) -> Message:
    return Message(state, f"{state.installation}:{state.sequence}", heartbeat=False)


def test_the_core_tells_new_and_changed_vms_from_heartbeats_and_records_the_gone() -> None:
    """A new VM or a new document is whole, a later sequence with the same document only touched, an expired VM
    gone; a settled write forgets what it held."""
    fleet = fleet_with(vm("vm-a"), vm("vm-b"))
    snapshot = fleet.snapshot("0")
    assert snapshot is not None and [v.key for v in snapshot.changed] == ["vm-a", "vm-b"] and not snapshot.touched
    fleet.settle("0", snapshot.tick)
    fleet.apply("0", message(sequence=2, seen_at=2000.0), 3)  # another VM, message()'s own id: new
    fleet.apply("0", message_of(vm("vm-a", 2, 2000.0)), 4)  # heartbeat
    fleet.apply("0", message_of(vm("vm-b", 2, 2000.0, body=BIG)), 5)  # a change
    fleet.expire({"0": 1500.0})  # nothing: all seen at 2000
    snapshot = fleet.snapshot("0")
    assert snapshot is not None and sorted(v.key for v in snapshot.changed) == [VM_ID, "vm-b"]
    assert [v.key for v in snapshot.touched] == ["vm-a"] and snapshot.position == 5
    fleet.settle("0", snapshot.tick)
    fleet.apply("0", message_of(vm("vm-c", seen_at=100.0)), 6)
    fleet.expire({"0": 1500.0})
    snapshot = fleet.snapshot("0")
    assert snapshot is not None and (snapshot.changed, snapshot.touched, snapshot.gone) == ([], [], ["vm-c"])


def test_a_change_made_during_a_write_or_before_a_failed_one_is_kept() -> None:
    """Settling up to a snapshot's tick keeps a change made after it (a heartbeat after a change in flight is only
    touched); not settling (the write failed) keeps all, and a heartbeat after an unwritten change writes the VM
    whole."""
    fleet = fleet_with(vm("vm-a"))
    first = fleet.snapshot("0")
    fleet.apply("0", message_of(vm("vm-a", 2, 1100.0)), 2)  # while the first write is in flight
    assert first is not None
    fleet.settle("0", first.tick)
    snapshot = fleet.snapshot("0")
    assert snapshot is not None and [v.sequence for v in snapshot.touched] == [2] and not snapshot.changed
    fleet.apply("0", message_of(vm("vm-a", 3, 1200.0, body=BIG)), 3)  # a change, not written (the write fails)
    fleet.apply("0", message_of(vm("vm-a", 4, 1300.0, body=BIG)), 4)  # then a heartbeat
    snapshot = fleet.snapshot("0")
    assert snapshot is not None and [v.sequence for v in snapshot.changed] == [4] and not snapshot.touched


def test_too_many_gone_keys_ask_for_a_whole_state_instead() -> None:
    """VMs coming and going while writes fail would grow the gone keys without bound: past vms_per_partition they
    are dropped and the next write must be a base."""
    fleet = Fleet(Bounds(vms_per_partition=2))
    fleet.claim("0")
    for number, key in enumerate(["vm-a", "vm-b", "vm-c"], 1):
        fleet.apply("0", message_of(vm(key, seen_at=100.0)), number)
        fleet.expire({"0": 500.0})
    snapshot = fleet.snapshot("0")
    assert snapshot is not None and snapshot.rebase and snapshot.gone == []
    fleet.settle("0", snapshot.tick)
    snapshot = fleet.snapshot("0")
    assert snapshot is not None and not snapshot.rebase


KEPT = (Property("os_type", False, "text", "the VM's OS", kept=True),
        Property("booted_at", False, "time", "when the VM booted", kept=True),
        Property("spot", False, "flag", "whether the VM is a Spot VM", kept=True),
        Property("cores", False, "integer", "the VM's cores", kept=True))


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """``KEPT`` declared in ``core/properties.py``, as the fleet's reader and its state see it."""
    monkeypatch.setattr(messages, "KEPT", KEPT)
    monkeypatch.setattr(stateformat, "KEPT", KEPT)
    for declared in KEPT:
        monkeypatch.setitem(messages._KEYS, declared.name, declared.name.encode())


@pytest.mark.usefixtures("kept")
def test_a_kept_property_is_read_by_its_kind_stored_and_read_back() -> None:
    """A property declared ``kept`` reaches ``VmState.reported`` as its kind reads it, is written to the state only
    when sent, and comes back from it equal: the fleet figure of a new fact needs no change of the fleet's reader or
    its state (docs/development.md, "How to add a fleet figure")."""
    read = message(os_type="Linux", booted_at="2026-11-22T03:00:00.000Z", spot=True, cores="12").vm
    assert read.reported == (("os_type", "Linux"), ("booted_at", 1795316400.0), ("spot", True), ("cores", 12))
    assert (read.value("os_type"), read.value("spot"), read.value("unsent")) == ("Linux", True, None)
    data = encode_base("0", 9, [read, message(sequence=2).vm], "b1")
    rows = json.loads(gzip.decompress(data))["vms"]
    assert rows[0]["reported"] == {"os_type": "Linux", "booted_at": 1795316400.0, "spot": True, "cores": 12}
    assert "reported" not in rows[1]  # a sidecar that sent none of them
    assert next(iter(decode(data, "0", NOW).vms.values())) == read
    with pytest.raises(messages.InvalidMessage, match="'spot' is not a boolean"):
        message(spot="yes")


@pytest.mark.usefixtures("kept")
def test_a_kept_value_out_of_its_kind_in_the_state_is_left_out() -> None:
    """A state edited by hand (or a newer release's) holding a kept value of another type keeps the VM, without it."""
    read = message(os_type="Linux", spot=True).vm
    row = json.loads(gzip.decompress(encode_base("0", 9, [read], "b1")))["vms"][0]
    row["reported"] = {"os_type": 7, "spot": True, "booted_at": 1e300, "cores": "12", "newer": "x"}
    [back] = decode(member({"format": stateformat.STATE_FORMAT, "block": "b1", "partition_id": "0",
                            "sequence_number": 9, "vms": [row]}), "0", NOW).vms.values()
    assert back.reported == (("spot", True),)
