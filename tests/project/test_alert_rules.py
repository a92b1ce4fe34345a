"""The alert rules: promtool check rules, and promtool unit tests of when each alert fires and when it must not."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.support import promtool

RULES = Path(__file__).parent.parent.parent / "dashboards" / "alerts.yaml"
sys.path.insert(0, str(RULES.parent))
import generate  # noqa: E402  (dashboards/ is not a package: the generator is a script)

BASE = 'job="se-exporter", instance="vm0:10169"'
LABELS = {"job": "se-exporter", "instance": "vm0:10169"}


def info(event_id: str, event_type: str, status: str, affects: str = "true") -> str:
    return (f'azure_scheduled_event_info{{{BASE}, event_id="{event_id}", event_type="{event_type}", '
            f'event_status="{status}", event_source="Platform", resource_type="VirtualMachine", '
            f'affects_this_vm="{affects}"}}')


def info_labels(event_id: str, event_type: str, status: str, affects: str = "true") -> dict[str, str]:
    return {**LABELS, "event_id": event_id, "event_type": event_type, "event_status": status,
            "event_source": "Platform", "resource_type": "VirtualMachine", "affects_this_vm": affects}


def event(name: str, event_id: str, event_type: str) -> str:
    return f'{name}{{{BASE}, event_id="{event_id}", event_type="{event_type}"}}'


NODE = "aks-nodepool1-12345678-vmss000000"
OTHER_NODE = "aks-spot-87654321-vmss000003"


def on_node(series: str, node: str = NODE) -> str:
    """A se-exporter series as scraped through the PodMonitor: its target carries the pod's `node`."""
    return series[:-1] + f', node="{node}"}}'


def condition(node: str, name: str, statuses: list[str], ksm: str = "10.244.0.7:8080") -> dict[str, str]:
    """kube_node_status_condition exactly as kube-state-metrics exposes it: for each condition one series per
    status (true, false, unknown), the current one 1 and the others 0; one status per minute here. Scraped with
    kube-state-metrics' own `node` label kept (honor_labels), as kube-prometheus-stack does."""
    return {f'kube_node_status_condition{{job="kube-state-metrics", instance="{ksm}", node="{node}", '
            f'condition="{name}", status="{status}"}}': " ".join("1" if now == status else "0" for now in statuses)
            for status in ("true", "false", "unknown")}


VM = {"vm_name": "vm-0", "vmss_name": "web", "location": "westeurope", "subscription_id": "sub-1",
      "resource_group": "rg"}
VM_INFO = ('azure_scheduled_events_vm_info{' + BASE + ", " + ", ".join(f'{k}="{v}"' for k, v in VM.items())
           + ', vm_id="id-0", vm_size="Standard_D2s_v5", zone="1"}')
NAMED = {**LABELS, **VM}  # what every sidecar alert carries: the scrape target's labels and the VM's identity


def named(series: dict[str, str], values: str = "1x20") -> dict[str, str]:
    """The series of a sidecar that has read its identity: vm_info beside them, as every live sidecar exposes."""
    return {**series, VM_INFO: values}


def event_labels(event_id: str, event_type: str, status: str) -> dict[str, str]:
    return {**NAMED, "event_id": event_id, "event_type": event_type, "event_status": status,
            "event_source": "Platform"}


def until(event_id: str, event_type: str, values: str) -> str:
    return event("azure_scheduled_event_seconds_until_not_before", event_id, event_type), values


WATCHING = f"azure_scheduled_events_watching_since_timestamp_seconds{{{BASE}}}"


def sourced(series: str, source: str) -> str:
    return series.replace('event_source="Platform"', f'event_source="{source}"')


def scheduled(event_id: str, event_type: str, seconds: int, source: str = "Platform") -> dict[str, str]:
    """An event Scheduled for this VM, ``seconds`` to NotBefore at 1m, on a named sidecar that has watched long."""
    return named({until(event_id, event_type, f"{seconds + 60} {seconds}")[0]: f"{seconds + 60} {seconds}",
                  sourced(info(event_id, event_type, "Scheduled"), source): "1 1", WATCHING: "0 0"})


