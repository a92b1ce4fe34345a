"""The fleet consumer's alert rules: promtool check rules, and promtool unit tests of when each fires and when not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support import fleet_overlap, fleet_two_streams, promtool

RULES = Path(__file__).parent.parent.parent / "dashboards" / "fleet-alerts.yaml"
F = "SeExporterFleet"  # every fleet alert's prefix
JOB = {"job": "se-exporter-fleet"}
A = {**JOB, "instance": "fleet-0:10170"}
B = {**JOB, "instance": "fleet-1:10170"}


def selector(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{key}="{value}"' for key, value in labels.items()) + "}"


def info(replica: dict[str, str], vm: int, vmss: str, event_type: str = "Reboot", status: str = "Scheduled",
         affects: str = "true") -> str:
    return "azure_scheduled_fleet_event_info" + selector({
        **replica, "vm_id": f"vm-{vm}", "vm_name": f"{vmss}_{vm}", "vmss_name": vmss, "location": "westeurope",
        "event_id": f"E-{vmss}", "event_type": event_type, "event_status": status, "event_source": "Platform",
        "affects_this_vm": affects})


def owned(replica: dict[str, str], *partitions: int, hub: int = 4) -> dict[str, str]:
    """What a replica says of its partitions for ten minutes: the hub's count, its own, and each one's series."""
    series = {f"azure_scheduled_fleet_hub_partitions{selector(replica)}": f"{hub}x10",
              f"azure_scheduled_fleet_owned_partitions{selector(replica)}": f"{len(partitions)}x10"}
    for partition in partitions:
        labelled = selector({**replica, "partition_id": str(partition)})
        series[f"azure_scheduled_fleet_partition_checkpoint_age_seconds{labelled}"] = "0x10"
    return series


def unreachable(replica: dict[str, str], vm: int, values: str = "1800000000x10") -> dict[str, str]:
    """One VM that cannot read IMDS, as a replica shows it (its last successful read as the value)."""
    labels = {**replica, "vm_id": f"vm-{vm}", "vm_name": f"ss_{vm}", "vmss_name": "ss", "location": "westeurope"}
    return {f"azure_scheduled_fleet_vm_imds_unreachable_since_timestamp_seconds{selector(labels)}": values}


def announced(replica: dict[str, str], event_id: str, event_type: str = "Reboot", status: str = "Scheduled",
              scope: str = "big", source: str = "Platform", **vms: int) -> dict[str, str]:
    """One platform event as a replica shows it for ten minutes: its info series and its VMs by coverage (those
    not given: 0)."""
    ident = {**replica, "event_id": event_id, "event_type": event_type}
    info_labels = {**ident, "event_status": status, "event_source": source, "scope_type": "scale_set",
                   "scope_name": scope, "resource_group": "rg", "subscription_id": fleet_two_streams.SUB,
                   "location": "westeurope"}
    series = {f"azure_scheduled_fleet_platform_event_info{selector(info_labels)}": "1x10"}
    for coverage in ("observed", "missed", "imds_unreachable", "no_sidecar"):
        labels = selector({**ident, "coverage": coverage})
        series[f"azure_scheduled_fleet_platform_event_vms{labels}"] = f"{vms.get(coverage, 0)}x10"
        if coverage != "observed" and status in ("Scheduled", "Started"):  # the fleet names those of open events
            for n in range(vms.get(coverage, 0)):
                named = selector({**ident, "coverage": coverage, "vm_name": f"{scope}_{coverage}_{n}"})
                series[f"azure_scheduled_fleet_platform_event_missed_vm_info{named}"] = "1x10"
    return series


def sidecars(replica: dict[str, str], *vms: int) -> dict[str, str]:
    """VMs whose sidecars the fleet hears from, as a replica shows them."""
    return {"azure_scheduled_fleet_vm_last_seen_timestamp_seconds" + selector({
        **replica, "vm_id": f"vm-{vm}", "vm_name": f"ss_{vm}", "vmss_name": "ss", "location": "westeurope"}):
        "1800000000x10" for vm in vms}


def platform_alert(event_id: str, event_type: str = "Reboot", scope: str = "big") -> dict[str, str]:
    return {**JOB, "event_id": event_id, "event_type": event_type, "scope_type": "scale_set", "scope_name": scope,
            "location": "westeurope"}


def many(count: int, **kwargs: Any) -> dict[str, str]:
    """``count`` VMs of scale set ss, split over two replicas as the partitions split them."""
    return {info(A if vm % 2 else B, vm, "ss", **kwargs): "1 1" for vm in range(count)}


# (alert, input series, eval time, expected alerts as (labels, value)); an empty list means: must not fire.
CASES: list[promtool.Case] = [
    (F + "ImpactfulMaintenanceOnManyVms", many(6), "1m",
     [({**JOB, "vmss_name": "ss", "event_type": "Reboot"}, 6)]),
    (F + "ImpactfulMaintenanceOnManyVms", many(5), "1m", []),  # five at once is within the threshold
    (F + "ImpactfulMaintenanceOnManyVms", many(8, event_type="Freeze"), "1m", []),  # a Freeze keeps the VM
    (F + "ImpactfulMaintenanceOnManyVms", many(8, affects="false"), "1m", []),  # listed, for other VMs
    (F + "ImpactfulMaintenanceOnManyVms", many(8, status="Started"), "1m", []),  # no longer ahead
    (F + "VmsWentSilent", {f"azure_scheduled_fleet_vm_expirations_total{selector(A)}": "0 0 3 3",
                            f"azure_scheduled_fleet_vm_expirations_total{selector(B)}": "0 0 0 1"}, "3m",
     [(JOB, 4)]),
    (F + "VmsWentSilent", {f"azure_scheduled_fleet_vm_expirations_total{selector(A)}": "2x30"}, "25m", []),
    (F + "ConsumerLagging", {f'azure_scheduled_fleet_partition_lag_seconds{selector({**A, "partition_id": "3"})}':
                              "600x15"}, "12m", [({**JOB, "partition_id": "3"}, 600)]),
    (F + "ConsumerLagging", {f'azure_scheduled_fleet_partition_lag_seconds{selector({**A, "partition_id": "3"})}':
                              "600 0 600 0 600 0 600 0 600 0 600 0 600 0"}, "12m", []),  # catching up each time
    (F + "PartitionsUnowned", owned(A, 0, 1), "6m", [(JOB, 2)]),
    (F + "PartitionsUnowned", owned(A), "6m", [(JOB, 0)]),  # no replica reads any partition
    (F + "PartitionsUnowned", {**owned(A, 0, 1), **owned(B, 2, 3)}, "6m", []),
    (F + "CheckpointsStale",
     {f'azure_scheduled_fleet_partition_checkpoint_age_seconds{selector({**A, "partition_id": "1"})}': "0+60x15"},
     "12m", [({**A, "partition_id": "1"}, 720)]),
    (F + "CheckpointsStale",
     {f'azure_scheduled_fleet_partition_checkpoint_age_seconds{selector({**A, "partition_id": "1"})}': "8x10"},
     "10m", []),
    (F + "InvalidMessages", {f'azure_scheduled_fleet_invalid_messages_total{selector({**A, "reason": "not_json"})}':
                              "0 0 2 2"}, "3m", [({**JOB, "reason": "not_json"}, 2)]),
    (F + "InvalidMessages", {f'azure_scheduled_fleet_invalid_messages_total{selector({**A, "reason": "not_json"})}':
                              "0x30"}, "20m", []),
    (F + "VmsCannotReadImds", {**unreachable(A, 1), **unreachable(B, 2), **unreachable(B, 3)}, "7m", [(JOB, 3)]),
    (F + "VmsCannotReadImds", {f"azure_scheduled_fleet_imds_unreachable_vms{selector(A)}": "0x10"}, "7m", []),
    (F + "VmsCannotReadImds", unreachable(A, 1, "1 1 1 stale 1 1 1 stale 1 1"),
     "9m", []),  # a VM failing for a few polls at a time is not held for 5 minutes
    (F + "ConsumerDown", {f"up{selector(A)}": "0 0 0 0"}, "3m", [(A, 0)]),
    (F + "ConsumerDown", {f"up{selector(A)}": "1 1 1 1"}, "3m", []),
    # A blind fleet pages: no replica answers, or those that answer own no partition.
    (F + "Blind", {f"up{selector(A)}": "0x10", f"up{selector(B)}": "0x10"}, "6m", [(JOB, 2)]),
    (F + "Blind", {f"up{selector(A)}": "1x10", **owned(A, hub=4)}, "6m", [(JOB, 4)]),
    (F + "Blind", {f"up{selector(A)}": "0x10", f"up{selector(B)}": "1x10", **owned(B, 1, 2, 3, 4)}, "6m",
     []),  # one replica left reads every partition
    (F + "Blind", {f"up{selector(A)}": "0x10", f"up{selector(B)}": "0x10"}, "4m", []),  # not for 5m yet
    # The platform stream: a live sidecar missed (or could not read IMDS for) an event Azure announced.
    (F + "SidecarMissedImpactfulEvent", announced(A, "E1", observed=4, missed=2), "1m",
     [(platform_alert("E1"), 2)]),
    (F + "SidecarMissedImpactfulEvent", announced(A, "E1", "Redeploy", "Started", missed=1, imds_unreachable=1),
     "1m", [(platform_alert("E1", "Redeploy"), 2)]),  # at once: no `for`
    (F + "SidecarMissedImpactfulEvent",  # a Spot eviction missed: nobody could have acted on it (pageSpotPreempt)
     announced(A, "E1", "Preempt", "Started", missed=1, imds_unreachable=1), "1m", []),
    (F + "SidecarMissedImpactfulEvent", announced(A, "E1", observed=4, no_sidecar=3), "1m", []),  # nobody to miss
    (F + "SidecarMissedImpactfulEvent",  # what a user asked for does not page (_config.pageSources)
     announced(A, "E1", "Terminate", source="User", missed=2), "1m", []),
    (F + "SidecarMissedImpactfulEvent", announced(A, "E1", "Freeze", missed=3), "1m", []),  # ...MissedFreeze
    (F + "SidecarMissedImpactfulEvent", announced(A, "E1", status="Completed", missed=3), "1m", []),  # over
    (F + "SidecarMissedImpactfulEvent", announced(A, "E1", status="Canceled", missed=3), "1m", []),
    (F + "SidecarMissedFreeze", announced(A, "E2", "Freeze", "Started", "ss", observed=1, missed=1), "1m",
     [(platform_alert("E2", "Freeze", "ss"), 1)]),
    (F + "SidecarMissedFreeze", announced(A, "E2", "Reboot", "Started", missed=1), "1m", []),
    (F + "SidecarMissedFreeze", announced(A, "E2", "Freeze", "Started", observed=2), "1m", []),
    # VMs with no sidecar, in a fleet that hears from sidecars.
    (F + "AnnouncedEventOnVmsWithoutSidecar", {**announced(A, "E3", "Redeploy", no_sidecar=2), **sidecars(A, 1)},
     "6m", [(platform_alert("E3", "Redeploy"), 2)]),
    (F + "AnnouncedEventOnVmsWithoutSidecar", {**announced(A, "E3", "Redeploy", no_sidecar=2), **sidecars(A, 1)},
     "4m", []),  # not yet for 5 minutes
    (F + "AnnouncedEventOnVmsWithoutSidecar", announced(A, "E3", "Redeploy", no_sidecar=2), "6m",
     []),  # the platform stream alone (no sidecar heard from at all): every VM has none, by design
    (F + "AnnouncedEventOnVmsWithoutSidecar", {**announced(A, "E3", status="Completed", no_sidecar=2),
                                                **sidecars(A, 1)}, "6m", []),
    (F + "AnnouncedEventOnVmsWithoutSidecar", {**announced(A, "E3", observed=1, missed=1), **sidecars(A, 1)},
     "6m", []),
]




def overlapping(hub_partitions: int = 2) -> dict[str, str]:
    """Ten minutes of two replicas both showing partition 1's VMs (tests/support/fleet_overlap.py), each with its own
    totals counting them, and on the platform stream the moment of a hand-over (tests/support/fleet_two_streams.py: A
    judges every VM, B already judges P1's too), both scraped fine."""
    a, b = fleet_overlap.replicas(hub_partitions)
    platform_a, platform_b = fleet_two_streams.handover()
    return {**fleet_overlap.promtool_series(a, A, 10), **fleet_overlap.promtool_series(b, B, 10),
            **fleet_overlap.promtool_series(platform_a, A, 10), **fleet_overlap.promtool_series(platform_b, B, 10),
            f"up{selector(A)}": "1x10", f"up{selector(B)}": "1x10"}


# Every alert over the overlap: only what the distinct VMs warrant fires, with their count.
OVERLAP_CASES: list[tuple[str, dict[str, str], str, list[tuple[dict[str, str], float]]]] = [
    (F + "ImpactfulMaintenanceOnManyVms", overlapping(), "6m",
     [({**JOB, "vmss_name": "big", "event_type": "Reboot"}, 6)]),  # not 9; and ss, 4 VMs shown 8 times, stays quiet
    (F + "VmsWentSilent", overlapping(), "6m", []),
    (F + "ConsumerLagging", overlapping(), "12m", []),
    (F + "PartitionsUnowned", overlapping(), "6m", []),
    (F + "PartitionsUnowned", overlapping(hub_partitions=3), "6m", [(JOB, 2)]),  # partition 2: read by none
    (F + "CheckpointsStale", overlapping(), "6m", []),
    (F + "InvalidMessages", overlapping(), "6m", []),
    (F + "VmsCannotReadImds", overlapping(), "6m", [(JOB, 1)]),  # one VM, shown by both replicas
    (F + "ConsumerDown", overlapping(), "6m", []),
    (F + "Blind", overlapping(), "6m", []),
    # One alert per EventId, not per replica. Its value: E-big's 3 VMs that missed it (A), plus P1's 2 that B judged
    # too for the moment (README: a value may count a moving partition's VMs twice); E-done missed one but is over.
    (F + "SidecarMissedImpactfulEvent", overlapping(), "6m", [(platform_alert("E-big"), 5)]),
    (F + "SidecarMissedFreeze", overlapping(), "6m", [(platform_alert("E-fz", "Freeze", "ss"), 1)]),
    (F + "AnnouncedEventOnVmsWithoutSidecar", overlapping(), "6m",  # A shows every partition: it judges no_sidecar
     [(platform_alert("E-big"), 1), ({**platform_alert("E-dark", "Redeploy", "dark"),
                                      "scope_type": "availability_set"}, 2)]),
]


def split() -> dict[str, str]:
    """Ten minutes of the platform stream's steady state over two replicas (tests/support/fleet_two_streams.py): each
    judges the VMs it shows, E-big's on both; neither shows every partition, so neither judges no_sidecar."""
    platform_a, platform_b = fleet_two_streams.split()
    return {**fleet_overlap.promtool_series(platform_a, A, 10), **fleet_overlap.promtool_series(platform_b, B, 10),
            **sidecars(A, 1), **sidecars(B, 2)}


# The platform rules over two replicas that split the VMs: each EventId once, its VMs added up over the replicas.
SPLIT_CASES: list[promtool.Case] = [
    (F + "SidecarMissedImpactfulEvent", split(), "6m", [(platform_alert("E-big"), 3)]),  # big_3 (A); big_8, big_4 (B)
    (F + "SidecarMissedFreeze", split(), "6m", [(platform_alert("E-fz", "Freeze", "ss"), 1)]),
    (F + "AnnouncedEventOnVmsWithoutSidecar", split(), "6m", []),
]


def test_every_fleet_alert_has_a_firing_and_a_silent_case() -> None:
    """No fleet alert ships untested in either direction."""
    firing, silent = promtool.firing_and_silent(CASES)
    assert firing == silent == set(promtool.rules(RULES))


def test_fleet_rules_pass_promtool_check() -> None:
    """promtool check rules finds the file valid."""
    promtool.check_rules(RULES)


def test_fleet_rules_pass_promtool_unit_tests(tmp_path: Path) -> None:
    """Every case fires exactly the expected alerts, with labels and rendered annotations."""
    promtool.run_rule_tests(RULES, CASES, tmp_path)


def test_two_replicas_splitting_the_vms_add_up_their_judgements_of_an_event(tmp_path: Path) -> None:
    """Each replica judges the VMs it shows: an EventId whose VMs are on both replicas fires once, counting the VMs
    both judged (a max over the replicas would count one replica's)."""
    promtool.run_rule_tests(RULES, SPLIT_CASES, tmp_path)


def test_two_replicas_overlapping_on_a_partition_fire_only_for_distinct_vms(tmp_path: Path) -> None:
    """Two replicas showing the same partition's VMs during a hand-over: every rule counts each VM (and each owned
    partition) once, so no phantom wave fires and the counts in the alerts are the fleet's."""
    assert {alert for alert, _, _, _ in OVERLAP_CASES} == set(promtool.rules(RULES))
    promtool.run_rule_tests(RULES, OVERLAP_CASES, tmp_path)
