"""`se-exporter fleet` against the bare SDK: the same burst of documents, applied vs merely received.

    python scripts/fleet_bench.py           (make bench)  10,000 documents
    python scripts/fleet_bench.py --smoke   a few hundred, to keep the script working (make test)
    python scripts/fleet_bench.py --platform [--smoke]   the same for a burst of platform messages

Two phases, each with its own Event Hubs test server in its own process (4 partitions) and nothing else running:
first a bare `EventHubConsumerClient.receive_batch` (same batch size and prefetch as `fleet`, no checkpoint store)
receives a burst of N forwarded documents; then `se-exporter fleet` (Azurite as its checkpoint store) takes the
same burst: the time until it has applied all N (its own timestamp of the batch that completed them) and the time
until /metrics reflects them (read every POLL seconds) are measured. Both consumers wait, connected and idle, before
the burst is enqueued at once, so every time runs from the burst. The phases alternate three times and the best of
each counts. The fleet's RSS is read before and after: the memory its N VMs cost. Targets are printed beside the
figures; nothing fails on a missed target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from azure.eventhub.aio import EventHubConsumerClient  # noqa: E402 - after the path set-up above
from proton import Message  # noqa: E402

from se_exporter.fleet.consumer import BATCH_SIZE, EMPTY_BATCH_AFTER  # noqa: E402
from se_exporter.sidecar.forwarding.envelope import Envelope  # noqa: E402
from tests.support.eventhubs_server import EventHubsTestServer, Store  # noqa: E402
from tests.support.fleet_helpers import Azurite, FleetProcess, envelope_for, fleet_vm  # noqa: E402
from tests.support.helpers import free_port, wait_until  # noqa: E402

PARTITIONS = 4
# /metrics is read every POLL seconds during the burst (a scrape of 10,000 VMs costs the fleet ~35 ms of CPU, which
# the burst pays too): "reflected" is late by at most POLL; "applied" is exact, from the fleet's own timestamp of
# the batch that completed the burst.
POLL = 0.5
APPLIED = re.compile(rb"^azure_scheduled_fleet_documents_applied_total\{[^}]*\} (\S+)$", re.MULTILINE)
LAST_APPLIED = re.compile(rb"^azure_scheduled_fleet_last_applied_timestamp_seconds (\S+)$", re.MULTILINE)
PLATFORM_APPLIED = re.compile(rb"^azure_scheduled_fleet_platform_messages_applied_total (\S+)$", re.MULTILINE)
PLATFORM_LAST = re.compile(rb"^azure_scheduled_fleet_platform_last_applied_timestamp_seconds (\S+)$", re.MULTILINE)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else 0.0


# ---------------------------------------------------------------- the hub, in its own process


def hub_message(envelope: Envelope) -> Message:
    """The message the sidecar would send for ``envelope``, ready for ``Store.append`` inside the hub's process
    (the producer's AMQP encoding left out: the benchmarks measure the consumers, not the sender)."""
    return Message(body=envelope.body, inferred=True, id=envelope.message_id, content_type="application/json",
                   properties=dict(envelope.properties))


def platform_messages(count: int) -> list[tuple[str, Message, None]]:
    """``count`` platform messages as Event Grid delivers them to a hub (an array of one event, no partition key:
    spread over the partitions): each a new EventId of a scale set of 7, Scheduled, naming two of its VMs."""
    from tests.fleet.platform_helpers import T0, grid  # noqa: PLC0415 - only for this mode

    messages = []
    for index in range(count):
        event_id = str(uuid.UUID(int=index + 1))
        event = grid("Scheduled", event_id=event_id, at=T0 + index, resources=[f"vm-{index}", f"vm-{index + 1}"])
        body = json.dumps([event]).encode()
        messages.append((str(index % PARTITIONS), Message(body=body, inferred=True, content_type="application/json"),
                         None))
    return messages


def serve_hub(count: int, kind: str = "documents") -> None:
    """Serve an empty hub; on 'burst' from stdin enqueue ``count`` forwarded documents (or platform messages) at once,
    print the time."""
    store = Store(partition_count=PARTITIONS)
    server = EventHubsTestServer(store, port=free_port()).start()
    installation = str(uuid.uuid4())
    messages: list[tuple[str, Message, str | None]] = list(platform_messages(count)) if kind == "platform" else []
    for index in range(count if kind == "documents" else 0):
        identity, raw = fleet_vm(index)
        envelope = envelope_for(identity, raw, index + 1, f"{installation}-{index}")  # one sidecar per VM
        messages.append((store.partition_for(envelope.partition_key), hub_message(envelope), envelope.partition_key))
    print(server.connection_string(), flush=True)
    for line in sys.stdin:
        if line.strip() == "burst":
            started = time.time()
            for partition_id, message, key in messages:
                store.append(partition_id, message, key)
            print(json.dumps({"burst_at": started, "enqueued_in": time.time() - started}), flush=True)
        elif line.strip() == "stop":
            break
    server.stop()


class Hub:
    def __init__(self, count: int, kind: str = "documents") -> None:
        self.process = subprocess.Popen(  # noqa: S603 - this script, by our own interpreter
            [sys.executable, __file__, "--serve-hub", str(count), "--kind", kind], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.connection_string = self.process.stdout.readline().strip()

    def burst(self) -> float:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("burst\n")
        self.process.stdin.flush()
        return float(json.loads(self.process.stdout.readline())["burst_at"])

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("stop\n")
        self.process.stdin.flush()
        self.process.wait(30)


# ---------------------------------------------------------------- the bare SDK, in its own process

# What `fleet` passes to receive_batch (the SDK's default prefetch, 300, in both): the reference receives alike.
BARE_RECEIVE: dict[str, Any] = {"max_batch_size": BATCH_SIZE, "max_wait_time": EMPTY_BATCH_AFTER}


def bare_receive(connection_string: str, count: int) -> None:
    """Receive with the SDK alone; print 'ready' once every partition waits, then the time the count-th arrived."""
    async def run() -> None:
        client = EventHubConsumerClient.from_connection_string(connection_string, consumer_group="$Default")
        received = 0
        idle: set[str] = set()
        done = asyncio.Event()

        async def on_batch(context: Any, events: list[Any]) -> None:
            nonlocal received
            if not events:
                if len(idle) < PARTITIONS:
                    idle.add(context.partition_id)
                    if len(idle) == PARTITIONS:
                        print("ready", flush=True)
                return
            received += len(events)
            if received >= count:
                print(json.dumps({"done_at": time.time()}), flush=True)
                done.set()

        task = asyncio.create_task(client.receive_batch(on_batch, **BARE_RECEIVE, starting_position="-1"))
        await done.wait()
        await client.close()
        task.cancel()

    asyncio.run(run())


def bare_phase(count: int, kind: str = "documents") -> dict[str, float]:
    hub = Hub(count, kind)
    try:
        receiver = subprocess.Popen(  # noqa: S603 - this script, by our own interpreter
            [sys.executable, __file__, "--bare", hub.connection_string, str(count)], stdout=subprocess.PIPE, text=True)
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        cpu = cpu_seconds(receiver.pid)
        burst_at = hub.burst()
        done_at = float(json.loads(receiver.stdout.readline())["done_at"])
        cpu = cpu_seconds(receiver.pid) - cpu
        receiver.wait(30)
        return {"received_s": done_at - burst_at, "cpu_s": cpu}
    finally:
        hub.stop()


# ---------------------------------------------------------------- the fleet consumer


def applied(url: str, kind: str = "documents") -> tuple[float, float]:
    """Documents (or platform messages) applied so far, and when the last of them was applied (the fleet's own
    clock, this machine's)."""
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback only
        text = response.read()
    counted, last = (PLATFORM_APPLIED, PLATFORM_LAST) if kind == "platform" else (APPLIED, LAST_APPLIED)
    stamp = last.search(text)
    return sum(float(value) for value in counted.findall(text)), float(stamp.group(1)) if stamp else 0.0


def fleet_phase(count: int, work: Path, kind: str = "documents") -> dict[str, float]:
    hub = Hub(count, kind)
    azurite = Azurite(work / "azurite")
    # The default intervals, as in production: the first load-balancing round claims every partition at start.
    fleet: FleetProcess | None = None
    try:
        if kind == "platform":  # the platform's hub alone: an agentless fleet
            fleet = FleetProcess(None, azurite.connection_string, work / "fleet", env={
                "SE_EXPORTER_PLATFORM_EVENTHUB_CONNECTION_STRING": hub.connection_string})
        else:
            fleet = FleetProcess(hub.connection_string, azurite.connection_string, work / "fleet")
        wait_until(lambda: fleet.value("azure_scheduled_fleet_owned_partitions") == PARTITIONS, timeout=60,
                   what="the fleet to own every partition")
        time.sleep(2)  # idle RSS after the claims' one-time allocations, not a wait for a condition
        idle_rss, cpu = rss_mb(fleet.process.pid), cpu_seconds(fleet.process.pid)
        burst_at = hub.burst()
        while (progress := applied(fleet.metrics_url, kind))[0] < count:
            time.sleep(POLL)
        reflected = time.time() - burst_at
        cpu = cpu_seconds(fleet.process.pid) - cpu  # scrapes included: they are part of serving the fleet
        loaded_rss = rss_mb(fleet.process.pid)
        return {"applied_s": progress[1] - burst_at, "reflected_s": reflected, "cpu_s": cpu, "idle_rss_mb": idle_rss,
                "loaded_rss_mb": loaded_rss}
    finally:  # also when the fleet could not start: no emulator left behind
        if fleet is not None:
            fleet.stop()
        azurite.stop()
        hub.stop()


def scrape_vms(count: int) -> list[Any]:
    """``count`` VMs as the fleet holds them: every tenth in one of 7 scale sets with a Reboot scheduled (fleet_vm)."""
    from se_exporter.fleet.message import FleetEvent, VmState  # noqa: PLC0415 - only for this part

    vms = []
    for index in range(count):
        vmss = f"ss{index % 7}" if index % 10 == 0 else ""
        events = (FleetEvent(f"reboot-{index}", "Reboot", "Scheduled", "Platform", "true", 2e9 + 600, None),) \
            if vmss else ()
        vms.append(VmState(f"id-{index}", f"id-{index}", f"vm{index}", vmss, "norwayeast", "i", 1, 2e9, b"", events))
    return vms


def scrape_figures(count: int, rounds: int) -> tuple[float, float]:
    """Thread CPU of one scrape's per-VM families at ``count`` VMs: the fleet's writer (``FleetExposition``, from
    nothing: a first scrape) beside prometheus-client's ``GaugeMetricFamily`` and ``generate_latest`` over the same
    VMs (tests/fleet/reference_exposition.py), alternated, median of ``rounds`` each: the figure that keeps the
    writer."""
    from se_exporter.fleet.scrape import FleetExposition  # noqa: PLC0415
    from se_exporter.fleet.vms import Fleet, PartitionState  # noqa: PLC0415 - only for this part
    from se_exporter.infra.http_pages import pieces  # noqa: PLC0415
    from tests.fleet.reference_exposition import families, library_writer, text  # noqa: PLC0415

    vms, now = scrape_vms(count), 2e9
    fleet = Fleet()
    fleet.claim("0", PartitionState({vm.key: vm for vm in vms}))
    library = library_writer(vms, now)
    assert families(text(FleetExposition(fleet).render(now))) == families(library().decode()), \
        "the two ways must write the same families"
    writer_ms, library_ms = [], []
    for _ in range(rounds):
        exposition = FleetExposition(fleet)
        started = time.thread_time()
        b"".join(pieces(exposition.render(now)))  # every byte the scrape sends
        writer_ms.append((time.thread_time() - started) * 1000)
        started = time.thread_time()
        library()
        library_ms.append((time.thread_time() - started) * 1000)
    writer, reference = sorted(writer_ms)[rounds // 2], sorted(library_ms)[rounds // 2]
    print(f"fleet scrape of {count:,} VMs (thread CPU, median of {rounds}): the fleet's writer {writer:.1f} ms, "
          f"prometheus-client's families {reference:.1f} ms: {writer / reference:.2f}x", file=sys.stderr)
    return writer, reference


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few hundred documents: checks the script works")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "measurements" / "fleet-bench.json")
    parser.add_argument("--scrape", action="store_true",
                        help="only the scrape: the fleet's writer beside prometheus-client's families, 10,000 VMs")
    parser.add_argument("--platform", action="store_true",
                        help="a burst of platform messages (Event Grid's) instead of forwarded documents, to the "
                             "platform's hub alone; writes docs/measurements/fleet-platform-bench.json")
    parser.add_argument("--serve-hub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="documents", help=argparse.SUPPRESS)
    parser.add_argument("--bare", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_hub is not None:
        serve_hub(args.serve_hub, args.kind)
        return 0
    if args.platform:
        return platform_main(args.smoke, ROOT / "docs" / "measurements" / "fleet-platform-bench.json")
    if args.bare:
        bare_receive(args.bare[0], int(args.bare[1]))
        return 0
    count = 300 if args.smoke else 10_000
    scrape_writer, scrape_reference = scrape_figures(count, 3 if args.smoke else 15)
    if args.scrape:
        return 0
    bares, fleets = [], []
    for _round in range(1 if args.smoke else 3):  # alternated, best of each: this machine is shared and noisy
        bares.append(bare_phase(count))
        with tempfile.TemporaryDirectory() as work:
            fleets.append(fleet_phase(count, Path(work)))
    bare = min(run["received_s"] for run in bares)
    fleet = min(fleets, key=lambda run: run["applied_s"])
    ratio = bare / fleet["applied_s"]
    bare_cpu, fleet_cpu = min(run["cpu_s"] for run in bares), min(run["cpu_s"] for run in fleets)
    per_10k = (fleet["loaded_rss_mb"] - fleet["idle_rss_mb"]) * 10_000 / count
    figures = [
        (f"bare SDK: burst of {count:,} received", bare, "s", ""),
        (f"fleet: burst of {count:,} applied", fleet["applied_s"], "s", ""),
        (f"fleet: burst of {count:,} reflected on /metrics", min(run["reflected_s"] for run in fleets), "s",
         f"<= {2 * bare:.2f} s (2x)"),
        ("fleet applied rate / bare SDK receive rate", ratio, "x", ">= 0.75"),
        (f"bare SDK: CPU for {count:,}", bare_cpu, "s", ""),
        (f"fleet: CPU for {count:,} (scrapes included)", fleet_cpu, "s", ""),
        ("fleet RSS idle, every partition owned", fleet["idle_rss_mb"], "MB", ""),
        (f"fleet RSS with {count:,} VMs", fleet["loaded_rss_mb"], "MB", ""),
        ("fleet memory per 10,000 VMs", per_10k, "MB", ""),
        (f"fleet: CPU of one scrape's fleet families, {count:,} VMs", scrape_writer, "ms", ""),
        ("  ... its writer / prometheus-client's families", scrape_writer / scrape_reference, "x",
         "<= 0.5 (else use the library)"),
    ]
    return report("se-exporter fleet benchmark", args.smoke, args.output, bares, fleets, figures,
                  {"documents": count}, 48)


def platform_main(smoke: bool, output: Path) -> int:
    """The platform burst: the bare SDK receiving N platform messages against the fleet applying them (folded into
    its pictures; reconciled on its loop meanwhile), alternated, best of each.

    Both sides get the same N messages from a hub of their own, started afresh for the phase, and both times run
    from the hub's clock reading just before it enqueues the burst. The bare SDK's time ends when its batch callback
    has been handed the N-th event (no checkpoint store, no tracking of the last enqueued event, nothing done with
    the events). The fleet's ends at its own timestamp of the batch that completed the N-th platform message applied
    (read, checked, deduplicated and folded into a picture), which the script reads from /metrics once
    ``platform_messages_applied_total`` there shows all N; the fleet also tracks the last enqueued event (for its
    lag metrics) and owns its partitions through Azurite, so the reference does less than the fleet asks of the
    SDK."""
    count = 300 if smoke else 10_000
    bares, fleets = [], []
    for _round in range(1 if smoke else 3):
        bares.append(bare_phase(count, "platform"))
        with tempfile.TemporaryDirectory() as work:
            fleets.append(fleet_phase(count, Path(work), "platform"))
    bare = min(run["received_s"] for run in bares)
    fleet = min(fleets, key=lambda run: run["applied_s"])
    figures = [
        (f"bare SDK: burst of {count:,} platform messages received", bare, "s", ""),
        (f"fleet: burst of {count:,} platform messages applied", fleet["applied_s"], "s", ""),
        ("fleet platform applied rate / bare SDK receive rate", bare / fleet["applied_s"], "x", ">= 0.75"),
        (f"bare SDK: CPU for {count:,}", min(run["cpu_s"] for run in bares), "s", ""),
        (f"fleet: CPU for {count:,} (reconciliation and scrapes included)", min(run["cpu_s"] for run in fleets),
         "s", ""),
        (f"fleet RSS with {count:,} platform events", fleet["loaded_rss_mb"], "MB", ""),
        ("fleet RSS idle, every partition owned", fleet["idle_rss_mb"], "MB", ""),
    ]
    return report("se-exporter fleet platform benchmark", smoke, output, bares, fleets, figures,
                  {"platform_messages": count}, 60)


def report(title: str, smoke: bool, output: Path, bares: list[dict[str, Any]], fleets: list[dict[str, Any]],
           figures: list[tuple[str, float, str, str]], size: dict[str, int], width: int) -> int:
    """Print the rounds (stderr), the figures and their JSON; a full run also writes the JSON to ``output``."""
    print("rounds: bare " + ", ".join(f"{run['received_s']:.2f}" for run in bares) + " s; fleet applied "
          + ", ".join(f"{run['applied_s']:.2f}" for run in fleets) + " s", file=sys.stderr)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"{title} ({'smoke' if smoke else 'full'}) on {machine}")
    for name, measured, unit, target in figures:
        print(f"  {name:<{width}} {measured:10.3f} {unit:<3} {target}")
    result = {"machine": machine, "mode": "smoke" if smoke else "full", **size,
              "figures": [{"figure": name, "measured": round(measured, 4), "unit": unit, "target": target}
                          for name, measured, unit, target in figures]}
    if not smoke:
        output.parent.mkdir(exist_ok=True)
        output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
