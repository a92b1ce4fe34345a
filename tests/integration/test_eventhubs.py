"""Forwarding to Event Hubs through the official SDK, against the suite's AMQP 1.0 test server."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from azure.eventhub.aio import EventHubConsumerClient

from tests.conftest import Reliability, SimulatorFactory
from tests.support.certs import self_signed_certificate
from tests.support.eventhubs_server import ClosingPeer, EventHubsTestServer, SilentPeer, StoredEvent
from tests.support.helpers import Sidecar, step_through, wait_until

pytestmark = pytest.mark.integration
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")
SCHEMA = json.loads((Path(__file__).parent.parent.parent / "schemas" / "forwarded-document.schema.json").read_text())


def forwarding(sidecar: Callable[..., Sidecar], imds_url: str, state: Path, connection_string: str,
               *extra: str) -> Sidecar:
    """A sidecar forwarding to Event Hubs; the connection string goes by environment, as we advise users."""
    return sidecar("--imds-url", imds_url, *FAST, "--state-dir", str(state), "--eventhub-send-timeout", "1",
                   "--eventhub-retry-max", "0.3", *extra,
                   env={"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": connection_string})


def first_copies(events: list[StoredEvent]) -> list[StoredEvent]:
    """Drop resends (same message id), keeping first arrivals in order; fail on a reused id with other content."""
    seen: dict[str, StoredEvent] = {}
    ordered = []
    for event in events:
        assert event.message_id is not None
        if event.message_id in seen:
            assert (seen[event.message_id].body, seen[event.message_id].properties) == (event.body, event.properties)
            continue
        seen[event.message_id] = event
        ordered.append(event)
    return ordered


def consume(connection_string: str, count: int, timeout: float = 20.0) -> list[Any]:
    """Read ``count`` events from the start of every partition with the SDK's async consumer."""
    async def run() -> list[Any]:
        received: list[Any] = []
        client = EventHubConsumerClient.from_connection_string(connection_string, consumer_group="$Default",
                                                               retry_total=1)

        async def on_event(context: Any, event: Any) -> None:
            received.append((context.partition_id, event))

        task = asyncio.create_task(client.receive(on_event, starting_position="-1"))
        deadline = time.monotonic() + timeout
        while len(received) < count and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.05)
        await client.close()
        task.cancel()
        return [event for _, event in sorted(received, key=lambda pair: (pair[0], pair[1].sequence_number))]

    return asyncio.run(run())


def test_round_trip_through_the_sdk(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                    hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                    reliability: Reliability) -> None:
    """Every distinct document reaches Event Hubs once, byte-identical, in order, with properties and key."""
    sim, server = simulator("live-migration", held=True)
    hub = hubs()
    out = tmp_path / "documents.jsonl"
    process = forwarding(sidecar, server.url, tmp_path / "state", hub.connection_string(), "--forward-file", str(out))
    wait_until(lambda: process.value("azure_scheduled_events_vm_info", vm_name="WestNO_0", vm_id=sim.vm["vmId"],
                                     vmss_name="", location="norwayeast", resource_group="maintenance-rg",
                                     subscription_id=sim.vm["subscriptionId"], vm_size="Standard_D2s_v5", zone="1"),
               what="identity")
    step_through(sim, process)
    served = sim.distinct_served()
    assert len(served) == 4  # the docs' sequence: empty, Scheduled, Started, empty
    wait_until(lambda: len(first_copies(hub.store.all())) >= len(served)
               and process.value("azure_scheduled_events_spool_documents") == 0, what="all documents at Event Hubs")
    # A timed-out send is resent with the same message id: read everything, keep first copies.
    first: dict[str, Any] = {}
    for event in consume(hub.connection_string(), len(hub.store.all())):
        first.setdefault(event.message_id, event)
    events = list(first.values())
    assert [bytes(b"".join(e.body)) for e in events] == served
    properties = [{k.decode(): v.decode() if isinstance(v, bytes) else v for k, v in e.properties.items()}
                  for e in events]
    assert [p["sequence"] for p in properties] == [1, 2, 3, 4]
    assert [p["document_incarnation"] for p in properties] == [json.loads(b)["DocumentIncarnation"] for b in served]
    for p in properties:
        assert (p["vm_name"], p["vm_id"], p["location"], p["api_version"]) == (
            "WestNO_0", sim.vm["vmId"], "norwayeast", "2024-07-09")
    assert {e.partition_key for e in events} == {sim.vm["vmId"].encode()}
    assert len({e.message_id for e in events}) == len(served)
    assert {e.content_type for e in events} == {"application/json"}
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    for line in lines:
        jsonschema.validate(line, SCHEMA)
    assert [line["body"].encode() for line in lines] == served
    assert [line["message_id"] for line in lines] == [e.message_id for e in events]
    wait_until(lambda: process.value("azure_scheduled_events_forwarded_documents_total", sink="eventhubs") == 4,
               what="forwarded counter")
    assert process.value("azure_scheduled_events_forwarded_documents_total", sink="file") == 4
    assert process.value("azure_scheduled_events_spool_documents") == 0
    assert process.value("azure_scheduled_events_forward_latency_seconds_count") == 4
    reliability("Event Hubs", "round trip through the official SDK (producer and consumer)",
                "bodies byte-identical to what IMDS served, in order; properties, partition key and message "
                "ids as documented")


