"""The fleet's core without a network: messages read and checked, ordering, duplicates, expiry, state bytes."""

from __future__ import annotations

import dataclasses
import gzip
import json
from datetime import datetime, timezone
from typing import Any

import pytest

from se_exporter.fleet import stateformat
from se_exporter.fleet.message import (
    VM_STATE_FIELDS,
    Bounds,
    Imds,
    InvalidMessage,
    Message,
    VmState,
    read_message,
    vm_facts,
)
from se_exporter.fleet.stateformat import DamagedState, NewerState, decode, encode_base
from se_exporter.fleet.vms import Fleet, PartitionState, imds_unreachable

VM_ID = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
FREEZE = (b'{"DocumentIncarnation": 2, "Events": [{"EventId": "E1", "EventType": "Freeze", "ResourceType": '
          b'"VirtualMachine", "Resources": ["WestNO_0", "WestNO_1"], "EventStatus": "Scheduled", "NotBefore": '
          b'"Mon, 19 Sep 2050 18:29:47 GMT", "EventSource": "Platform", "DurationInSeconds": 5}]}')
NEIGHBOUR = FREEZE.replace(b'"WestNO_0", ', b"")
EMPTY = b'{"DocumentIncarnation": 3, "Events": []}'
NOW = 1_800_000_000.0


def state_json(obj: object) -> bytes:
    return gzip.compress(json.dumps(obj).encode())


def props(sequence: Any = 1, **extra: Any) -> dict[Any, Any]:
    """Properties as the SDK hands them over: bytes keys and string values."""
    base = {"vm_name": "WestNO_0", "vm_id": VM_ID, "vmss_name": "", "location": "norwayeast", "sequence": sequence,
            "subscription_id": "sub", "resource_group": "rg", "observed_at": "2026-11-22T03:04:28.024Z",
            "api_version": "2020-07-01", "exporter_version": "0.1.0", "document_incarnation": 2, **extra}
    return {key.encode(): value.encode() if isinstance(value, str) else value for key, value in base.items()}


def message(body: bytes = FREEZE, sequence: int = 1, installation: str = "inst-a", seen_at: float = 1000.0,
            **extra: Any) -> Message:
    return read_message(body, props(sequence, **extra), f"{installation}:{sequence}".encode(), VM_ID.encode(),
                        seen_at, 1024 * 1024)


def test_a_forwarded_document_is_read_with_its_vm_and_events() -> None:
    """Identity from the properties, order from the message id, events reduced to what the fleet shows."""
    read = message(seen_at=1234.5)
    vm = read.vm
    assert (vm.key, vm.vm_id, vm.vm_name, vm.vmss_name, vm.location) == (VM_ID, VM_ID, "WestNO_0", "", "norwayeast")
    assert (vm.installation, vm.sequence, vm.seen_at, vm.body) == ("inst-a", 1, 1234.5, FREEZE)
    assert read.heartbeat is False and read.unknown_properties == ()
    [event] = vm.events
    assert (event.event_id, event.event_type, event.event_status, event.event_source) == (
        "e1", "Freeze", "Scheduled", "Platform")
    assert event.affects_this_vm == "true"
    assert event.not_before == datetime(2050, 9, 19, 18, 29, 47, tzinfo=timezone.utc).timestamp()
    assert event.duration_seconds == 5.0


def test_a_neighbours_event_is_marked_as_not_this_vms() -> None:
    """An availability set's event reaches every VM in it; Resources says whose it is."""
    [event] = message(NEIGHBOUR).vm.events
    assert event.affects_this_vm == "false"
    assert not event.counts_for_vm


def test_heartbeat_flag_and_unknown_properties_are_read_not_refused() -> None:
    """A heartbeat is marked by its property; properties this version does not know are listed, not fatal."""
    read = message(heartbeat=True, shard="7")
    assert read.heartbeat is True
    assert read.unknown_properties == ("shard",)


