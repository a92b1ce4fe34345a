"""The alert rules: promtool check rules, and promtool unit tests of when each alert fires and when it must not."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests import promtool

RULES = Path(__file__).parent.parent.parent / "dashboards" / "alerts.yaml"
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


# (alert, input series, eval time, expected alerts as (labels, value)); an empty list means: must not fire.
CASES: list[promtool.Case] = [
    ("AzureImpactfulMaintenanceScheduled",
     {event("azure_scheduled_event_seconds_until_not_before", "E1", "Reboot"): "660 600",
      info("E1", "Reboot", "Scheduled"): "1 1"}, "1m",
     [({**LABELS, "event_id": "E1", "event_type": "Reboot", "event_source": "Platform"}, 600)]),
    ("AzureImpactfulMaintenanceScheduled",  # a Freeze is not impactful in this sense
     {event("azure_scheduled_event_seconds_until_not_before", "E1", "Freeze"): "660 600",
      info("E1", "Freeze", "Scheduled"): "1 1"}, "1m", []),
    ("AzureImpactfulMaintenanceScheduled",  # a neighbour's Reboot
     {event("azure_scheduled_event_seconds_until_not_before", "E1", "Reboot"): "660 600",
      info("E1", "Reboot", "Scheduled", "false"): "1 1"}, "1m", []),
    ("AzureLongFreezeScheduled",
     {event("azure_scheduled_event_duration_seconds", "E2", "Freeze"): "12 12",
      info("E2", "Freeze", "Scheduled", "unknown"): "1 1"}, "1m",
     [({**LABELS, "event_id": "E2", "event_type": "Freeze"}, 12)]),
    ("AzureLongFreezeScheduled",  # 5 s is what Azure's own sample approves
     {event("azure_scheduled_event_duration_seconds", "E2", "Freeze"): "5 5",
      info("E2", "Freeze", "Scheduled"): "1 1"}, "1m", []),
    ("AzureLongFreezeScheduled",  # already started: AzureMaintenanceStarted speaks then
     {event("azure_scheduled_event_duration_seconds", "E2", "Freeze"): "12 12",
      info("E2", "Freeze", "Started"): "1 1"}, "1m", []),
    ("AzureMaintenanceStarted",
     {info("E3", "Redeploy", "Started"): "1 1"}, "1m", [(info_labels("E3", "Redeploy", "Started"), 1)]),
    ("AzureMaintenanceStarted", {info("E3", "Redeploy", "Scheduled"): "1 1"}, "1m", []),
    ("AzureMaintenanceStarted", {info("E3", "Redeploy", "Started", "false"): "1 1"}, "1m", []),
    ("AzureHostFailure",
     {event("azure_scheduled_event_started_timestamp_seconds", "E4", "Reboot"): "1000 1000",
      event("azure_scheduled_event_first_seen_timestamp_seconds", "E4", "Reboot"): "1000 1000",
      info("E4", "Reboot", "Started"): "1 1"}, "1m",
     [({**LABELS, "event_id": "E4", "event_type": "Reboot"}, 0)]),
    ("AzureHostFailure",  # scheduled first, started 15 minutes later: not a host failure
     {event("azure_scheduled_event_started_timestamp_seconds", "E4", "Reboot"): "1900 1900",
      event("azure_scheduled_event_first_seen_timestamp_seconds", "E4", "Reboot"): "1000 1000",
      info("E4", "Reboot", "Started"): "1 1"}, "1m", []),
    # AKS's node-problem-detector condition only pages where se-exporter does not list the event on that node.
    ("AksScheduledEventNotSeenBySeExporter",  # an exporter elsewhere does not cover this node; two KSM replicas
     {**condition(NODE, "VMEventScheduled", ["true"] * 6), **condition(NODE, "VMEventScheduled", ["true"] * 6,
                                                                       ksm="10.244.1.9:8080"),
      on_node(info("E1", "Reboot", "Scheduled"), OTHER_NODE): "1x5"}, "4m",
     [({"node": NODE, "condition": "VMEventScheduled"}, 1)]),
    ("AksScheduledEventNotSeenBySeExporter",  # se-exporter on the node lists it (even a neighbour's): its alerts speak
     {**condition(NODE, "VMEventScheduled", ["true"] * 6),
      on_node(info("E1", "Freeze", "Scheduled", "false")): "1x5"}, "4m", []),
    ("AksScheduledEventNotSeenBySeExporter",  # not for 3 minutes yet
     {**condition(NODE, "VMEventScheduled", ["true"] * 6)}, "2m", []),
    ("AksScheduledEventNotSeenBySeExporter",  # the condition is False (and Unknown is not True either)
     {**condition(NODE, "VMEventScheduled", ["false"] * 3 + ["unknown"] * 3)}, "5m", []),
    ("AksScheduledEventNotSeenBySeExporter",  # 2 minutes of NPD's tail after the event left IMDS: no page
     {**condition(NODE, "VMEventScheduled", ["true"] * 9 + ["false"] * 3),
      on_node(info("E1", "Reboot", "Scheduled")): "1 1 1 1 1 1 stale"}, "8m", []),
    ("AksScheduledEventNotSeenBySeExporter",  # a typed condition matches the event type too: a Freeze is no Preempt
     {**condition(NODE, "PreemptScheduled", ["true"] * 6),
      on_node(info("E2", "Freeze", "Scheduled")): "1x5"}, "4m",
     [({"node": NODE, "condition": "PreemptScheduled", "event_type": "Preempt"}, 1)]),
    ("AksScheduledEventNotSeenBySeExporter",
     {**condition(NODE, "PreemptScheduled", ["true"] * 6),
      on_node(info("E2", "Preempt", "Scheduled")): "1x5"}, "4m", []),
    ("SeExporterDown", {f"up{{{BASE}}}": "0 0 0 0"}, "3m", [(LABELS, 0)]),
    ("SeExporterDown", {f"up{{{BASE}}}": "0 0 0 0"}, "1m", []),  # not for 2 minutes yet
    ("SeExporterDown", {f"up{{{BASE}}}": "1 1 1 1"}, "3m", []),
    ("SeExporterImdsFailing", {f"azure_scheduled_events_up{{{BASE}}}": "0 0 0 0"}, "3m", [(LABELS, 0)]),
    ("SeExporterImdsFailing", {f"azure_scheduled_events_up{{{BASE}}}": "0 0 1 1"}, "3m", []),
    ("SeExporterStale", {f"azure_scheduled_events_last_success_timestamp_seconds{{{BASE}}}": "0 0 0 0 0 0 0 0"},
     "7m", [(LABELS, 420)]),
    ("SeExporterStale", {f"azure_scheduled_events_last_success_timestamp_seconds{{{BASE}}}": "0+60x10"}, "7m", []),
    ("SeExporterForwardingBacklog",
     {f"azure_scheduled_events_spool_documents{{{BASE}}}": "7x30",
      f'azure_scheduled_events_forwarded_documents_total{{{BASE}, sink="eventhubs"}}': "3x30"}, "25m",
     [(LABELS, 7)]),
    ("SeExporterForwardingBacklog",  # a backlog that drains is an outage being recovered from, not stuck
     {f"azure_scheduled_events_spool_documents{{{BASE}}}": "7x30",
      f'azure_scheduled_events_forwarded_documents_total{{{BASE}, sink="eventhubs"}}': "0+1x30"}, "25m", []),
    ("SeExporterDocumentsDropped",
     {f"azure_scheduled_events_spool_dropped_documents_total{{{BASE}}}": "0 0 3 3 3"}, "3m", [(LABELS, 0)]),
    ("SeExporterDocumentsDropped",
     {f"azure_scheduled_events_spool_dropped_documents_total{{{BASE}}}": "0x20"}, "10m", []),
    ("SeExporterDocumentsDropped",  # a refused document given up (full disk), per sink: one alert per instance
     {f"azure_scheduled_events_spool_dropped_documents_total{{{BASE}}}": "0x20",
      f'azure_scheduled_events_forward_dropped_documents_total{{{BASE}, sink="file"}}': "0 0 2 2 2",
      f'azure_scheduled_events_forward_dropped_documents_total{{{BASE}, sink="eventhubs"}}': "0 0 1 1 1"}, "3m",
     [(LABELS, 0)]),
    ("SeExporterDocumentsDropped",
     {f'azure_scheduled_events_forward_dropped_documents_total{{{BASE}, sink="file"}}': "4x20"}, "10m", []),
]


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


def test_the_npd_rule_and_the_vm_panel_select_the_same_node_conditions() -> None:
    """The rule and the dashboard panel agree on which node conditions are Scheduled-Events ones (AKS documents
    VMEventScheduled; the per-type names are its Event reasons), and neither takes any other condition."""
    vm = json.loads((RULES.parent / "se-exporter-vm.json").read_text())
    (panel_expr,) = [p["targets"][0]["expr"] for p in vm["panels"] if p["title"].startswith("AKS node conditions")]
    rule_expr = promtool.rules(RULES)["AksScheduledEventNotSeenBySeExporter"]["expr"]

    def selected(expr: str) -> set[str]:
        patterns = re.findall(r'condition=~?"([^"]+)"', expr)
        return {name for name in candidates if any(re.fullmatch(p, name) for p in patterns)}

    documented = {"VMEventScheduled", "FreezeScheduled", "RebootScheduled", "RedeployScheduled", "PreemptScheduled",
                  "TerminateScheduled"}
    candidates = documented | {"Ready", "MemoryPressure", "KernelDeadlock", "FrequentKubeletRestart",
                               "PreemptionScheduled"}
    assert selected(panel_expr) == selected(rule_expr) == documented