def test_event_hubs_down_at_start_then_up(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                          hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                          reliability: Reliability) -> None:
    """With nothing listening, documents are spooled and errors counted; once it listens, all arrive in order."""
    sim, server = simulator("canceled")
    hub = hubs(start=False)
    process = forwarding(sidecar, server.url, tmp_path / "state", hub.connection_string())
    step_through(sim, process)
    served = sim.distinct_served()
    wait_until(lambda: process.value("azure_scheduled_events_spool_documents") == len(served), what="spooled")
    wait_until(lambda: sum(process.value("azure_scheduled_events_forward_errors_total", sink="eventhubs",
                                         reason=reason) or 0 for reason in ("connection", "timeout")) >= 1,
               what="failed sends counted")
    assert process.value("azure_scheduled_events_up") == 1  # polling never waited on Event Hubs
    hub.start()
    wait_until(lambda: len(first_copies(hub.store.all())) == len(served), timeout=30, what="delivery after outage")
    assert [e.body for e in first_copies(hub.store.all())] == served
    wait_until(lambda: process.value("azure_scheduled_events_spool_documents") == 0, what="spool drained")
    assert "Event Hubs reachable again" in process.log()
    assert len(re.findall(r"Event Hubs send failed", process.log())) == 1
    reliability("Event Hubs", "down at start-up",
                "documents spooled, `forward_errors_total` counted, one log line, polling unaffected; "
                "all delivered in order once up")


def test_stopped_mid_stream_and_restarted(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                          hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                          reliability: Reliability) -> None:
    """Documents before, during and after an outage all arrive, in order, duplicates only by message id."""
    sim, server = simulator("demo", held=True)
    hub = hubs()
    process = forwarding(sidecar, server.url, tmp_path / "state", hub.connection_string())
    step_through(sim, process, until=5)
    wait_until(lambda: len(hub.store.all()) == len(sim.distinct_served()), what="first documents delivered")
    hub.stop()
    step_through(sim, process, until=300)
    wait_until(lambda: (process.value("azure_scheduled_events_spool_documents") or 0) > 0, what="spooling")
    hub.start()
    step_through(sim, process)
    served = sim.distinct_served()
    wait_until(lambda: len(first_copies(hub.store.all())) == len(served), timeout=30, what="all delivered")
    assert [e.body for e in first_copies(hub.store.all())] == served
    assert [e.properties["sequence"] for e in first_copies(hub.store.all())] == list(range(1, len(served) + 1))
    reliability("Event Hubs", "stopped mid-stream and restarted",
                "every document delivered, in order, duplicates only by message id")


def test_silent_peer_never_blocks_polling_or_shutdown(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                                      hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                                      reliability: Reliability) -> None:
    """A peer that accepts TCP and never answers: timeouts counted, polling goes on, SIGTERM exits at once;
    a restart against a working hub delivers what was spooled."""
    sim, server = simulator("live-migration")
    peer = SilentPeer()
    try:
        process = forwarding(sidecar, server.url, tmp_path / "state", peer.connection_string())
        step_through(sim, process, until=10)
        wait_until(lambda: (process.value("azure_scheduled_events_forward_errors_total", sink="eventhubs",
                                          reason="timeout") or 0) >= 1, timeout=30, what="timeouts counted")
        polls = process.value("azure_scheduled_events_polls_total", outcome="ok") or 0
        wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome="ok") or 0) > polls + 5,
                   what="polling goes on")
        started = time.monotonic()
        assert process.stop() == 0
        assert time.monotonic() - started < 10
        assert len(re.findall(r"Event Hubs send failed", process.log())) == 1
    finally:
        peer.close()
    hub = hubs()
    forwarding(sidecar, server.url, tmp_path / "state", hub.connection_string())
    served = sim.distinct_served()
    wait_until(lambda: [e.body for e in first_copies(hub.store.all())][:len(served)] == served, timeout=30,
               what="spooled documents delivered after restart")
    reliability("Event Hubs", "silent peer (accepts TCP, never answers)",
                "timeouts counted; polling and SIGTERM unaffected; spooled documents delivered after a "
                "restart")