@pytest.mark.parametrize(("body", "properties", "message_id", "reason"), [
    (b"x" * 2048, props(), b"i:1", "too_large"),
    (b"\xff\xfe not text", props(), b"i:1", "not_json"),
    (b"<html>captive portal</html>", props(), b"i:1", "not_json"),
    (b"[1, 2]", props(), b"i:1", "invalid_document"),
    (b'{"Events": [{"EventType": "Reboot"}]}', props(), b"i:1", "invalid_document"),
    (EMPTY, props(), None, "not_envelope"),
    (EMPTY, props(), b"no-colon", "not_envelope"),
    (EMPTY, {b"vm_id": b"x"}, b"i:1", "not_envelope"),
    (EMPTY, props(sequence="seven"), b"i:1", "bad_property"),
    (EMPTY, props(sequence=0), b"i:1", "bad_property"),
    (EMPTY, props(sequence=True), b"i:1", "bad_property"),
    (EMPTY, {**props(), b"vm_name": 7}, b"i:1", "bad_property"),
])
def test_what_is_not_a_forwarded_document_is_refused_with_a_reason(body: bytes, properties: dict[Any, Any],
                                                                   message_id: bytes | None, reason: str) -> None:
    """Every kind of bad message gets the reason it is counted under."""
    with pytest.raises(InvalidMessage) as caught:
        read_message(body, properties, message_id, VM_ID.encode(), 1.0, 1024)
    assert caught.value.reason == reason


def test_a_vm_without_vm_id_or_name_is_kept_under_the_sidecars_own_key() -> None:
    """A sidecar that knows neither its vm_id nor its name sends with the key 'unknown'; nothing else is accepted."""
    properties = {**props(), b"vm_id": b"", b"vm_name": b""}
    assert read_message(EMPTY, properties, b"i:1", b"unknown", 1.0, 1024).vm.key == "unknown"
    with pytest.raises(InvalidMessage) as caught:
        read_message(EMPTY, properties, b"i:1", None, 1.0, 1024)
    assert caught.value.reason == "wrong_partition_key"


def test_the_key_is_the_vm_id_else_the_name_and_must_be_the_partition_key() -> None:
    """Before the sidecar knew its vm_id, its name is the key, as it is the partition key it sends with."""
    read = read_message(EMPTY, {**props(), b"vm_id": b""}, b"i:1", b"WestNO_0", 1.0, 1024)
    assert read.vm.key == "WestNO_0"
    with pytest.raises(InvalidMessage) as caught:
        read_message(EMPTY, {**props(), b"vm_id": b""}, b"i:1", b"WestNO_0-key", 1.0, 1024)
    assert caught.value.reason == "wrong_partition_key"


def test_newer_applies_a_resend_or_an_older_one_does_not() -> None:
    """Within one installation the sequence decides; the same one again is a resend, a lower one older."""
    fleet = Fleet()
    fleet.claim("0")
    assert fleet.apply("0", message(FREEZE, sequence=5)) == "applied"
    assert fleet.apply("0", message(EMPTY, sequence=5)) == "resend"
    assert fleet.apply("0", message(EMPTY, sequence=4)) == "older"
    assert [vm.body for vm in fleet.vms()] == [FREEZE]
    assert fleet.apply("0", message(EMPTY, sequence=6)) == "applied"
    assert [vm.body for vm in fleet.vms()] == [EMPTY]


def test_another_installation_replaces_whatever_its_sequence() -> None:
    """A reinstalled sidecar starts at sequence 1 again: the partition's order decides, not the number."""
    fleet = Fleet()
    fleet.claim("0")
    fleet.apply("0", message(FREEZE, sequence=500, installation="old"))
    assert fleet.apply("0", message(EMPTY, sequence=1, installation="new")) == "applied"
    [vm] = fleet.vms()
    assert (vm.installation, vm.sequence, vm.body) == ("new", 1, EMPTY)


def test_a_released_partition_takes_its_vms_along() -> None:
    """When a partition moves away its VMs leave this replica; a late event for it changes nothing."""
    fleet = Fleet()
    fleet.claim("0")
    fleet.claim("1")
    fleet.apply("0", message(sequence=1))
    fleet.apply("1", message(sequence=1, installation="b"))
    assert fleet.release("0") == 1
    assert fleet.owned() == ["1"]
    assert len(fleet.vms()) == 1
    assert fleet.apply("0", message(sequence=2)) == "unowned"


