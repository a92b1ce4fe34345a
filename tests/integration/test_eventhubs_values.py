"""Values an Event Hubs message cannot carry as they are, through the official SDK and the suite's AMQP server: a
DocumentIncarnation above 32 bits (the SDK encodes every int property as a 32-bit AMQP int), strings that are not
UTF-8, a body larger than a message may be."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
from prometheus_client import CollectorRegistry

from se_exporter.infra.azure.clients import producer_factory
from se_exporter.sidecar.forwarding.envelope import Envelope
from se_exporter.sidecar.forwarding.eventhubs import EventHubsTarget
from se_exporter.sidecar.forwarding.forward import ForwardMetrics
from se_exporter.sidecar.forwarding.spool import Spool
from se_exporter.simulator.faults import Fault
from tests.conftest import Reliability, SimulatorFactory
from tests.integration.test_disk import delivered, file_lines, read_until, serve
from tests.integration.test_eventhubs import FAST, SCHEMA
from tests.support.eventhubs_server import EventHubsTestServer, StoredEvent
from tests.support.helpers import Sidecar, wait_until

pytestmark = pytest.mark.integration
HUGE = 2**62  # beyond the SDK's 32-bit ints, within the parser's 64 bits (wider: ignored with a warning)


def properties(event: StoredEvent) -> dict[str, object]:
    return {str(key): value for key, value in event.properties.items()}


def test_unencodable_values_are_carried_and_only_a_too_large_body_is_refused(
        simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], hubs: Callable[..., EventHubsTestServer],
        tmp_path: Path, reliability: Reliability) -> None:
    """A DocumentIncarnation of 2**62 is delivered with its exact body and the incarnation as a decimal string; a
    body over the message size is the only document refused, counted as too_large and dropped, never as sent; the
    documents around it arrive in order."""
    sim, server = simulator("live-migration")
    hub = hubs()
    out = tmp_path / "documents.jsonl"
    huge_body = json.dumps({"DocumentIncarnation": HUGE, "Events": []}).encode()
    first = serve(sim, 1, padding=10)
    process = sidecar("--imds-url", server.url, *FAST, "--state-dir", str(tmp_path / "state"), "--forward-file",
                      str(out), "--eventhub-send-timeout", "2",
                      env={"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": hub.connection_string()})
    read_until(process, 1)
    sim.clear_faults()
    sim.inject(Fault(kind="body", count=0, text=huge_body.decode()))
    read_until(process, HUGE)  # 2**62 is exact as the gauge's float
    too_large = serve(sim, 3, padding=1_100_000)
    read_until(process, 3)
    last = serve(sim, 4, padding=10)
    read_until(process, 4)
    wait_until(lambda: len(delivered(hub)) == 3 and process.value("azure_scheduled_events_spool_documents") == 0,
               timeout=30, what="three documents delivered, one dropped")
    events = delivered(hub)
    assert [event.body for event in events] == [first, huge_body, last]
    assert properties(events[1])["document_incarnation"] == str(HUGE)
    assert properties(events[0])["document_incarnation"] == 1
    assert process.value("azure_scheduled_events_forward_errors_total", sink="eventhubs", reason="too_large") == 1
    assert process.value("azure_scheduled_events_spool_dropped_documents_total") == 1
    wait_until(lambda: process.value("azure_scheduled_events_forwarded_documents_total", sink="eventhubs") == 3,
               what="three deliveries counted")
    assert process.value("azure_scheduled_events_forwarded_documents_total", sink="eventhubs") == 3
    lines = file_lines(out)
    for line in lines:
        jsonschema.validate(line, SCHEMA)
    assert [str(line["body"]).encode() for line in lines] == [first, huge_body, too_large, last]
    assert lines[1]["properties"]["document_incarnation"] == str(HUGE)  # type: ignore[index]
    assert "larger than an Event Hubs message may be" in process.log()
    reliability("Event Hubs", "DocumentIncarnation 2**62, then a body over the 1 MiB message size",
                "the 2**62 document delivered byte-identical with the incarnation as a decimal string; only the "
                "oversized body refused (`too_large`, dropped, counted); `forwarded_documents_total` counts only "
                "deliveries")


def test_strings_that_are_not_utf8_reach_event_hubs(hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                                    reliability: Reliability) -> None:
    """Property values and a partition key holding lone surrogates or control characters (as a JSON escape from
    IMDS can make them), and integers too wide for the SDK, as an older version spooled them: all delivered, the
    body untouched, each value carried (surrogates backslash-escaped, wide integers as decimal strings)."""
    hub = hubs()
    registry = CollectorRegistry()
    metrics = ForwardMetrics(registry)
    spool = Spool(tmp_path / "spool", 1 << 20)
    odd = {"vm_name": "West\ud800NO_0", "location": "a\x00b\x1b[31mc\nd", "sequence": 1, "document_incarnation": HUGE,
           "subscription_id": "\udcff"}
    body = b'{"DocumentIncarnation": 1180591620717411303424, "Events": [{"EventId": "\\ud800\\n"}]}'
    spool.append(Envelope(1, "0f8fad5b-d9cb-469f-a165-70867728950e:1", "vm\ud800", odd, body, 1000.0))
    target = EventHubsTarget(spool, producer_factory(hub.connection_string(), None, None, None), metrics,
                             send_timeout=2, max_retry_wait=0.3)
    try:
        wait_until(lambda: len(hub.store.all()) >= 1 and len(spool) == 0, timeout=30, what="the odd envelope sent")
    finally:
        target.close(5)
    event = hub.store.all()[0]
    assert event.body == body
    assert event.partition_key == "vm\\ud800"
    assert properties(event) == {"vm_name": "West\\ud800NO_0", "location": "a\x00b\x1b[31mc\nd", "sequence": 1,
                                 "document_incarnation": str(HUGE), "subscription_id": "\\udcff"}
    assert registry.get_sample_value("azure_scheduled_events_forwarded_documents_total", {"sink": "eventhubs"}) == 1
    assert registry.get_sample_value("azure_scheduled_events_spool_dropped_documents_total") == 0
    reliability("Event Hubs", "properties and partition key with lone surrogates and control characters; an integer "
                "property of 2**70 spooled by an older version", "delivered through the official SDK, the body "
                "byte-identical, every value carried (escaped or as a decimal string); nothing dropped")
