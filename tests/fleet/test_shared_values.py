"""What many held VMs have in common is held once: a quiet document's body, a scale set's and a region's name."""

from __future__ import annotations

from se_exporter.fleet.message import VmState, read_message
from tests.fleet.test_vms import EMPTY, VM_ID, props


def read(body: bytes, sequence: int, **extra: str) -> VmState:
    return read_message(body, props(sequence, **extra), f"inst:{sequence}".encode(), VM_ID.encode(), 1.0, 1 << 20).vm


def test_vms_with_the_same_quiet_document_share_one_body() -> None:
    """Two messages carrying equal bodies that list no event (two copies, as two received messages are) keep one."""
    first, second = read(bytes(bytearray(EMPTY)), 1), read(bytes(bytearray(EMPTY)), 2)
    assert first.body == second.body == EMPTY
    assert first.body is second.body


def test_scale_set_and_location_names_are_one_string_each() -> None:
    """The same vmss_name and location sent by two VMs (decoded separately) are one string each."""
    first = read(EMPTY, 1, vmss_name="scale-set-" + "a" * 8, location="west" + "europe")
    second = read(EMPTY, 2, vmss_name="scale-set-" + "a" * 8, location="west" + "europe")
    assert first.vmss_name is second.vmss_name
    assert first.location is second.location