def test_events_the_restored_state_holds_are_recognised_and_the_position_only_grows() -> None:
    """After a restore at sequence number 41, replayed events up to 41 are known; handled positions never go back."""
    fleet = Fleet()
    fleet.claim("0", PartitionState(position=41, restored_position=41))
    assert fleet.already_applied("0", 41) and fleet.already_applied("0", 3)
    assert not fleet.already_applied("0", 42)
    fleet.handled("0", 45)
    fleet.handled("0", 43)
    assert fleet.position("0") == 45
    assert not fleet.already_applied("1", 1)


def test_expiry_forgets_only_vms_silent_past_their_partitions_cutoff() -> None:
    """Each partition has its own cutoff; a partition without one expires nothing."""
    fleet = Fleet()
    for partition_id in ("0", "1"):
        fleet.claim(partition_id)
    fleet.apply("0", message(seen_at=100.0, installation="a"))
    fleet.apply("1", message(seen_at=100.0, installation="b"))
    fleet.apply("1", read_message(EMPTY, {**props(), b"vm_id": b"other"}, b"c:1", b"other", 300.0, 1024))
    gone = fleet.expire({"1": 200.0})
    assert [(vm.installation, vm.seen_at) for vm in gone] == [("b", 100.0)]
    assert sorted(vm.installation for vm in fleet.vms()) == ["a", "c"]


def test_state_bytes_round_trip_and_restore_as_already_applied() -> None:
    """A partition's state written and read back is the same VMs, and marks its position as applied."""
    fleet = Fleet()
    fleet.claim("3")
    assert written(fleet, "3") is None  # nothing handled yet: nothing to write
    fleet.apply("3", message(FREEZE, sequence=7))
    fleet.apply("3", read_message(EMPTY, {**props(), b"vm_id": b"v2", b"vm_name": b"ss_1", b"vmss_name": b"ss"},
                                  b"j:2", b"v2", 5.5, 1024))
    fleet.handled("3", 17)
    dumped = written(fleet, "3")
    assert dumped is not None
    data, position = dumped
    assert position == 17
    restored = decode(data, "3", NOW)
    assert restored.position == 17 and not restored.dropped
    assert restored.vms == {vm.key: vm for vm in fleet.vms()}


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "unreadable"), (b"not gzip", "unreadable"), (encode_base("0", 1, [], "b1")[:-4], "unreadable"),
    (gzip.compress(b"[]"), "wrong_shape"), (gzip.compress(b'"text"'), "wrong_shape"),
    (state_json({"format": 0}), "format"), (state_json({"format": "3"}), "format"), (state_json({}), "format"),
    (state_json({"format": 2, "partition_id": "0", "sequence_number": 7, "vms": []}), "format"),  # never released
    (state_json({"format": 3, "block": "b1", "sequence_number": "7", "vms": []}), "wrong_shape"),
    (state_json({"format": 3, "block": "b1", "sequence_number": 7, "vms": {}}), "wrong_shape"),
    (state_json({"format": 3, "block": "b1", "sequence_number": 10**20, "vms": []}), "wrong_shape"),
    (state_json({"format": 3, "block": "b1", "partition_id": "5", "sequence_number": 7, "vms": []}), "wrong_shape"),
    (state_json({"format": 3, "sequence_number": 7, "vms": []}), "wrong_shape"),  # no block id
    (gzip.compress(b"{" * 100_000), "unreadable"),
])
def test_a_damaged_state_is_refused_with_a_reason_never_another_error(data: bytes, reason: str) -> None:
    """Garbage, valid gzip'd JSON of the wrong shape and an older or unknown format are all damage, with a reason:
    never an exception the caller would take for a storage outage and retry for ever."""
    with pytest.raises(DamagedState) as caught:
        decode(data, "0", NOW)
    assert caught.value.reason == reason


@pytest.mark.parametrize("bomb", [b"[],", b"{},", b"1.5,", b'"",'])
@pytest.mark.parametrize("where", ["rows", "one_row", "one_vm"])
def test_a_state_of_more_values_than_its_vms_need_is_refused_before_it_is_parsed(bomb: bytes, where: str) -> None:
    """A few KB of gzip inflating to millions of tiny JSON values (20 million empty rows took a replica to 1.5 GB):
    more values than the VMs a partition keeps need is damage, refused without building them."""
    bounds = Bounds(vms_per_partition=10)
    many = bomb * (10 * stateformat.MAX_VALUES_PER_VM + stateformat.MAX_VALUES_TOP) + b"0"
    vms = {"rows": b"[" + many + b"]", "one_row": b"[[" + many + b"]]", "one_vm": b'[{"imds": [' + many + b"]}]"}[where]
    text = b'{"format": 3, "block": "b1", "partition_id": "0", "sequence_number": 9, "vms": ' + vms + b"}"
    with pytest.raises(DamagedState) as caught:
        decode(gzip.compress(text), "0", NOW, bounds)
    assert caught.value.reason == "unreadable" and "JSON values" in str(caught.value)


