"""The forwarded envelope: properties, ids, the file line and the sequence across restarts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema

from se_exporter.core import pause
from se_exporter.core.lifecycle import diff
from se_exporter.core.model import parse_document
from se_exporter.sidecar.forwarding.envelope import MAX_PAUSED, Sequencer, build
from se_exporter.sidecar.forwarding.forward_file import file_line
from tests.support.fakes.documents import IDENTITY, RAW, change
from tests.support.helpers import FORWARDED_SCHEMA as SCHEMA


def test_envelope_properties_and_ids() -> None:
    """Properties name the VM and the moment; message id and partition key are stable and per VM."""
    env = build(change(), 7, "0f8fad5b-d9cb-469f-a165-70867728950e")
    assert env.body == RAW
    assert env.message_id == "0f8fad5b-d9cb-469f-a165-70867728950e:7"
    assert env.partition_key == IDENTITY.vm_id
    assert env.properties == {
        "vm_name": "WestNO_0", "vm_id": IDENTITY.vm_id, "vmss_name": "", "subscription_id": "sub",
        "resource_group": "rg", "location": "norwayeast", "document_incarnation": 3,
        "observed_at": "2026-11-22T03:04:28.024Z", "api_version": "2020-07-01", "exporter_version": "0.1.0",
        "sequence": 7, "imds_last_success": "2026-11-22T03:04:28.024Z", "imds_failing": False}


def test_partition_key_falls_back_to_the_vm_name() -> None:
    """Before the identity is known, the VM name keeps documents together; without either, 'unknown'."""
    assert build(change(identity=None), 1, "i").partition_key == "WestNO_0"
    assert build(change(identity=None, vm_name=None), 1, "i").partition_key == "unknown"


def test_file_line_is_valid_and_carries_the_exact_body() -> None:
    """A --forward-file line validates against the published schema; its body is the raw text, CRLFs and all."""
    line = file_line(build(change(), 1, "0f8fad5b-d9cb-469f-a165-70867728950e"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    record = json.loads(line)
    jsonschema.validate(record, SCHEMA)
    assert record["body"].encode() == RAW


def test_sequence_survives_restarts(tmp_path: Path) -> None:
    """Numbers never repeat for an installation, across restarts, and the installation id is kept."""
    first = Sequencer(tmp_path)
    assert [first.next(), first.next()] == [1, 2]
    second = Sequencer(tmp_path)
    assert second.installation_id == first.installation_id
    assert second.next() == 3
    second.advance_past(41)
    assert Sequencer(tmp_path).next() == 42


def test_the_pauses_property_carries_each_events_longest_and_total_pause_bounded() -> None:
    """Listed and just ended events that paused, longest first, at most MAX_PAUSED; absent while none paused; valid
    against the published schema."""
    events = [{"EventId": f"E{n:02}", "EventStatus": "Started", "EventType": "Freeze", "ResourceType":
               "VirtualMachine", "Resources": ["WestNO_0"], "NotBefore": ""} for n in range(MAX_PAUSED + 4)]
    raw = json.dumps({"DocumentIncarnation": 5, "Events": events}).encode()
    listed = change(raw)
    assert "pauses" not in build(listed, 1, "i").properties
    records = pause.fold(listed.records, [pause.Pause(1.0, 0.5 + n, f"e{n:02}", "Freeze") for n in range(len(events))]
                         + [pause.Pause(2.0, 0.25, "e00", "Freeze")])
    carried = json.loads(str(build(replace(listed, records=records), 2, "i").properties["pauses"]))
    assert len(carried) == MAX_PAUSED
    assert next(iter(carried)) == f"E{len(events) - 1:02}"
    assert "E00" not in carried and carried["E04"] == {"type": "Freeze", "longest": 4.5, "total": 4.5}
    gone = diff(records, parse_document(b'{"DocumentIncarnation": 6, "Events": []}'), 10.0)
    ended = build(replace(listed, records=gone.records, transitions=gone.transitions), 3, "i")
    assert json.loads(str(ended.properties["pauses"]))["E19"] == {"type": "Freeze", "longest": 19.5, "total": 19.5}
    jsonschema.validate(ended.header()["properties"], SCHEMA["properties"]["properties"])