def started(event_id: str, event_type: str, first_seen: int, started_at: int, watching: int | None,
            source: str = "Platform") -> dict[str, str]:
    """An event Started on this VM: first seen at ``first_seen``, Started at ``started_at`` (the same: Started at
    first sight), by a sidecar watching IMDS since ``watching`` (None: the sidecar exports no such series)."""
    series = {event("azure_scheduled_event_first_seen_timestamp_seconds", event_id, event_type): f"{first_seen}x2",
              event("azure_scheduled_event_started_timestamp_seconds", event_id, event_type): f"{started_at}x2",
              sourced(info(event_id, event_type, "Started"), source): "1x2"}
    if watching is not None:
        series[WATCHING] = f"{watching}x2"
    return named(series)


def paused(event_type: str, count: str, within: str) -> dict[str, str]:
    """The pause histogram of one event type: ``count`` pauses, ``within`` of them no longer than 5 s."""
    name = "azure_scheduled_events_pause_seconds"
    return {f'{name}_count{{{BASE}, event_type="{event_type}"}}': count,
            f'{name}_bucket{{{BASE}, event_type="{event_type}", le="5.0"}}': within}


# (alert, input series, eval time, expected alerts as (labels, value)); an empty list means: must not fire.
CASES: list[promtool.Case] = [
    # An impactful event on this VM: a warning while NotBefore is far, a page once it is near or the event started.
    ("SeExporterImpactfulEventScheduled", scheduled("E1", "Reboot", 3600), "1m",
     [(event_labels("E1", "Reboot", "Scheduled"), 3600)]),
    ("SeExporterImpactfulEventScheduled",  # days away: warns (Alertmanager repeats it at most every 12 h)
     scheduled("E1", "Redeploy", 7 * 86400), "1m", [(event_labels("E1", "Redeploy", "Scheduled"), 7 * 86400)]),
    ("SeExporterImpactfulEventImminent", scheduled("E1", "Redeploy", 7 * 86400), "1m", []),
    ("SeExporterImpactfulEventScheduled", scheduled("E1", "Reboot", 600), "1m", []),  # near: the page speaks instead
    ("SeExporterImpactfulEventScheduled",  # a Freeze is not impactful in this sense
     scheduled("E1", "Freeze", 3600), "1m", []),
    ("SeExporterImpactfulEventScheduled",  # a neighbour's Reboot
     named(dict([until("E1", "Reboot", "3660 3600")]) | {info("E1", "Reboot", "Scheduled", "false"): "1 1"}), "1m",
     []),
    ("SeExporterImpactfulEventImminent", scheduled("E1", "Reboot", 600), "1m",
     [(event_labels("E1", "Reboot", "Scheduled"), 600)]),
    ("SeExporterImpactfulEventImminent", scheduled("E1", "Reboot", 3600), "1m", []),
    # Never a page for what a user asked for: a scale-in 60 s away, a restart from the portal. They warn.
    ("SeExporterImpactfulEventImminent", scheduled("U1", "Terminate", 60, "User"), "1m", []),
    ("SeExporterImpactfulEventScheduled", scheduled("U1", "Terminate", 60, "User"), "1m",
     [({**event_labels("U1", "Terminate", "Scheduled"), "event_source": "User"}, 60)]),
    ("SeExporterImpactfulEventImminent", scheduled("U2", "Reboot", 300, "User"), "1m", []),
    ("SeExporterImpactfulEventScheduled", scheduled("U2", "Reboot", 300, "User"), "1m",
     [({**event_labels("U2", "Reboot", "Scheduled"), "event_source": "User"}, 300)]),
    ("SeExporterImpactfulEventImminent",  # a user's restart, Started: no page either
     started("U3", "Reboot", 1000, 1060, 0, "User"), "1m", []),
    # Nor for a Spot eviction 25 s away (pageSpotPreempt: false): nobody can act, Spot users accepted it.
    ("SeExporterImpactfulEventImminent", scheduled("P1", "Preempt", 25), "1m", []),
    ("SeExporterImpactfulEventScheduled", scheduled("P1", "Preempt", 25), "1m",
     [(event_labels("P1", "Preempt", "Scheduled"), 25)]),
    ("SeExporterImpactfulEventImminent", started("P2", "Preempt", 1000, 1020, 0), "1m", []),
    # Started after the sidecar saw it Scheduled: in progress, it pages (it paged while near, and goes on).
    ("SeExporterImpactfulEventImminent", started("E3", "Redeploy", 1000, 1900, 0), "1m",
     [(event_labels("E3", "Redeploy", "Started"), 0)]),
    ("SeExporterImpactfulEventImminent",  # a sidecar that has not read its identity still pages, unnamed
     {until("E3", "Reboot", "660 600")[0]: "660 600", info("E3", "Reboot", "Scheduled"): "1 1",
      f"azure_scheduled_events_up{{{BASE}}}": "1 1"}, "1m",
     [({**LABELS, "event_id": "E3", "event_type": "Reboot", "event_status": "Scheduled", "event_source": "Platform"},
       600)]),
    ("SeExporterImpactfulEventImminent",  # on AKS every series of the target carries its node: so does the alert
     {on_node(until("E5", "Terminate", "660 600")[0]): "660 600", on_node(info("E5", "Terminate", "Scheduled")): "1 1",
      on_node(VM_INFO): "1 1"}, "1m",
     [({**event_labels("E5", "Terminate", "Scheduled"), "node": NODE}, 600)]),
    ("SeExporterImpactfulEventImminent",
     named({info("E3", "Redeploy", "Started", "false"): "1 1"}) | started("E3", "Freeze", 1000, 1900, 0), "1m", []),
    # Started at first sight: a host failure if the sidecar had been watching (its state restored counts), else it
    # cannot know whether the event was announced (a pod replaced mid-wave): a warning, never a page.
    ("SeExporterHostFailure", started("E4", "Reboot", 1000, 1000, 100), "1m",
     [({**NAMED, "event_id": "E4", "event_type": "Reboot"}, 0)]),
    ("SeExporterImpactfulEventImminent", started("E4", "Reboot", 1000, 1000, 100), "1m", []),
    ("SeExporterImpactfulEventStartedBeforeWatching", started("E4", "Reboot", 1000, 1000, 100), "1m", []),
    ("SeExporterHostFailure", started("E4", "Reboot", 1000, 1000, 1000), "1m", []),  # its first read
    ("SeExporterImpactfulEventImminent", started("E4", "Reboot", 1000, 1000, 1000), "1m", []),
    ("SeExporterImpactfulEventStartedBeforeWatching", started("E4", "Reboot", 1000, 1000, 1000), "1m",
     [({**NAMED, "event_id": "E4", "event_type": "Reboot"}, 0)]),
    ("SeExporterHostFailure", started("E4", "Redeploy", 1000, 1000, 990), "1m", []),  # 10 s in: too soon to know
    ("SeExporterImpactfulEventStartedBeforeWatching", started("E4", "Redeploy", 1000, 1000, None), "1m",
     [({**NAMED, "event_id": "E4", "event_type": "Redeploy"}, 0)]),  # a sidecar that says nothing of its watch
    ("SeExporterHostFailure",  # scheduled first, started 15 minutes later: not a host failure
     started("E4", "Reboot", 1000, 1900, 100), "1m", []),
    ("SeExporterImpactfulEventStartedBeforeWatching", started("E4", "Reboot", 1000, 1900, 1000), "1m", []),
    ("SeExporterHostFailure",  # a user's auto-approved reboot (Scheduled Events Policy) skips Scheduled too: no page
     started("E4", "Reboot", 1000, 1000, 100, "User"), "1m", []),
    ("SeExporterHostFailure",  # a Freeze already Started when a sidecar first sees it
     started("E2", "Freeze", 1000, 1000, 100), "1m", []),
    ("SeExporterImpactfulEventStartedBeforeWatching", started("E2", "Freeze", 1000, 1000, 1000), "1m", []),
    # Freezes: only a long one warns, and pages only on a VM marked latency-sensitive; a short one is recorded.
    ("SeExporterLongFreeze",
     named({event("azure_scheduled_event_duration_seconds", "E2", "Freeze"): "12 12",
            info("E2", "Freeze", "Started", "unknown"): "1 1"}), "1m",
     [({**NAMED, "event_id": "E2", "event_type": "Freeze", "event_status": "Started"}, 12)]),
    ("SeExporterLongFreeze",  # 5 s is what Azure's own sample approves
     named({event("azure_scheduled_event_duration_seconds", "E2", "Freeze"): "5 5",
            info("E2", "Freeze", "Scheduled"): "1 1"}), "1m", []),
    ("SeExporterLongFreezeOnLatencySensitiveVm",
     named({event("azure_scheduled_event_duration_seconds", "E2", "Freeze"): "30 30",
            info("E2", "Freeze", "Scheduled"): "1 1",
            f'azure_scheduled_events_up{{{BASE}, latency_sensitive="true"}}': "1 1"}), "1m",
     [({**NAMED, "event_id": "E2", "event_type": "Freeze", "event_status": "Scheduled"}, 30)]),
    ("SeExporterLongFreezeOnLatencySensitiveVm",  # the same Freeze on a VM not marked: a warning only
     named({event("azure_scheduled_event_duration_seconds", "E2", "Freeze"): "30 30",
            info("E2", "Freeze", "Scheduled"): "1 1", f"azure_scheduled_events_up{{{BASE}}}": "1 1"}), "1m", []),
    # A pause felt with nothing of this VM's listed warns past unannouncedPauseSeconds (5 s); one within it, or one
    # during an announced event (a Freeze is a pause), does not.
    ("SeExporterUnannouncedPause", named(paused("none", "0 1 1", "0 0 0")), "2m", [(NAMED, 1)]),
    ("SeExporterUnannouncedPause", named(paused("none", "0 1 1", "0 1 1")), "2m", []),
    ("SeExporterUnannouncedPause", named(paused("Freeze", "0 1 1", "0 0 0")), "2m", []),
    ("SeExporterUnannouncedPause",  # 15 minutes later it is over
     named(paused("none", "0 1" + " 1" * 20, "0" + " 0" * 21), "1x22"), "20m", []),
    ("SeExporterSpotRebalanceRecommended",
     named({info("S1", "SpotRebalanceRecommendation", "Scheduled"): "1 1"}), "1m",
     [({**NAMED, "event_id": "S1", "event_type": "SpotRebalanceRecommendation", "event_status": "Scheduled",
        "event_source": "Platform", "resource_type": "VirtualMachine", "affects_this_vm": "true"}, 1)]),
    ("SeExporterSpotRebalanceRecommended",
     named({info("S1", "SpotRebalanceRecommendation", "Scheduled", "false"): "1 1"}), "1m", []),
    # AKS's node-problem-detector condition only warns where se-exporter does not list the event on that node.
    ("SeExporterAksEventNotSeen",  # an exporter elsewhere does not cover this node; two KSM replicas
     {**condition(NODE, "VMEventScheduled", ["true"] * 6), **condition(NODE, "VMEventScheduled", ["true"] * 6,
                                                                       ksm="10.244.1.9:8080"),
      on_node(info("E1", "Reboot", "Scheduled"), OTHER_NODE): "1x5"}, "4m",
     [({"node": NODE, "condition": "VMEventScheduled"}, 1)]),
    ("SeExporterAksEventNotSeen",  # se-exporter on the node lists it (even a neighbour's): its alerts speak
     {**condition(NODE, "VMEventScheduled", ["true"] * 6),
      on_node(info("E1", "Freeze", "Scheduled", "false")): "1x5"}, "4m", []),
    ("SeExporterAksEventNotSeen",  # not for 3 minutes yet
     {**condition(NODE, "VMEventScheduled", ["true"] * 6)}, "2m", []),
    ("SeExporterAksEventNotSeen",  # the condition is False (and Unknown is not True either)
     {**condition(NODE, "VMEventScheduled", ["false"] * 3 + ["unknown"] * 3)}, "5m", []),
    ("SeExporterAksEventNotSeen",  # 2 minutes of NPD's tail after the event left IMDS: no page
     {**condition(NODE, "VMEventScheduled", ["true"] * 9 + ["false"] * 3),
      on_node(info("E1", "Reboot", "Scheduled")): "1 1 1 1 1 1 stale"}, "8m", []),
    ("SeExporterAksEventNotSeen",  # a typed condition matches the event type too: a Freeze is no Preempt
     {**condition(NODE, "PreemptScheduled", ["true"] * 6),
      on_node(info("E2", "Freeze", "Scheduled")): "1x5"}, "4m",
     [({"node": NODE, "condition": "PreemptScheduled", "event_type": "Preempt"}, 1)]),
    ("SeExporterAksEventNotSeen",
     {**condition(NODE, "PreemptScheduled", ["true"] * 6),
      on_node(info("E2", "Preempt", "Scheduled")): "1x5"}, "4m", []),
    # A sidecar that stopped answering is named from its last vm_info.
    ("SeExporterDown", named({f"up{{{BASE}}}": "1 0 0 0 0"}, "1 stale"), "4m", [(NAMED, 0)]),
    ("SeExporterDown", named({f"up{{{BASE}}}": "0 0 0 0"}), "1m", []),  # not for 2 minutes yet
    ("SeExporterDown", named({f"up{{{BASE}}}": "1 1 1 1"}), "3m", []),
    ("SeExporterDown",  # a fleet replica down is the fleet's alert, not a VM whose maintenance is invisible
     {'up{job="se-exporter-fleet", instance="fleet-0:10170"}': "1 0 0 0 0"}, "4m", []),
    ("SeExporterImdsFailing", named({f"azure_scheduled_events_up{{{BASE}}}": "0 0 0 0"}), "3m", [(NAMED, 0)]),
    ("SeExporterImdsFailing", named({f"azure_scheduled_events_up{{{BASE}}}": "0 0 1 1"}), "3m", []),
    ("SeExporterStale",
     named({f"azure_scheduled_events_last_success_timestamp_seconds{{{BASE}}}": "0 0 0 0 0 0 0 0"}), "7m",
     [(NAMED, 420)]),
    ("SeExporterStale", named({f"azure_scheduled_events_last_success_timestamp_seconds{{{BASE}}}": "0+60x10"}), "7m",
     []),
    ("SeExporterForwardingBacklog",
     named({f"azure_scheduled_events_spool_documents{{{BASE}}}": "7x30",
            f'azure_scheduled_events_forwarded_documents_total{{{BASE}, sink="eventhubs"}}': "3x30"}, "1x30"), "25m",
     [(NAMED, 7)]),
    ("SeExporterForwardingBacklog",  # a backlog that drains is an outage being recovered from, not stuck
     named({f"azure_scheduled_events_spool_documents{{{BASE}}}": "7x30",
            f'azure_scheduled_events_forwarded_documents_total{{{BASE}, sink="eventhubs"}}': "0+1x30"}, "1x30"),
     "25m", []),
    ("SeExporterDocumentsDropped",
     named({f"azure_scheduled_events_spool_dropped_documents_total{{{BASE}}}": "0 0 3 3 3"}), "3m", [(NAMED, 0)]),
    ("SeExporterDocumentsDropped",
     named({f"azure_scheduled_events_spool_dropped_documents_total{{{BASE}}}": "0x20"}), "10m", []),
    ("SeExporterDocumentsDropped",  # a refused document given up (full disk), per sink: one alert per instance
     named({f"azure_scheduled_events_spool_dropped_documents_total{{{BASE}}}": "0x20",
            f'azure_scheduled_events_forward_dropped_documents_total{{{BASE}, sink="file"}}': "0 0 2 2 2",
            f'azure_scheduled_events_forward_dropped_documents_total{{{BASE}, sink="eventhubs"}}': "0 0 1 1 1"}),
     "3m", [(NAMED, 0)]),
    ("SeExporterDocumentsDropped",
     named({f'azure_scheduled_events_forward_dropped_documents_total{{{BASE}, sink="file"}}': "4x20"}), "10m", []),
]