def test_a_state_at_the_vm_bound_is_read_whatever_its_bodies_hold() -> None:
    """The value count leaves strings out: VMs up to the bound whose bodies are full of commas, colons and brackets
    are read whole."""
    bounds = Bounds(vms_per_partition=10)
    noisy = json.dumps({"DocumentIncarnation": 1, "Events": [], "Padding": [[1, {"a": 2}]] * 2000}).encode()
    fleet = Fleet(bounds)
    fleet.claim("0")
    for n in range(10):
        read = read_message(noisy, props(1, vm_id=f"vm-{n}", vm_name=f"vm{n}"), f"inst-{n}:1".encode(),
                            f"vm-{n}".encode(), 1000.0, 1024**2, bounds)
        assert fleet.apply("0", read) == "applied"
    data = encode_base("0", 9, fleet.vms(), "b1")
    assert sorted(decode(data, "0", NOW, bounds).vms) == sorted(vm.key for vm in fleet.vms())


def test_a_newer_format_is_told_apart_from_damage() -> None:
    """A newer release's state is not damage: the caller must leave it in place."""
    with pytest.raises(NewerState) as caught:
        decode(state_json({"format": 4, "anything": "new"}), "0", NOW)
    assert caught.value.format == 4


GOOD = {"key": VM_ID, "vm_id": VM_ID, "vm_name": "WestNO_0", "vmss_name": "", "location": "norwayeast",
        "installation": "inst", "sequence": 3, "seen_at": 1000.0, "body": EMPTY.decode()}


@pytest.mark.parametrize("row", [
    {**GOOD, "key": 5, "vm_id": 5}, {**GOOD, "body": {"Events": []}}, {**GOOD, "body": "not json"},
    {**GOOD, "seen_at": "nan"}, {**GOOD, "seen_at": float("nan")}, {**GOOD, "seen_at": float("inf")},
    {**GOOD, "seen_at": NOW + 86400}, {**GOOD, "sequence": 0}, {**GOOD, "sequence": 2**64},
    {**GOOD, "sequence": True}, {**GOOD, "installation": ""},
    {**GOOD, "key": "someone-else"},  # a key that is not the VM's vm_id: against the partition-key rule
    {**GOOD, "key": "\ud800", "vm_id": "\ud800"},  # an unpaired surrogate (json.dumps writes it as an escape)
    {**GOOD, "vm_name": "x" * 300}, {name: value for name, value in GOOD.items() if name != "installation"},
    [*GOOD.values()], "row", None,
])
def test_rows_out_of_type_or_range_are_left_out_and_counted(row: Any) -> None:
    """Each field of a VM is checked by type and range; a bad one is dropped (and so never written back), the
    good ones beside it are restored."""
    other = {"key": "v2", "vm_id": "v2", "vm_name": "ss_1", "vmss_name": "ss", "location": "westeurope",
             "installation": "inst2", "sequence": 1, "seen_at": 999.0, "body": EMPTY.decode()}
    text = json.dumps({"format": 3, "block": "b1", "partition_id": "0", "sequence_number": 9, "vms": [row, other]})
    decoded = decode(gzip.compress(text.encode()), "0", NOW)
    assert list(decoded.vms) == ["v2"] and decoded.dropped == {"row": 1}
    assert decoded.vms["v2"].seen_at == 999.0
    assert json.loads(gzip.decompress(encode_base("0", 9, decoded.vms.values(), "b1")))["vms"] == [other]


def test_a_surrogate_event_id_is_escaped_before_it_is_kept_or_shown() -> None:
    """The sidecar's parser reads the body: an EventId that is an unpaired surrogate is spelt out as text, so
    labels and the state blob stay UTF-8."""
    body = b'{"DocumentIncarnation": 1, "Events": [{"EventId": "\\ud800", "EventType": "Reboot", ' \
           b'"EventStatus": "Scheduled", "Resources": ["WestNO_0"], "NotBefore": ""}]}'
    read = message(body)
    [event] = read.vm.events
    assert event.event_id == "\\ud800"
    event.event_id.encode("utf-8")
    assert kept_through_the_state(read).events == read.vm.events


