"""State bytes written per checkpoint interval for one partition in steady state, against writing it whole.

    python scripts/state_bytes.py            3,125 VMs, 100 heartbeats per interval, 120 intervals
    python scripts/state_bytes.py --smoke    a few intervals, to keep the script working

One partition of VMS VMs (one in ten with a scheduled event in its document, the rest none, as a quiet fleet is)
is read through the fleet service into the in-memory state store; then each interval HEARTBEATS of them send their
unchanged document again (a heartbeat: 3,125 VMs at one heartbeat per 300 s are about 100 per 10 s interval) and
the state is written, as the checkpoint task does. The figures are what
`azure_scheduled_fleet_state_bytes_written_total` counts (blocks and block lists uploaded), the CPU time of
reading the heartbeats and writing, and the bytes of the heartbeats' documents, all from one run, and printed as
ratios to the whole state's bytes (the first base: what a write of every VM costs) and to the documents' bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fleet.test_service import Event, Replica, run, save


def document(index: int) -> bytes:
    events = [] if index % 10 else [{
        "EventId": f"{index:08X}-1A2B-4C3D-8E9F-0A1B2C3D4E5F", "EventType": "Freeze", "ResourceType": "VirtualMachine",
        "Resources": [f"vmss_{index}"], "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT",
        "Description": "Virtual machine is going to be paused for a platform update.", "EventSource": "Platform",
        "DurationInSeconds": 9}]
    return json.dumps({"DocumentIncarnation": 3, "Events": events}).encode()


def measure(vms: int, heartbeats: int, intervals: int) -> dict[str, float]:
    replica = Replica()
    run(replica.claim())
    position = 0
    for start in range(0, vms, 1000):
        events = [Event(position + n + 1, f"vm-{index:05d}", 1, document(index))
                  for n, index in enumerate(range(start, min(start + 1000, vms)))]
        position += len(events)
        run(replica.read(*events))
    run(save(replica.service, "0"))
    written = {kind: replica.value("azure_scheduled_fleet_state_bytes_written_total", kind=kind) or 0.0
               for kind in ("base", "delta")}
    received = 0
    cpu = time.process_time()
    for interval in range(intervals):
        indexes = [(interval * heartbeats + n) % vms for n in range(heartbeats)]
        events = [Event(position + n + 1, f"vm-{index:05d}", 2 + interval, document(index))
                  for n, index in enumerate(indexes)]
        position += len(events)
        received += sum(len(document(index)) for index in indexes)
        run(replica.read(*events))
        run(save(replica.service, "0"))
    cpu = time.process_time() - cpu
    after = {kind: replica.value("azure_scheduled_fleet_state_bytes_written_total", kind=kind) or 0.0
             for kind in ("base", "delta")}
    steady = {kind: (after[kind] - written[kind]) / intervals for kind in after}
    return {"bytes_per_interval": steady["base"] + steady["delta"], "base_per_interval": steady["base"],
            "delta_per_interval": steady["delta"], "documents_per_interval": received / intervals,
            "cpu_ms_per_interval": 1000 * cpu / intervals, "first_base": written["base"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    vms, heartbeats, intervals = (200, 10, 5) if args.smoke else (3125, 100, 120)
    figures = measure(vms, heartbeats, intervals)
    print(f"{vms} VMs, {heartbeats} heartbeats per interval, {intervals} intervals (one partition)")
    print("  " + ", ".join(f"{name} {value:,.1f}" for name, value in figures.items()))
    print(f"bytes per interval / the whole state's: {figures['bytes_per_interval'] / figures['first_base']:.3f}; "
          f"/ the heartbeats' documents': {figures['bytes_per_interval'] / figures['documents_per_interval']:.2f}")


if __name__ == "__main__":
    main()
