"""A sidecar that forwarded under its name and then knows its vm_id sends one message under the name that retires
it: after the last document by name, before the first by vm_id; and the fleet replica that holds the name's
partition retires the VM known by name on it, whichever replica reads the vm_id's partition."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from prometheus_client import CollectorRegistry

from se_exporter.fleet.message import read_message
from se_exporter.fleet.vms import Fleet
from se_exporter.sidecar.forwarding.envelope import Envelope, Sequencer
from se_exporter.sidecar.forwarding.forward import ForwardMetrics, ForwardSink
from se_exporter.sidecar.forwarding.forward_file import file_line
from tests.support.fakes.documents import IDENTITY, RAW, change
from tests.support.fakes.targets import Collecting
from tests.support.helpers import FORWARDED_SCHEMA as SCHEMA

OTHER = b'{"DocumentIncarnation": 4, "Events": []}'
NAME = "WestNO_0"


def forwarded(tmp_path: Path, *changes: object) -> list[Envelope]:
    target = Collecting()
    forward = ForwardSink(Sequencer(tmp_path), [target], ForwardMetrics(CollectorRegistry()))
    try:
        for item in changes:
            forward.on_change(item)  # type: ignore[arg-type]
        assert forward.force_flush(5000)
    finally:
        forward.shutdown()
    return target.envelopes


def test_one_retire_message_under_the_name_between_the_last_by_name_and_the_first_by_vm_id(tmp_path: Path) -> None:
    envelopes = forwarded(tmp_path, change(RAW, identity=None), change(OTHER, identity=None), change(RAW),
                          change(OTHER))
    assert [e.partition_key for e in envelopes] == [NAME, NAME, NAME, IDENTITY.vm_id, IDENTITY.vm_id]
    retiring = [e for e in envelopes if e.properties.get("retires_name") is True]
    assert retiring == [envelopes[2]]
    retire = envelopes[2]
    assert retire.properties["vm_id"] == IDENTITY.vm_id and retire.properties["vm_name"] == NAME
    assert [e.sequence for e in envelopes] == sorted(e.sequence for e in envelopes)  # in partition order too
    assert all("retires_name" not in e.properties for e in envelopes if e is not retire)
    jsonschema.validate(json.loads(file_line(retire)), SCHEMA)


def test_nothing_extra_when_the_vm_id_was_known_from_the_start(tmp_path: Path) -> None:
    envelopes = forwarded(tmp_path, change(RAW), change(OTHER))
    assert [e.partition_key for e in envelopes] == [IDENTITY.vm_id] * 2
    assert not any("retires_name" in e.properties for e in envelopes)


def test_two_replicas_reading_what_the_sidecar_sent_count_one_vm(tmp_path: Path) -> None:
    """The sidecar's own envelopes, read by two replicas each owning one of the two partitions: one VM in all."""
    envelopes = forwarded(tmp_path, change(RAW, identity=None), change(OTHER, identity=None), change(RAW))
    replicas = {NAME: Fleet(), IDENTITY.vm_id: Fleet()}
    for key, fleet in replicas.items():
        fleet.claim(key)
    outcomes = []
    for number, envelope in enumerate(envelopes, 1):
        message = read_message(envelope.body, envelope.properties, envelope.message_id, envelope.partition_key,
                               1000.0 + number, 1 << 20)
        outcomes.append(replicas[envelope.partition_key].apply(envelope.partition_key, message, number))
    assert outcomes == ["applied", "applied", "retired", "applied"]
    assert [vm.vm_id for fleet in replicas.values() for vm in fleet.vms()] == [IDENTITY.vm_id]
