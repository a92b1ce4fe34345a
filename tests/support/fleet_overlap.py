"""Two `se-exporter fleet` replicas caught in a partition hand-over: both expose partition 1's VMs at once.

Each replica's /metrics is written by the consumer's own ``scrape`` (its per-VM writer and registry), so
its totals (`vms`, `pending_vms`, `event_vms`, `imds_unreachable_vms`, `owned_partitions`) include the overlap
exactly as a real replica's would. The rules' promtool tests (tests/fleet/test_alerts.py) and the dashboard's
queries on a real Prometheus (tests/integration/test_fleet_overlap.py) read the same two expositions and must
count every VM once: the constants below hold what each fleet total is, the summed totals being larger.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from se_exporter.fleet.collector import FleetMetrics, PartitionCollector, PartitionView
from se_exporter.fleet.message import NO_IMDS, FleetEvent, Imds, VmState
from se_exporter.fleet.scrape import FleetExposition, scrape
from se_exporter.fleet.vms import Fleet, PartitionState
from se_exporter.infra.http_pages import pieces

NOT_BEFORE_IN = 600.0  # seconds from the scrape to each Scheduled event's NotBefore


def event(event_id: str, event_type: str, status: str, affects: str = "true") -> FleetEvent:
    not_before = time.time() + NOT_BEFORE_IN if status == "Scheduled" else None
    return FleetEvent(event_id, event_type, status, "Platform", affects, not_before, -1.0)


def vm(name: str, vmss: str = "", events: tuple[FleetEvent, ...] = (), imds: Imds = NO_IMDS) -> VmState:
    return VmState(f"id-{name}", f"id-{name}", name, vmss, "westeurope", f"inst-{name}", 1, time.time() - 30, b"{}",
                   events, imds)


def partition_0() -> list[VmState]:
    """Only on replica A: three VMs of scale set `big` facing a Reboot, one VM in a Redeploy."""
    return [*(vm(f"big_{i}", "big", (event("E-big", "Reboot", "Scheduled"),)) for i in range(3)),
            vm("maint", events=(event("E-maint", "Redeploy", "Started"),))]


def partition_1() -> list[VmState]:
    """On both replicas during the hand-over: three more of `big`, four of `ss` facing a Reboot, one VM that cannot
    read IMDS, one listing a neighbour's Freeze (which does not concern it)."""
    return [*(vm(f"big_{i}", "big", (event("E-big", "Reboot", "Scheduled"),)) for i in range(3, 6)),
            *(vm(f"ss_{i}", "ss", (event("E-ss", "Reboot", "Scheduled"),)) for i in range(4)),
            vm("blind", imds=Imds(failing=True)),
            vm("neighbour", events=(event("E-fz", "Freeze", "Scheduled", affects="false"),))]


def exposition(vms: list[VmState], owned: list[str], hub_partitions: int) -> str:
    """One replica's /metrics as the consumer writes it: the fleet families, then the consumer's own."""
    registry = CollectorRegistry()
    FleetMetrics(registry)
    views = {partition_id: PartitionView(lag_events=0.0, lag_seconds=0.0) for partition_id in owned}
    registry.register(PartitionCollector(lambda: views, lambda: hub_partitions))
    fleet = Fleet()
    fleet.claim("0", PartitionState({vm.key: vm for vm in vms}))
    return b"".join(pieces(scrape(registry, FleetExposition(fleet), time.time()))).decode()


def replicas(hub_partitions: int = 2) -> tuple[str, str]:
    """Replica A still holds partitions 0 and 1; replica B has taken partition 1 over and shows it already."""
    return (exposition(partition_0() + partition_1(), ["0", "1"], hub_partitions),
            exposition(partition_1(), ["1"], hub_partitions))


# What each fleet total is: every VM once, whichever replicas expose it.
VMS = 13.0
IMPACTFUL_VMS = 11.0  # 6 of big, 4 of ss, maint
STARTED_VMS = 1.0
UNREACHABLE_VMS = 1.0
EVENT_VMS: dict[tuple[str, ...], float] = {("E-big", "Reboot"): 6.0, ("E-ss", "Reboot"): 4.0,
                                           ("E-maint", "Redeploy"): 1.0}
PENDING_VMS: dict[tuple[str, ...], float] = {("Reboot", "Scheduled"): 10.0, ("Redeploy", "Started"): 1.0}
VMSS_VMS: dict[tuple[str, ...], float] = {("big", "Reboot"): 6.0, ("ss", "Reboot"): 4.0}
VM_IDS = {f"id-{name}" for name in
          [*(f"big_{i}" for i in range(6)), *(f"ss_{i}" for i in range(4)), "maint", "blind", "neighbour"]}


def promtool_series(text: str, labels: dict[str, str], minutes: int) -> dict[str, str]:
    """Every sample of an exposition as a promtool input series, with the scrape's ``labels`` added, holding its
    value for ``minutes`` (the counters' creation times left out: no rule reads them)."""
    series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            merged = {**sample.labels, **labels}
            selector = ", ".join(f'{key}="{value}"' for key, value in sorted(merged.items()))
            series[f"{sample.name}{{{selector}}}"] = f"{sample.value!r}+0x{minutes}"
    return series