def freeze_wave(vms: int, seconds: int) -> dict[str, str]:
    """A wave of live migrations: one started Freeze of ``seconds`` on each of ``vms`` named VMs of a scale set."""
    series: dict[str, str] = {}
    for n in range(vms):
        vm = f'job="se-exporter", instance="10.0.{n // 250}.{n % 250}:10169"'
        series[f'azure_scheduled_event_info{{{vm}, event_id="F{n}", event_type="Freeze", event_status="Started", '
               'event_source="Platform", resource_type="VirtualMachine", affects_this_vm="true"}'] = "1x5"
        series[f'azure_scheduled_event_duration_seconds{{{vm}, event_id="F{n}", event_type="Freeze"}}'] = \
            f"{seconds}x5"
        series[f'azure_scheduled_events_vm_info{{{vm}, vm_name="web_{n}", vmss_name="web", location="westeurope"}}'] \
            = "1x5"
        series[f"azure_scheduled_events_up{{{vm}}}"] = "1x5"
    return series


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    """No alert ships untested in either direction."""
    firing, silent = promtool.firing_and_silent(CASES)
    assert firing == silent == set(promtool.rules(RULES))


def test_rules_pass_promtool_check() -> None:
    """promtool check rules finds the file valid."""
    promtool.check_rules(RULES)


