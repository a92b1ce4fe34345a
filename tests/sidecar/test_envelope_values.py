"""Envelope property values every target can carry: integers wider than 32 bits as strings, strings that cannot be
UTF-8 escaped; the body is never touched (the real SDK's encoder is the judge here; tests/integration/
test_eventhubs_values.py sends them to the AMQP test server)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from azure.eventhub import EventData, EventDataBatch

from se_exporter.core.model import VmIdentity
from se_exporter.sidecar.forwarding.envelope import build, carriable
from se_exporter.sidecar.forwarding.forward_file import file_line
from tests.support.fakes.documents import IDENTITY, change

SCHEMA = json.loads((Path(__file__).parent.parent.parent / "schemas" / "forwarded-document.schema.json").read_text())
ODD = VmIdentity(name="West\ud800NO_0\x1b[2J", vm_id="\udcff", vmss_name="\x00", location="norwayeast",
                 resource_group="rg", subscription_id="sub")


@pytest.mark.parametrize("incarnation", [0, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**63 - 1, 2**63, 2**70,
                                         -(2**70)])
@pytest.mark.parametrize("identity", [IDENTITY, ODD], ids=["plain", "odd strings"])
def test_every_property_survives_the_sdk_encoder_and_the_file(incarnation: int, identity: VmIdentity) -> None:
    """Whatever IMDS sent, the envelope's properties and partition key encode into an SDK batch, the file line
    validates against the schema, and the body stays the exact bytes."""
    raw = b'{"DocumentIncarnation": %d, "Events": [{"EventId": "\\ud800\\n"}]}' % incarnation
    envelope = build(change(raw, identity=identity, vm_name=identity.name), 1, "0f8fad5b-d9cb-469f-a165-70867728950e")
    assert envelope.body == raw
    if -(2**63) <= incarnation < 2**63:
        expected = incarnation if -(2**31) <= incarnation < 2**31 else str(incarnation)
        assert envelope.properties["document_incarnation"] == expected
    else:  # beyond 64 bits the parser ignores it, with a warning (model.py): no property, the body as it was
        assert "document_incarnation" not in envelope.properties
    event = EventData(envelope.body)
    event.properties = dict(envelope.properties)
    EventDataBatch(partition_key=envelope.partition_key).add(event)
    line = json.loads(file_line(envelope))
    jsonschema.validate(line, SCHEMA)
    assert line["body"].encode() == raw


def test_carriable_leaves_ordinary_values_alone() -> None:
    """Only what cannot be carried changes."""
    assert [carriable(v) for v in (7, "WestNO_0", "a\nb", "é")] == [7, "WestNO_0", "a\nb", "é"]
    assert carriable("x\ud800") == "x\\ud800"