@pytest.mark.parametrize(("name", "value"), [
    ("sequence", "9" * 5000), ("sequence", "9" * 21), ("sequence", 2**63), ("sequence", -1), ("sequence", 1.5),
    ("sequence", "١٢"), ("sequence", b"\xff"), ("vm_name", "x" * 257), ("vm_id", b"v" * 2000),
    ("location", ["westeurope"]), ("vmss_name", 7), ("heartbeat", "yes"), ("imds_failing", 1),
    ("imds_last_success", "yesterday"), ("observed_at", 1795316668), ("imds_last_success", "9" * 100),
    ("imds_last_success", "0001-01-01T00:00:00Z"), ("imds_last_success", "1999-12-31T23:59:59Z"),
    ("imds_last_success", "9999-12-31T23:59:59Z"), ("observed_at", "9999-12-31T23:59:59Z"),
    ("observed_at", "0001-01-01T00:00:00Z"),  # unreachable for ever, or never: refused as imds_last_success is
])
def test_a_bad_property_is_refused_with_its_own_reason(name: str, value: Any) -> None:
    """Every property the fleet uses is checked by type, range and length; a bad one is an invalid message with
    the reason bad_property, never another exception (which would close the partition in the SDK's handler)."""
    properties = {**props(), name.encode(): value}
    if name == "observed_at":  # read only beside imds_last_success, the one thing it is used for
        properties[b"imds_last_success"] = b"2026-11-22T03:00:00.000Z"
    partition_key = b"v" * 2000 if name == "vm_id" else VM_ID.encode()
    with pytest.raises(InvalidMessage) as caught:
        read_message(EMPTY, properties, b"i:1", partition_key, 1.0, 1024)
    assert caught.value.reason == "bad_property"


def test_a_sequence_sent_as_digits_is_read_as_the_number() -> None:
    """The envelope sends sequence numbers past 32 bits as their decimal digits."""
    assert read_message(EMPTY, props(sequence=str(2**40)), b"i:1", VM_ID.encode(), 1.0, 1024).vm.sequence == 2**40


def test_a_forged_vm_id_under_another_partition_key_is_refused() -> None:
    """A document naming a VM it was not sent as (its partition key is another VM's) cannot change that VM."""
    with pytest.raises(InvalidMessage) as caught:
        read_message(FREEZE, props(), b"forger:1", b"forgers-own-vm-id", 1.0, 1 << 20)
    assert caught.value.reason == "wrong_partition_key"


def test_one_vm_held_by_two_partitions_is_shown_once_the_newest() -> None:
    """After a partition-count change (or a hand-over) one VM may sit in two owned partitions: shown once."""
    fleet = Fleet()
    fleet.claim("0")
    fleet.claim("1")
    fleet.apply("0", message(FREEZE, seen_at=100.0))
    fleet.apply("1", message(EMPTY, seen_at=200.0, installation="b"))
    [vm] = fleet.vms()
    assert vm.body == EMPTY


def test_a_forged_huge_sequence_under_the_victims_installation_does_not_silence_it() -> None:
    """A sequence of 2**62 under the victim's own installation id is applied once; the victim's next real
    document is applied again, not counted as older."""
    fleet = Fleet()
    fleet.claim("0")
    assert fleet.apply("0", message(EMPTY, sequence=500, installation="victim")) == "applied"
    assert fleet.apply("0", message(FREEZE, sequence=2**62, installation="victim")) == "applied"
    assert fleet.apply("0", message(EMPTY, sequence=501, installation="victim")) == "applied"
    assert [vm.body for vm in fleet.vms()] == [EMPTY]
    assert fleet.apply("0", message(EMPTY, sequence=499, installation="victim")) == "older"


