"""The forwarded message's properties from one table (``core/properties.py``): the published schema, the
sidecar that writes them and the fleet that reads them agree with it."""

from __future__ import annotations

from se_exporter.core.properties import NAMES, REQUIRED
from se_exporter.fleet.message import KNOWN_PROPERTIES
from se_exporter.sidecar.forwarding.envelope import build
from tests.support.fakes.documents import change
from tests.support.helpers import FORWARDED_SCHEMA


def test_the_schema_publishes_exactly_the_declared_properties() -> None:
    schema = FORWARDED_SCHEMA["properties"]["properties"]
    assert set(schema["properties"]) == NAMES
    assert set(schema["required"]) == REQUIRED
    assert schema["additionalProperties"] is False


def test_the_fleet_reads_exactly_the_declared_properties() -> None:
    assert KNOWN_PROPERTIES == NAMES


def test_the_sidecar_writes_every_required_property_and_no_undeclared_one() -> None:
    for envelope in (build(change(), 1, "i"), build(change(identity=None, vm_name=None), 2, "i")):
        assert REQUIRED <= set(envelope.properties) <= NAMES
