"""The pauses VMs felt, as the fleet reads, keeps and shows them: per event the VMs that paused and the longest
pause, and the buckets of each (VM, event)'s longest pause by event type."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from se_exporter.fleet.message import InvalidMessage, read_pauses
from se_exporter.fleet.stateformat import decode, encode_base
from se_exporter.fleet.vms import Fleet
from tests.fleet.reference_exposition import fleet_text
from tests.fleet.test_exposition_cache import send
from tests.fleet.test_vms import EMPTY, FREEZE, message

NOW = 2_000_000_000.0


def pauses(**events: tuple[str, float, float]) -> str:
    return json.dumps({event_id: {"type": kind, "longest": longest, "total": total}
                       for event_id, (kind, longest, total) in events.items()})


def test_the_property_is_read_in_one_form() -> None:
    """EventIds as event keys (lower case, blanks stripped), sorted; what the sidecar sends reads back equal."""
    read = read_pauses(pauses(**{" E2 ": ("Reboot", 1.0, 1.0), "E1": ("Freeze", 2.0, 3.5)}).encode())
    assert read == '{"e1":{"type":"Freeze","longest":2.0,"total":3.5},"e2":{"type":"Reboot","longest":1.0,"total":1.0}}'
    assert read_pauses(read) == read


@pytest.mark.parametrize("value", [
    "not json", "[1, 2]", '{"E1": [1, 2]}', '{"E1": {"type": "Freeze", "longest": 3, "total": 2}}',
    '{"E1": {"type": "Freeze", "longest": -1, "total": 2}}', '{"E1": {"type": "Freeze", "longest": "NaN", "total": 2}}',
    '{"E1": {"type": "Freeze", "longest": 1, "total": 1e9}}', pauses(**{f"E{n}": ("Freeze", 1, 1) for n in range(17)}),
    pauses(**{"E" * 300: ("Freeze", 1, 1)}), '{"e1": {"type": "Freeze", "longest": 1, "total": 1}, "E1": '
    '{"type": "Freeze", "longest": 2, "total": 2}}', "x" * 30_000, 7])
def test_a_forged_or_garbled_property_refuses_the_message(value: object) -> None:
    with pytest.raises(InvalidMessage) as refused:
        read_pauses(value)
    assert refused.value.reason == "bad_property"
    with pytest.raises(InvalidMessage):
        message(pauses=value)


def test_the_pauses_are_kept_in_the_state_and_read_back() -> None:
    held = message(pauses=pauses(E1=("Freeze", 2.0, 2.0))).vm
    decoded = decode(encode_base("0", 5, [held], "block-000001"), "0", NOW)
    assert decoded.vms[held.key] == held
    assert held.value("pauses") == '{"e1":{"type":"Freeze","longest":2.0,"total":2.0}}'


def test_per_event_the_vms_that_paused_the_longest_and_the_buckets_by_type() -> None:
    fleet = Fleet()
    fleet.claim("0")
    send(fleet, "0", FREEZE, "id1", 1, 1000.0, pauses=pauses(E1=("Freeze", 1.5, 1.5)))
    send(fleet, "0", EMPTY, "id2", 1, 1000.0, pauses=pauses(E1=("Freeze", 7.0, 9.0), R1=("Reboot", 0.3, 0.3)))
    send(fleet, "0", FREEZE, "id3", 1, 1000.0)  # listed, and felt nothing
    written = fleet_text(fleet, NOW)
    assert 'azure_scheduled_fleet_event_paused_vms{event_id="e1",event_type="Freeze"} 2.0' in written
    assert 'azure_scheduled_fleet_event_longest_pause_seconds{event_id="e1",event_type="Freeze"} 7.0' in written
    assert 'azure_scheduled_fleet_event_paused_vms{event_id="r1",event_type="Reboot"} 1.0' in written
    buckets = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in written.splitlines()
               if line.startswith("azure_scheduled_fleet_pause_seconds_bucket")}
    assert len(buckets) == 2 * 9  # every bound of each type felt, none of a type not felt
    assert buckets['azure_scheduled_fleet_pause_seconds_bucket{event_type="Freeze",le="1.0"}'] == 0
    assert buckets['azure_scheduled_fleet_pause_seconds_bucket{event_type="Freeze",le="2.0"}'] == 1
    assert buckets['azure_scheduled_fleet_pause_seconds_bucket{event_type="Freeze",le="10.0"}'] == 2
    assert buckets['azure_scheduled_fleet_pause_seconds_bucket{event_type="Freeze",le="+Inf"}'] == 2
    assert buckets['azure_scheduled_fleet_pause_seconds_bucket{event_type="Reboot",le="0.5"}'] == 1


def test_a_lone_surrogate_or_a_control_character_is_spelt_out_and_the_scrape_stays_utf8() -> None:
    fleet = Fleet()
    fleet.claim("0")
    send(fleet, "0", EMPTY, "id1", 1, 1000.0, pauses='{"\\ud800x": {"type": "Fr\\u0001\\udc00", "longest": 1,'
                                                    ' "total": 1}}')
    written = fleet_text(fleet, NOW)
    written.encode("utf-8")  # a lone surrogate in a label made the whole scrape unencodable
    (family,) = [family for family in text_string_to_metric_families(written)
                 if family.name == "azure_scheduled_fleet_event_paused_vms"]
    assert [(sample.labels, sample.value) for sample in family.samples] == [
        ({"event_id": "\\ud800x", "event_type": "Fr\\x01\\udc00"}, 1.0)]