def test_a_restored_position_past_the_partitions_newest_event_is_forgotten() -> None:
    """A state claiming sequence number 10**15 in a partition whose newest event is 50 cannot make new events
    count as replayed."""
    fleet = Fleet()
    fleet.claim("0", PartitionState(position=10**15, restored_position=10**15))
    assert fleet.already_applied("0", 42)
    assert fleet.check_restored("0", 50) == 10**15
    assert not fleet.already_applied("0", 42)
    fleet.handled("0", 42)
    assert fleet.position("0") == 42
    assert fleet.check_restored("0", 50) is None


def test_vms_per_partition_and_per_installation_are_bounded() -> None:
    """A partition keeps at most its bound of VMs, one installation id at most its bound: further VMs are refused
    with the bound's name; known VMs still update."""
    fleet = Fleet(Bounds(vms_per_partition=3, vms_per_installation=2))
    fleet.claim("0")

    def vm(number: int, installation: str) -> Message:
        key = f"vm-{number}"
        return read_message(EMPTY, {**props(), b"vm_id": key.encode()}, f"{installation}:1".encode(), key.encode(),
                            1.0, 1024)

    assert [fleet.apply("0", vm(n, "a")) for n in (1, 2, 3)] == ["applied", "applied", "vms_per_installation"]
    assert fleet.apply("0", vm(3, "b")) == "applied"
    assert fleet.apply("0", vm(4, "c")) == "vms_per_partition"
    assert fleet.expire({"0": 2.0}) and fleet.apply("0", vm(4, "c")) == "applied"


def test_events_per_vm_label_length_and_kept_body_are_bounded() -> None:
    """A document with more events than the bound keeps the first ones; an event with a field longer than a label
    is left out; a body past the kept-bytes bound is kept as what the fleet shows of it, which restores the same."""
    listed = [{"EventId": f"E{n}", "EventType": "Freeze", "EventStatus": "Scheduled", "Resources": ["WestNO_0"],
               "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT", "DurationInSeconds": 5, "Description": "d" * 2000}
              for n in range(100)]
    listed.append({"EventId": "x" * 300, "EventType": "Freeze", "EventStatus": "Scheduled"})
    body = json.dumps({"DocumentIncarnation": 1, "Events": listed}).encode()
    read = read_message(body, props(), b"i:1", VM_ID.encode(), 1.0, 1 << 20, Bounds(events_per_vm=64))
    assert len(read.vm.events) == 64 and set(read.bounds) == {"events_per_vm", "body_bytes"}
    assert len(read.vm.body) < 64 * 1024 < len(body)
    assert kept_through_the_state(read).events == read.vm.events
    short = json.dumps({"Events": [listed[0], listed[-1]]}).encode()
    assert message(short).bounds == ("label_length",) and len(message(short).vm.events) == 1


def test_a_quiet_document_reaches_no_bound_however_often_it_is_read() -> None:
    """VMs with the same quiet document share one copy of its body; the second and later such documents (a new
    bytes object with the same content, as every received message is) are not kept as a reduction of themselves,
    so no body_bytes bound is counted: it was, for every quiet document after the first (a warning in the log and
    a climbing bound_hits_total{bound="body_bytes"} on every healthy fleet)."""
    first, again = (message(bytes(bytearray(EMPTY)), sequence=n) for n in (1, 2))
    assert first.bounds == () and again.bounds == ()
    assert again.vm.body is first.vm.body and again.vm.body == EMPTY


def test_imds_health_is_read_kept_and_restored_and_older_sidecars_are_unknown() -> None:
    """imds_last_success and imds_failing are read (RFC 3339, bool), survive the state blob, and define
    unreachable: failing, or the last success over 120 s older than observed_at; without them, unknown."""
    observed = "2026-11-22T03:04:28.024Z"
    failing = message(imds_last_success="2026-11-22T03:00:00.000Z", imds_failing=True, observed_at=observed)
    stale = message(imds_last_success="2026-11-22T03:00:00.000Z", imds_failing=False, observed_at=observed,
                    installation="b")
    fine = message(imds_last_success="2026-11-22T03:04:28.000Z", imds_failing=False, observed_at=observed,
                   installation="c")
    old = message(installation="d")
    assert message(imds_last_success="", installation="e").vm.imds.last_success is None
    assert failing.vm.imds.failing is True
    assert failing.vm.imds.last_success == datetime(2026, 11, 22, 3, 0, tzinfo=timezone.utc).timestamp()
    assert [imds_unreachable(m.vm) for m in (failing, stale, fine, old)] == [True, True, False, False]
    data = encode_base("0", 1, [failing.vm], "b1")
    [vm] = decode(data, "0", NOW).vms.values()
    assert vm.imds == failing.vm.imds