def test_a_peer_that_never_settles(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                   hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                   reliability: Reliability) -> None:
    """Unsettled sends time out and are resent with the same message id; nothing is lost or reordered."""
    sim, server = simulator("live-migration")
    hub = hubs(settle=False)
    process = forwarding(sidecar, server.url, tmp_path / "state", hub.connection_string())
    step_through(sim, process, until=10)
    wait_until(lambda: len(hub.store.all()) >= 4, timeout=30, what="resends of unsettled batches")
    assert (process.value("azure_scheduled_events_forward_errors_total", sink="eventhubs", reason="timeout") or 0) >= 1
    assert len(re.findall(r"Event Hubs send failed \(timeout\)", process.log())) == 1
    assert process.value("azure_scheduled_events_spool_documents") == len(sim.distinct_served())
    hub.settle = True
    step_through(sim, process)
    served = sim.distinct_served()
    wait_until(lambda: process.value("azure_scheduled_events_spool_documents") == 0, timeout=30, what="drained")
    assert [e.body for e in first_copies(hub.store.all())] == served
    assert len(hub.store.all()) > len(served)  # duplicates happened, and first_copies proved them identical
    reliability("Event Hubs", "peer that never settles", "resent with the same message id; nothing lost or reordered")


def test_sigkill_during_an_outage_loses_nothing(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                                hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                                reliability: Reliability) -> None:
    """kill -9 while Event Hubs is down; after restart every accepted document arrives and sequences go on."""
    sim, server = simulator("demo", held=True)
    hub = hubs(start=False)
    process = forwarding(sidecar, server.url, tmp_path / "state", hub.connection_string())
    step_through(sim, process, until=200)
    spooled = len(sim.distinct_served())
    wait_until(lambda: process.value("azure_scheduled_events_spool_documents") == spooled, what="spooled")
    process.process.send_signal(signal.SIGKILL)
    process.process.wait()
    hub.start()
    restarted = forwarding(sidecar, server.url, tmp_path / "state", hub.connection_string())
    step_through(sim, restarted)
    wait_until(lambda: restarted.value("azure_scheduled_events_spool_documents") == 0, timeout=30, what="drained")
    delivered = first_copies(hub.store.all())
    bodies = [e.body for e in delivered]
    assert bodies[:spooled] == sim.distinct_served()[:spooled]
    sequences = [e.properties["sequence"] for e in delivered]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    reliability("Event Hubs", "kill -9 during an outage, then restart",
                "every accepted document delivered; sequence numbers never reused")


def test_full_spool_drops_oldest_visibly(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                         hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                         reliability: Reliability) -> None:
    """A small spool during an outage drops the oldest documents, counted and logged; the newest arrive."""
    sim, server = simulator("demo", held=True)
    hub = hubs(start=False)
    process = forwarding(sidecar, server.url, tmp_path / "state", hub.connection_string(), "--spool-max-bytes", "4KiB")
    step_through(sim, process)
    wait_until(lambda: (process.value("azure_scheduled_events_spool_dropped_documents_total") or 0) > 0,
               what="drops counted")
    assert "dropped the" in process.log()
    assert (process.value("azure_scheduled_events_spool_bytes") or 0) <= 4096
    hub.start()
    wait_until(lambda: process.value("azure_scheduled_events_spool_documents") == 0, timeout=30, what="drained")
    delivered = [e.body for e in first_copies(hub.store.all())]
    assert delivered[-1] == sim.distinct_served()[-1]
    dropped = process.value("azure_scheduled_events_spool_dropped_documents_total")
    assert len(delivered) + dropped == len(sim.distinct_served())
    reliability("Event Hubs", "spool full during an outage", "oldest dropped, counted and logged; the newest delivered")


def attempts(connected: list[float], apart: float = 0.7) -> list[float]:
    """When each send attempt began: a connection less than ``apart`` after the one before belongs to its attempt
    (the SDK's one immediate retry)."""
    begun: list[float] = []
    for before, at in itertools.pairwise([-math.inf, *connected]):
        if at - before >= apart:
            begun.append(at)
    return begun