def test_rules_pass_promtool_unit_tests(tmp_path: Path) -> None:
    """Every case fires exactly the expected alerts, with labels and rendered annotations."""
    promtool.run_rule_tests(RULES, CASES, tmp_path)


def test_a_started_5_s_freeze_on_300_vms_pages_no_one(tmp_path: Path) -> None:
    """Azure live-migrates constantly: a wave of short started Freezes on 300 VMs fires no alert of the file at all
    (it is recorded, not alerted), while the same wave of 30 s Freezes warns once per VM and pages no one (none of
    these VMs is marked latency-sensitive)."""
    quiet = [(alert, freeze_wave(300, 5), "3m", []) for alert in promtool.rules(RULES)]
    long = [(alert, freeze_wave(300, 30), "3m", []) for alert in promtool.rules(RULES)
            if promtool.rules(RULES)[alert]["labels"]["severity"] == "critical"]
    promtool.run_rule_tests(RULES, quiet + long, tmp_path)


def restarted_mid_wave(vms: int) -> dict[str, str]:
    """A `helm upgrade` during a maintenance wave: each of ``vms`` sidecars of a scale set replaced with no state
    (emptyDir) while its VM's platform Reboot is Started, so each first sees it Started, at its first read."""
    series: dict[str, str] = {}
    for n in range(vms):
        vm = f'job="se-exporter", instance="10.0.{n // 250}.{n % 250}:10169"'
        ident = f'{vm}, event_id="R{n}", event_type="Reboot"'
        series[f'azure_scheduled_event_info{{{ident}, event_status="Started", event_source="Platform", '
               'resource_type="VirtualMachine", affects_this_vm="true"}'] = "1x5"
        series[f"azure_scheduled_event_first_seen_timestamp_seconds{{{ident}}}"] = "2000x5"
        series[f"azure_scheduled_event_started_timestamp_seconds{{{ident}}}"] = "2000x5"
        series[f"azure_scheduled_events_watching_since_timestamp_seconds{{{vm}}}"] = "2000x5"
        series[f'azure_scheduled_events_vm_info{{{vm}, vm_name="web_{n}", vmss_name="web", location="westeurope"}}'] \
            = "1x5"
    return series