def test_control_characters_a_vm_sends_are_spelt_out_in_labels() -> None:
    """NUL and CR in a property or an event field never reach a label raw: spelt out as \\xNN, the same when the
    state is read back."""
    body = json.dumps({"DocumentIncarnation": 1, "Events": [
        {"EventId": "E\x001", "EventType": "Reboot", "EventStatus": "Scheduled\r", "Resources": ["vm\r\n0"],
         "NotBefore": "", "EventSource": "Platform\x7f"}]}).encode()
    read = read_message(body, props(1, vm_name="vm\r\n0", vm_id="id\x00x", location=b"west\reurope"),
                        b"inst:1", b"id\x00x", 1000.0, 1024**2)
    vm = read.vm
    assert (vm.vm_name, vm.vm_id, vm.location, vm.key) == ("vm\\x0d\n0", "id\\x00x", "west\\x0deurope", "id\\x00x")
    [event] = vm.events
    assert (event.event_id, event.event_status, event.event_source) == ("e\\x001", "Scheduled\\x0d", "Platform\\x7f")
    fleet = Fleet()
    fleet.claim("0")
    assert fleet.apply("0", read) == "applied"
    assert decode(encode_base("0", 9, fleet.vms(), "b1"), "0", NOW).vms == {vm.key: vm}


def test_is_shown_agrees_with_shown_through_claim_show_hide_and_release() -> None:
    """The lock-free check the consumer makes on every batch and link-watch tick says what ``shown`` says."""
    fleet = Fleet()
    assert not fleet.is_shown("0")
    fleet.claim("0", shown=False)
    fleet.claim("1")
    for step in (lambda: None, lambda: fleet.show("0"), lambda: fleet.show("1", shown=False),
                 lambda: fleet.release("0")):
        step()
        assert [partition for partition in ("0", "1", "2") if fleet.is_shown(partition)] == fleet.shown()


def written(fleet: Fleet, partition_id: str) -> tuple[bytes, int] | None:
    """The partition's state as it is written whole (a base), and its position; None before any event."""
    snapshot = fleet.snapshot(partition_id)
    if snapshot is None:
        return None
    return encode_base(partition_id, snapshot.position, snapshot.vms, "b1"), snapshot.position


def kept_through_the_state(read: Message) -> VmState:
    """The one VM of ``read`` as a partition's state written and read back holds it."""
    fleet = Fleet()
    fleet.claim("0")
    fleet.apply("0", read, 1)
    stored = written(fleet, "0")
    assert stored is not None
    [vm] = decode(stored[0], "0", NOW).vms.values()
    return vm


def test_every_vm_state_field_is_classified_once() -> None:
    """A field added to ``VmState`` and not classified would be treated as a heartbeat's and never rewritten."""
    names = [f.name for f in dataclasses.fields(VmState)]
    assert sorted(VM_STATE_FIELDS) == sorted(names)
    assert {f.kind for f in VM_STATE_FIELDS.values()} <= {"fact", "heartbeat", "follows_body"}
    assert {f.stored for f in VM_STATE_FIELDS.values()} <= {"always", "when_known", "not"}


@pytest.mark.parametrize("name", [n for n, f in VM_STATE_FIELDS.items() if f.kind != "follows_body"])
def test_only_a_heartbeats_fields_leave_a_vm_heartbeat_only(name: str) -> None:
    """Changing one field: a heartbeat's keeps the VM heartbeat-only, any fact makes it a whole rewrite."""
    old = VmState(key="k", vm_id="id", vm_name="vm", vmss_name="ss", location="westeurope", installation="i",
                  sequence=1, seen_at=10.0, body=b'{"Events": []}', events=(), subscription_id="s",
                  resource_group="rg")
    value = getattr(old, name)
    changed = Imds(observed_at=1.0, last_success=1.0, failing=False) if isinstance(value, Imds) \
        else (("os_type", "Linux"),) if name == "reported" else value * 2
    new = dataclasses.replace(old, **{name: changed})
    assert (vm_facts(old) == vm_facts(new)) is (VM_STATE_FIELDS[name].kind == "heartbeat")