def test_two_sidecars_against_a_dead_hub_do_not_retry_in_lock_step(simulator: SimulatorFactory,
                                                                   sidecar: Callable[..., Sidecar], tmp_path: Path,
                                                                   reliability: Reliability) -> None:
    """Two sidecars whose hub is down (every connection closed at once) wait times of their own between attempts:
    each wait lies between the first wait (1 s) and --eventhub-retry-max, differs from the other sidecar's, and
    the waits at the cap are not one fixed time; no wait is the SDK's own."""
    _, server = simulator("live-migration")
    peers = [ClosingPeer(), ClosingPeer()]
    count = 10
    try:
        for index, peer in enumerate(peers):
            forwarding(sidecar, server.url, tmp_path / f"state{index}", peer.connection_string(),
                       "--eventhub-retry-max", "3")
        wait_until(lambda: all(len(attempts(peer.connected)) >= count for peer in peers), timeout=90,
                   what=f"{count} send attempts of each sidecar")
    finally:
        for peer in peers:
            peer.close()
    gaps = [[later - earlier for earlier, later in itertools.pairwise(begun)]
            for begun in (attempts(peer.connected)[:count] for peer in peers)]
    # from the first wait (1 s) to the cap (3 s), plus connecting: up to 2 s on 2 cores under a load of 14
    assert all(0.9 <= gap <= 5.0 for each in gaps for gap in each), gaps
    assert max(abs(one - other) for one, other in zip(*gaps, strict=True)) > 0.2, gaps  # lock-step: within 10-30 ms
    assert all(max(each[2:]) - min(each[2:]) > 0.2 for each in gaps), gaps  # at the cap: drawn, not fixed
    reliability("Event Hubs", f"two sidecars against a hub that closes every connection, {count} attempts each",
                "every wait between attempts drawn between 1 s and --eventhub-retry-max, none the SDK's; the two "
                "sidecars' waits differ (not in lock-step)")


def test_consume_command_prints_the_documents(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                              hubs: Callable[..., EventHubsTestServer], tmp_path: Path) -> None:
    """`se-exporter consume` reads the pipeline back: JSON lines with properties, and a readable timeline."""
    sim, server = simulator("live-migration", held=True)
    hub = hubs()
    process = forwarding(sidecar, server.url, tmp_path / "state", hub.connection_string())
    step_through(sim, process)
    # 30 s, as the other delivery waits here: with 1 s send timeouts a loaded machine can need a few resends.
    wait_until(lambda: len(first_copies(hub.store.all())) == len(sim.distinct_served()) == 4 and process.value(
        "azure_scheduled_events_spool_documents") == 0, timeout=30, what="delivered")
    stored = str(len(hub.store.all()))  # 4, or more if a timed-out send was resent (same message id)
    env = {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": hub.connection_string(), "PATH": "/usr/bin:/bin"}
    as_json = subprocess.run([sys.executable, "-m", "se_exporter", "consume", "--format", "json", "--max-events",
                              stored, "--idle-timeout", "20"], capture_output=True, text=True, timeout=60, env=env,
                             check=False)
    assert as_json.returncode == 0, as_json.stderr  # its stderr in the report, which check=True would not show
    records = list({r["message_id"]: r for r in map(json.loads, as_json.stdout.splitlines())}.values())
    assert [r["body"].encode() for r in records] == sim.distinct_served()
    assert records[0]["properties"]["vm_name"] == "WestNO_0"
    timeline = subprocess.run([sys.executable, "-m", "se_exporter", "consume", "--max-events", stored,
                               "--idle-timeout", "20"], capture_output=True, text=True, timeout=60, env=env,
                              check=False)
    assert timeline.returncode == 0, timeline.stderr
    lines = list(dict.fromkeys(timeline.stdout.splitlines()))  # a resend prints the same line again
    assert len(lines) == 4
    assert "Freeze C7061BAC-AFDC-4513-B24B-AA5F13A16123 Scheduled NotBefore" in lines[1]
    assert "(this VM)" in lines[1]
    assert lines[3].endswith("no events")
    assert hub.connection_string().split("SharedAccessKey=")[1].split(";")[0] not in as_json.stderr + timeline.stderr


def test_a_port_in_the_connection_strings_endpoint_is_the_port_dialled(simulator: SimulatorFactory,
                                                                       sidecar: Callable[..., Sidecar],
                                                                       tmp_path: Path) -> None:
    """Endpoint=sb://HOST:PORT/ in a connection string (no emulator flag: AMQP over TLS, as against Azure) reaches
    that port: the official SDK alone would dial 5671 and fail every send."""
    _, server = simulator("live-migration")
    cert, key = self_signed_certificate(tmp_path)
    hub = EventHubsTestServer(tls=(cert, key)).start()
    try:
        connection_string = (f"Endpoint=sb://localhost:{hub.port}/;SharedAccessKeyName=k;"
                             f"SharedAccessKey=c2VjcmV0a2V5;EntityPath={hub.store.hub}")
        process = forwarding(sidecar, server.url, tmp_path / "state", connection_string,
                             "--eventhub-ca-file", str(cert))
        wait_until(lambda: process.value("azure_scheduled_events_forwarded_documents_total", sink="eventhubs"),
                   what="a document sent to the port in Endpoint")
        assert hub.store.all()
    finally:
        hub.stop()
