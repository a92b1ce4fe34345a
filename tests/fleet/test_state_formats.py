"""The state formats side by side: format 2's named fields checked like format 1's rows, format 1 pinned byte for byte
as the previous release wrote and read it, and that release's replica (``tests/fleet_format1.py``) leaving format 2."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from typing import Any

import pytest

from se_exporter.fleet.stateformat import NewerState, decode, encode
from tests import fleet_format1 as previous
from tests.fleet.test_picture import EMPTY, FREEZE, NOW, VM_ID, message


def vms() -> list[Any]:
    failing = message(imds_last_success="2026-11-22T03:00:00.000Z", imds_failing=True,
                      observed_at="2026-11-22T03:04:28.024Z").vm
    return [failing]


def test_format_2_names_every_field_and_reads_back_the_same_vms() -> None:
    """Format 2 is an object per VM, IMDS health included, and decodes to what was encoded."""
    data = encode("0", 9, vms(), state_format=2)
    stored = json.loads(gzip.decompress(data))
    assert stored["format"] == 2 and set(stored["vms"][0]) == {
        "key", "vm_id", "vm_name", "vmss_name", "location", "installation", "sequence", "seen_at", "body", "imds",
        "subscription_id", "resource_group"}
    decoded = decode(data, "0", NOW)
    assert (decoded.format, decoded.position, list(decoded.vms.values())) == (2, 9, vms())


GOOD = {"key": VM_ID, "vm_id": VM_ID, "vm_name": "WestNO_0", "vmss_name": "", "location": "norwayeast",
        "installation": "inst", "sequence": 3, "seen_at": 1000.0, "body": EMPTY.decode()}


@pytest.mark.parametrize("named", [
    {**GOOD, "vm_id": 5}, {**GOOD, "seen_at": float("inf")}, {**GOOD, "sequence": 0}, {**GOOD, "body": "not json"},
    {**GOOD, "key": "someone-else"}, {k: v for k, v in GOOD.items() if k != "installation"}, [*GOOD.values()], None,
])
def test_a_format_2_vm_out_of_type_or_range_is_left_out_and_counted(named: Any) -> None:
    """Each named field is checked as format 1's row is; a bad VM is dropped and counted, the good one kept."""
    other = {**GOOD, "key": "v2", "vm_id": "v2", "vm_name": "ss_1", "installation": "inst2"}
    text = json.dumps({"format": 2, "partition_id": "0", "sequence_number": 9, "vms": [named, other]})
    decoded = decode(gzip.compress(text.encode()), "0", NOW)
    assert list(decoded.vms) == ["v2"] and decoded.dropped == {"row": 1}


def test_fields_a_format_2_reader_does_not_know_are_ignored() -> None:
    """A field added within format 2 by a later release is not damage: the VM is read without it."""
    text = json.dumps({"format": 2, "partition_id": "0", "sequence_number": 9, "later": 1,
                       "vms": [{**GOOD, "zone": "1", "imds": {"failing": True, "later": 2}}]})
    [vm] = decode(gzip.compress(text.encode()), "0", NOW).vms.values()
    assert vm.vm_name == "WestNO_0" and vm.imds.failing is True


# vms() in format 1, exactly as the previous release's writer put it (its rows and its imds entries): that release
# read this layout and no other, so today's format 1 must stay this, byte for byte.
PREVIOUS_FORMAT_1 = json.dumps(
    {"format": 1, "partition_id": "0", "sequence_number": 9,
     "vms": [[VM_ID, VM_ID, "WestNO_0", "", "norwayeast", "inst-a", 1, 1000.0, FREEZE.decode()]],
     "imds": {VM_ID: [1795316668.024, 1795316400.0, True]}}, ensure_ascii=False, separators=(",", ":")).encode()


def without_place(vm: Any) -> Any:
    return replace(vm, subscription_id="", resource_group="")


def test_the_previous_release_and_this_one_read_each_others_format_1() -> None:
    """What the previous release wrote, this one reads whole (subscription and resource group unknown); what this one
    writes by default is what that one wrote plus the top-level ``place`` (added within format 1 as ``imds`` was: a
    key the previous release's reader never looks up), so it reads it."""
    assert list(decode(gzip.compress(PREVIOUS_FORMAT_1), "0", NOW).vms.values()) == [without_place(vm) for vm in vms()]
    written = json.loads(gzip.decompress(encode("0", 9, vms())))
    assert written.pop("place") == {VM_ID: ["sub", "rg"]}
    assert json.dumps(written, ensure_ascii=False, separators=(",", ":")).encode() == PREVIOUS_FORMAT_1
    assert gzip.decompress(encode("0", 9, [without_place(vm) for vm in vms()])) == PREVIOUS_FORMAT_1
    assert list(previous.decode(encode("0", 9, vms()), "0", NOW).vms.values()) == vms()


@pytest.mark.parametrize("state_format", [1, 2])
def test_subscription_and_resource_group_survive_a_state_and_a_damaged_one_is_unknown(state_format: int) -> None:
    """The join's two properties are kept through a state in formats 1 and 2; out of shape, they read as unknown
    and the VM is kept."""
    [vm] = decode(encode("0", 9, vms(), state_format=state_format), "0", NOW).vms.values()
    assert (vm.subscription_id, vm.resource_group) == ("sub", "rg")
    text = json.dumps({"format": 2, "partition_id": "0", "sequence_number": 9,
                       "vms": [{**GOOD, "subscription_id": 5, "resource_group": "\ud800"}]})
    [vm] = decode(gzip.compress(text.encode()), "0", NOW).vms.values()
    assert (vm.vm_name, vm.subscription_id, vm.resource_group) == ("WestNO_0", "", "")


def test_the_previous_release_takes_format_2_for_a_newer_releases_and_leaves_it() -> None:
    """Format 2 is a newer release's to the previous one: the error the state store answers by leaving it in place."""
    with pytest.raises(NewerState) as caught:
        previous.decode(encode("0", 9, vms(), state_format=2), "0", NOW)
    assert caught.value.format == 2