def test_a_helm_upgrade_during_a_maintenance_wave_pages_no_one(tmp_path: Path) -> None:
    """300 sidecars replaced without state mid-wave each first see their VM's platform Reboot Started: no critical
    alert of the file fires (each warns, SeExporterImpactfulEventStartedBeforeWatching)."""
    critical = [(alert, restarted_mid_wave(300), "3m", []) for alert, rule in promtool.rules(RULES).items()
                if rule["labels"]["severity"] == "critical"]
    promtool.run_rule_tests(RULES, critical, tmp_path)


# _config overrides, and the cases that prove each knob moves what pages and what warns.
KNOBS: list[tuple[str, list[promtool.Case]]] = [
    ("{ pageSpotPreempt: true }", [
        ("SeExporterImpactfulEventImminent", scheduled("P1", "Preempt", 25), "1m",
         [(event_labels("P1", "Preempt", "Scheduled"), 25)]),
        ("SeExporterImpactfulEventScheduled", scheduled("P1", "Preempt", 25), "1m", []),
        ("SeExporterImpactfulEventImminent",  # a user's scale-in still does not page
         scheduled("U1", "Terminate", 60, "User"), "1m", [])]),
    ("{ pageSources: ['Platform', 'User'] }", [
        ("SeExporterImpactfulEventImminent", scheduled("U1", "Terminate", 60, "User"), "1m",
         [({**event_labels("U1", "Terminate", "Scheduled"), "event_source": "User"}, 60)]),
        ("SeExporterHostFailure", started("E4", "Reboot", 1000, 1000, 100, "User"), "1m",
         [({**NAMED, "event_id": "E4", "event_type": "Reboot"}, 0)])]),
    ("{ pageTypes: ['Reboot'], warnSources: ['Platform'] }", [
        ("SeExporterImpactfulEventImminent", scheduled("E1", "Redeploy", 600), "1m", []),
        ("SeExporterImpactfulEventScheduled", scheduled("E1", "Redeploy", 600), "1m",
         [(event_labels("E1", "Redeploy", "Scheduled"), 600)]),
        ("SeExporterImpactfulEventScheduled", scheduled("U2", "Reboot", 300, "User"), "1m", [])]),
    ("{ warnTypes: ['Reboot', 'Redeploy', 'Terminate'] }", [
        ("SeExporterImpactfulEventScheduled", scheduled("P1", "Preempt", 25), "1m", [])]),
    ("{ hostFailureWatchedSeconds: 0, impactfulPageSeconds: 1800 }", [
        ("SeExporterHostFailure", started("E4", "Reboot", 1000, 1000, 1000), "1m",
         [({**NAMED, "event_id": "E4", "event_type": "Reboot"}, 0)]),
        ("SeExporterImpactfulEventStartedBeforeWatching", started("E4", "Reboot", 1000, 1000, 1000), "1m", []),
        ("SeExporterImpactfulEventImminent", scheduled("E1", "Reboot", 1500), "1m",
         [(event_labels("E1", "Reboot", "Scheduled"), 1500)])]),
]


@pytest.mark.parametrize(("config", "cases"), KNOBS, ids=[config for config, _ in KNOBS])
def test_the_paging_knobs_of_config_move_what_pages(config: str, cases: list[promtool.Case], tmp_path: Path) -> None:
    """Each _config knob of the severity model, rendered by the real jsonnet, changes exactly what its cases say."""
    path = tmp_path / "alerts.yaml"
    path.write_text(generate.rule_file("alerts", "se-exporter", config))
    (tmp_path / "run").mkdir()
    promtool.run_rule_tests(path, cases, tmp_path / "run")


def test_the_npd_rule_and_the_vm_panel_select_the_same_node_conditions() -> None:
    """The rule and the dashboard panel agree on which node conditions are Scheduled-Events ones (AKS documents
    VMEventScheduled; the per-type names are its Event reasons), and neither takes any other condition."""
    vm = json.loads((RULES.parent / "se-exporter-vm.json").read_text())
    (panel_expr,) = [p["targets"][0]["expr"] for p in vm["panels"] if p["title"].startswith("AKS node conditions")]
    rule_expr = promtool.rules(RULES)["SeExporterAksEventNotSeen"]["expr"]

    def selected(expr: str) -> set[str]:
        patterns = re.findall(r'condition=~?"([^"]+)"', expr)
        return {name for name in candidates if any(re.fullmatch(p, name) for p in patterns)}

    documented = {"VMEventScheduled", "FreezeScheduled", "RebootScheduled", "RedeployScheduled", "PreemptScheduled",
                  "TerminateScheduled"}
    candidates = documented | {"Ready", "MemoryPressure", "KernelDeadlock", "FrequentKubeletRestart",
                               "PreemptionScheduled"}
    assert selected(panel_expr) == selected(rule_expr) == documented
