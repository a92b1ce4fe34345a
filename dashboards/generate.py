"""Generate the Grafana dashboards as code (grafana-foundation-sdk), and render the monitoring mixin's rules.

    python dashboards/generate.py            # rewrite the generated files
    python dashboards/generate.py --check    # exit 1 if the committed files differ from what this generates

One source of truth: the dashboards are built here (dashboards/*.json, which mixin/dashboards.libsonnet ships as
they are); the alert and recording rules are written in the mixin (mixin/, with its _config), and rendered here by
the real jsonnet into dashboards/alerts.yaml, fleet-alerts.yaml, rules.yaml, Azure Monitor's prometheusRuleGroups
template and the Helm chart's PrometheusRule data, values block, schema and docs/alerting.md's table of its values
(chart_rules.py, chart_values.py). Edit the mixin, then run this.

The SDK leaves panel ids and query refIds empty; Grafana then invents them on import, which breaks
links and diffs, so every panel gets an explicit id and every query an explicit refId here. The
data source is a dashboard variable (``$datasource``), so the files import anywhere without UIDs.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _jsonnet
import chart_rules
import chart_values
import yaml
from grafana_foundation_sdk.builders import bargauge, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

HERE = Path(__file__).parent
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
VM = 'job=~"$job", instance=~"$instance"'
FLEET = 'job=~"$job"'
# The sidecars' own target labels (cluster and, on AKS, node are added at scrape time, so `up` has them too).
TARGET = 'job=~"$job", cluster=~"$cluster", node=~"$node"'
# The VMs the fleet dashboard's variables select, by name, scale set and location (from vm_info): fleet queries keep
# only their series (``and on(job, instance)``), and tables join the names from it.
VMS = (f'azure_scheduled_events_vm_info{{{TARGET}, location=~"$location", vmss_name=~"$vmss_name", '
       'vm_name=~"$vm_name"}')
# The fleet consumer's per-VM series carry the VM's name, scale set and location themselves.
FLEET_VMS = 'job=~"$job", location=~"$location", vmss_name=~"$vmss_name", vm_name=~"$vm_name"'
SPOT = "SpotRebalanceRecommendation"
VM_UID = "se-exporter-vm"


def scoped(selector: str) -> str:
    """An instant vector of the sidecars' series, kept to the VMs the fleet dashboard's variables select."""
    return f"({selector} and on(job, instance) {VMS})"


def vm_link(field: str = "vm_name") -> Any:
    """A table column of VM names that opens that VM's dashboard (by name), keeping the time range."""
    return dm.DynamicConfigValue(id_val="links", value=[{
        "title": "VM dashboard for ${__value.text}", "targetBlank": False,
        "url": f"/d/{VM_UID}?var-vm_name=${{__value.raw}}&${{__url_time_range}}"}])
IMPACTFUL = "Reboot|Redeploy|Preempt|Terminate"
# AKS's node-problem-detector: the documented VMEventScheduled condition, and the per-type names (its Event
# reasons, which some node images also set as condition types). dashboards/alerts.yaml selects the same ones.
NPD_CONDITIONS = "VMEventScheduled|(Freeze|Reboot|Redeploy|Preempt|Terminate)Scheduled"


@dataclass(frozen=True)
class Q:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


class Ids:
    """Hands out panel ids in order, so regenerating gives the same file."""

    def __init__(self) -> None:
        self.next = 1

    def take(self) -> int:
        value, self.next = self.next, self.next + 1
        return value


def targets(panel: Any, queries: Sequence[Q]) -> Any:
    for index, query in enumerate(queries):
        target = prom.Dataquery().expr(query.expr).ref_id(chr(ord("A") + index)).datasource(DS)
        if query.legend:
            target = target.legend_format(query.legend)
        target = target.instant() if query.instant else target.range()
        if query.table:
            target = target.format(PromQueryFormat.TABLE)
        panel = panel.with_target(target)
    return panel


def panel(kind: Any, ids: Ids, title: str, description: str, queries: Sequence[Q], width: int = 12,
          height: int = 8, unit: str = "") -> Any:
    built = kind.Panel().id(ids.take()).title(title).description(description).datasource(DS).span(width)
    built = built.height(height)
    if unit:
        built = built.unit(unit)
    return targets(built, queries)


def query_variable(name: str, label: str, query: str, all_: bool = True) -> Any:
    variable = (db.QueryVariable(name).label(label).datasource(DS).query(query)
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC))
    return variable.include_all(True).all_value(".*").multi(True) if all_ else variable.include_all(False).multi(False)


def variables(dashboard: Any, per_vm: bool) -> Any:
    """Find a VM by where it runs and its name, not its address: cluster and node (target labels), location and
    scale set (vm_info) narrow the VM names; the VM dashboard turns the chosen name into its hidden instance."""
    dashboard = dashboard.with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    info = "azure_scheduled_events_vm_info"
    for variable in (
            query_variable("job", "Job", "label_values(azure_scheduled_events_up, job)"),
            query_variable("cluster", "Cluster", 'label_values(azure_scheduled_events_up{job=~"$job"}, cluster)'),
            query_variable("location", "Location", f'label_values({info}{{{TARGET}}}, location)'),
            query_variable("vmss_name", "Scale set",
                           f'label_values({info}{{{TARGET}, location=~"$location"}}, vmss_name)'),
            query_variable("node", "Node (AKS)",
                           f'label_values({info}{{job=~"$job", cluster=~"$cluster"}}, node)'),
            query_variable("vm_name", "VM", f'label_values({info}{{{TARGET}, location=~"$location", '
                           'vmss_name=~"$vmss_name"}, vm_name)', all_=not per_vm)):
        dashboard = dashboard.with_variable(variable)
    if per_vm:
        dashboard = dashboard.with_variable(
            query_variable("instance", "Instance", f'label_values({info}{{job=~"$job", vm_name=~"$vm_name"}}, '
                           'instance)', all_=False).hide(dm.VariableHide.HIDE_VARIABLE))
    return dashboard


def node_conditions_panel(ids: Ids) -> Any:
    """AKS's own view of the same maintenance, under our events timeline: kube-state-metrics' node conditions
    for the node this exporter runs on. Their series carry the Kubernetes node name in `node`; ours carry it
    only through the scrape-time relabelling of the Helm chart's monitors (IMDS names the VM
    differently), so that label is the join. Without kube-state-metrics or that label the query is empty
    and the panel says why, rather than failing."""
    conditions = f'kube_node_status_condition{{condition=~"{NPD_CONDITIONS}", status="true"}}'
    return (panel(statetimeline, ids, "AKS node conditions (kube-state-metrics)",
                  "The node-problem-detector conditions of this VM's AKS node, as kube-state-metrics reports them "
                  "(1 = True while NPD sees a scheduled event; it checks every minute, Preempt every 2 s). Joined "
                  "on the `node` label that the ServiceMonitor/PodMonitor relabelling adds to se-exporter.",
                  [Q(f"max by (node, condition) ({conditions}) and on(node) azure_scheduled_events_up{{{VM}}}",
                     legend="{{condition}} on {{node}}")], width=24, height=5)
            .no_value("No AKS node conditions for this VM: not an AKS node, no kube-state-metrics, or the "
                      "se-exporter target has no `node` label (see the README, Run on AKS)"))


def vm_dashboard() -> Any:
    ids = Ids()
    d = (db.Dashboard("Azure Scheduled Events: VM").uid("se-exporter-vm").tags(["azure", "scheduled-events"])
         .description("What maintenance one VM faces, how much notice it got, and whether se-exporter sees IMDS.")
         .refresh("30s").time("now-6h", "now").editable())
    d = variables(d, per_vm=True)
    d = d.with_row(db.Row("Now").id(ids.take()))
    d = d.with_panel(panel(stat, ids, "IMDS readable", "1 when the last poll returned a valid document.",
                           [Q(f"azure_scheduled_events_up{{{VM}}}")], width=4, height=4))
    d = d.with_panel(panel(stat, ids, "Events listed", "Events in the current document, for any VM of the set.",
                           [Q(f"sum(azure_scheduled_events_pending{{{VM}}}) or vector(0)")], width=4, height=4))
    d = d.with_panel(panel(
        stat, ids, "Next impact on this VM in", "Time until the earliest NotBefore of an event that lists this VM.",
        [Q(f"min(azure_scheduled_event_seconds_until_not_before{{{VM}}} and on(instance, event_id) "
           f"azure_scheduled_event_info{{{VM}, affects_this_vm!=\"false\"}})")], width=4, height=4, unit="s"))
    d = d.with_panel(panel(stat, ids, "Last valid document", "Age of the last valid document read from IMDS.",
                           [Q(f"time() - azure_scheduled_events_last_success_timestamp_seconds{{{VM}}}")],
                           width=4, height=4, unit="s"))
    d = d.with_panel(panel(stat, ids, "Document incarnation", "DocumentIncarnation of the last valid document.",
                           [Q(f"azure_scheduled_events_document_incarnation{{{VM}}}")], width=4, height=4))
    d = d.with_panel(panel(stat, ids, "Spot rebalance recommended", "1 while Azure advises rebalancing this Spot VM "
                           "(its eviction risk is raised): prepare a replacement; nothing to approve.",
                           [Q(f"count(azure_scheduled_event_info{{{VM}, event_type=\"{SPOT}\", "
                              "affects_this_vm!=\"false\"}) or vector(0)")], width=4, height=4))
    d = d.with_panel(panel(stat, ids, "Host failures (range)", "This VM's events that were Started at first sight.",
                           [Q(f"sum(increase(azure_scheduled_events_notice_seconds_bucket{{{VM}, le=\"0.0\", "
                              "affects_this_vm!=\"false\"}[$__range]))")], width=4, height=4))
    d = d.with_panel(
        panel(table, ids, "Events now",
              "Every listed event: type, status, source, whether it lists this VM, countdown to NotBefore and "
              "the expected duration (-1 = unknown).",
              [Q(f"azure_scheduled_event_info{{{VM}}}", instant=True, table=True),
               Q(f"azure_scheduled_event_seconds_until_not_before{{{VM}}}", instant=True, table=True),
               Q(f"azure_scheduled_event_duration_seconds{{{VM}}}", instant=True, table=True)], width=24)
        .with_transformation(dm.DataTransformerConfig(id_val="joinByField", options={"byField": "event_id",
                                                                                      "mode": "outer"}))
        .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "Time 1": True, "Time 2": True, "Time 3": True, "Value #A": True,
                              "__name__": True, "job": True, "instance": True},
            "renameByName": {"Value #B": "seconds until NotBefore", "Value #C": "expected duration (s)"}})))
    d = d.with_row(db.Row("Timeline").id(ids.take()))
    d = d.with_panel(panel(statetimeline, ids, "Events over time", "Each event's status while it was listed.",
                           [Q(f"max by (event_id, event_type, event_status) (azure_scheduled_event_info{{{VM}}})",
                              legend="{{event_type}} {{event_status}} {{event_id}}")], width=24))
    d = d.with_panel(node_conditions_panel(ids))
    d = d.with_panel(panel(timeseries, ids, "Listed events by type and status",
                           "This VM's events (affects_this_vm true, or unknown without a VM name) apart from its "
                           "neighbours' (false).",
                           [Q(f"sum by (event_type, event_status, affects_this_vm) (azure_scheduled_events_pending"
                              f"{{{VM}}}) > 0",
                              legend="{{event_type}} {{event_status}} (this VM: {{affects_this_vm}})")]))
    d = d.with_panel(panel(timeseries, ids, "Transitions", "Lifecycle transitions seen, per interval.",
                           [Q(f"sum by (event_type, transition, affects_this_vm) (increase("
                              f"azure_scheduled_events_transitions_total{{{VM}}}[$__rate_interval])) > 0",
                              legend="{{event_type}} {{transition}} (this VM: {{affects_this_vm}})")]))
    d = d.with_row(db.Row("Notice and impact").id(ids.take()))
    for name, what in (("notice", "First seen -> Started: the warning really given."),
                       ("impact", "Started -> gone from the document.")):
        d = d.with_panel(panel(
            bargauge, ids, f"{name.capitalize()} distribution (range)", what,
            [Q(f"sum by (le) (increase(azure_scheduled_events_{name}_seconds_bucket{{{VM}}}[$__range]))",
               legend="{{le}}", instant=True)], width=8))
        d = d.with_panel(panel(
            timeseries, ids, f"Average {name} by type", what,
            [Q(f"sum by (event_type) (increase(azure_scheduled_events_{name}_seconds_sum{{{VM}}}[$__range])) / "
               f"sum by (event_type) (increase(azure_scheduled_events_{name}_seconds_count{{{VM}}}[$__range]))",
               legend="{{event_type}}")], width=4, unit="s"))
    d = d.with_row(db.Row("What the VM felt").id(ids.take()))
    pauses = "azure_scheduled_events_pause_seconds"
    d = d.with_panel(panel(
        timeseries, ids, "Pauses felt, by the event listed",
        "Pauses the VM (or the sidecar) lived through, per interval, by the type of this VM's event listed when each "
        "began (none: unannounced). From 0.25 s while an event is listed, from 1 s otherwise (docs/events.md).",
        [Q(f"sum by (event_type) (increase({pauses}_count{{{VM}}}[$__rate_interval])) > 0",
           legend="{{event_type}}")], width=10))
    d = d.with_panel(panel(
        timeseries, ids, "Longest pause per event", "The longest pause felt while each event was listed: what it "
        "really cost, beside what it announced (expected duration in Events now).",
        [Q(f"max by (event_id, event_type) (azure_scheduled_event_longest_pause_seconds{{{VM}}}) > 0",
           legend="{{event_type}} {{event_id}}")], width=10, unit="s"))
    d = d.with_panel(panel(stat, ids, "Unannounced pauses (range)", "Pauses with no event of this VM's listed; "
                           "longer than the rules' unannouncedPauseSeconds they warn (SeExporterUnannouncedPause).",
                           [Q(f"sum(increase({pauses}_count{{{VM}, event_type=\"none\"}}[$__range])) or vector(0)")],
                           width=4))
    d = d.with_row(db.Row("IMDS health").id(ids.take()))
    d = d.with_panel(panel(timeseries, ids, "Poll outcomes", "Polls per second by outcome; anything but ok is a "
                           "fault the exporter survived.",
                           [Q(f"sum by (outcome) (rate(azure_scheduled_events_polls_total{{{VM}}}"
                              "[$__rate_interval]))", legend="{{outcome}}")], width=8, unit="reqps"))
    d = d.with_panel(panel(timeseries, ids, "Poll latency", "",
                           [Q("histogram_quantile(0.5, sum by (le) (rate(azure_scheduled_events_poll_duration_"
                              f"seconds_bucket{{{VM}}}[$__rate_interval])))", legend="p50"),
                            Q("histogram_quantile(0.99, sum by (le) (rate(azure_scheduled_events_poll_duration_"
                              f"seconds_bucket{{{VM}}}[$__rate_interval])))", legend="p99")], width=8, unit="s"))
    d = d.with_panel(panel(timeseries, ids, "IMDS readable over time", "",
                           [Q(f"azure_scheduled_events_up{{{VM}}}", legend="up")], width=8))
    d = d.with_row(db.Row("Forwarding").id(ids.take()))
    d = d.with_panel(panel(timeseries, ids, "Spool backlog", "Documents waiting for Event Hubs.",
                           [Q(f"azure_scheduled_events_spool_documents{{{VM}}}", legend="documents")], width=6))
    d = d.with_panel(panel(timeseries, ids, "Forwarding errors", "",
                           [Q(f"sum by (sink, reason) (rate(azure_scheduled_events_forward_errors_total{{{VM}}}"
                              "[$__rate_interval]))", legend="{{sink}} {{reason}}")], width=6, unit="reqps"))
    d = d.with_panel(panel(stat, ids, "Dropped documents (range)", "Oldest documents dropped from a full spool.",
                           [Q(f"sum(increase(azure_scheduled_events_spool_dropped_documents_total{{{VM}}}"
                              "[$__range]))")], width=6))
    d = d.with_panel(panel(timeseries, ids, "Forwarded documents", "",
                           [Q(f"sum by (sink) (increase(azure_scheduled_events_forwarded_documents_total{{{VM}}}"
                              "[$__rate_interval]))", legend="{{sink}}")], width=6))
    return d.build()


def what_is_about_to_happen(ids: Ids) -> Any:
    """The on-call's first question, first: every event that lists a VM as its own, with the VM's name, scale set,
    zone and location, soonest first; Started ones (no NotBefore left) at 0. A VM's name opens its dashboard."""
    info = f"azure_scheduled_event_info{{{FLEET}, affects_this_vm!=\"false\""
    events = (f"(azure_scheduled_event_seconds_until_not_before{{{FLEET}}} * on(job, instance, event_id) "
              f"group_left(event_status, event_source) {info}}}) or on(job, instance, event_id) "
              f"max without (resource_type, affects_this_vm) (0 * {info}, event_status=\"Started\"}})")
    return (panel(table, ids, "What is about to happen where, and how long you have",
                  "Each VM's own events, soonest first: seconds until NotBefore (0: started), the VM's name, scale "
                  "set, zone and location. Click a VM's name for its dashboard.",
                  [Q("sort(max by (vm_name, vmss_name, zone, location, event_id, event_type, event_status) ("
                     f"({events}) * on(job, instance) group_left(vm_name, vmss_name, zone, location) {VMS}))",
                     instant=True, table=True)], width=24, height=10)
            .override_by_name("vm_name", [vm_link()])
            .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                "excludeByName": {"Time": True}, "renameByName": {"Value": "seconds until NotBefore"}})))


def fleet_dashboard() -> Any:
    ids = Ids()
    d = (db.Dashboard("Azure Scheduled Events: fleet").uid("se-exporter-fleet")
         .tags(["azure", "scheduled-events"]).refresh("30s").time("now-24h", "now").editable()
         .description("Which VMs face which maintenance, and when, across every exporter."))
    d = variables(d, per_vm=False)
    d = d.with_panel(what_is_about_to_happen(ids))
    d = d.with_panel(panel(stat, ids, "Exporters down", "Scrape targets that do not answer (by cluster and node).",
                           [Q(f"count(up{{{TARGET}}} == 0) or vector(0)")], width=4, height=4))
    d = d.with_panel(panel(stat, ids, "Exporters not reading IMDS", "",
                           [Q(f"count({scoped(f'azure_scheduled_events_up{{{FLEET}}} == 0')}) or vector(0)")],
                           width=4, height=4))
    d = d.with_panel(panel(stat, ids, "VMs with impactful events",
                           "VMs listed in a Reboot, Redeploy, Preempt or Terminate event as theirs.",
                           [Q("count(count by (instance) (" + scoped(
                               f"azure_scheduled_event_info{{{FLEET}, event_type=~\"{IMPACTFUL}\", "
                               "affects_this_vm!=\"false\"}") + ")) or vector(0)")], width=4, height=4))
    d = d.with_panel(panel(stat, ids, "Impactful events", "Distinct Reboot, Redeploy, Preempt or Terminate EventIds "
                           "(an availability set's event counts once, however many VMs list it).",
                           [Q("count(count by (event_id) (" + scoped(
                               f"azure_scheduled_event_info{{{FLEET}, event_type=~\"{IMPACTFUL}\"}}") + ")) "
                              "or vector(0)")], width=4, height=4))
    d = d.with_panel(panel(stat, ids, "Spot VMs advised to rebalance",
                           "VMs with a SpotRebalanceRecommendation: their eviction risk is raised. Advice to prepare, "
                           "nothing to approve.",
                           [Q("count(count by (job, instance) (" + scoped(
                               f"azure_scheduled_event_info{{{FLEET}, event_type=\"{SPOT}\", "
                               "affects_this_vm!=\"false\"}") + ")) or vector(0)")], width=4, height=4))
    d = d.with_panel(panel(stat, ids, "Documents waiting to be forwarded", "",
                           [Q(f"sum({scoped(f'azure_scheduled_events_spool_documents{{{FLEET}}}')}) or vector(0)")],
                           width=4, height=4))
    d = d.with_panel(panel(bargauge, ids, "Events by type and status", "Each EventId once, however many VMs list it.",
                           [Q("count by (event_type, event_status) (count by (event_id, event_type, event_status) ("
                              + scoped(f"azure_scheduled_event_info{{{FLEET}}}") + "))",
                              legend="{{event_type}} {{event_status}}", instant=True)], width=8))
    d = d.with_panel(panel(bargauge, ids, "VMs affected per event", "How many VMs list each event as theirs.",
                           [Q("count by (event_id, event_type) (" + scoped(
                               f"azure_scheduled_event_info{{{FLEET}, affects_this_vm=\"true\"}}") + ")",
                              legend="{{event_type}} {{event_id}}", instant=True)], width=8))
    d = d.with_panel(panel(bargauge, ids, "Events by scale set and zone",
                           "Distinct EventIds that list a VM of the scale set and zone as theirs.",
                           [Q(f"count by (vmss_name, zone) (count by (vmss_name, zone, event_id) ("
                              f"azure_scheduled_event_info{{{FLEET}, affects_this_vm!=\"false\"}} * on(job, instance) "
                              f"group_left(vmss_name, zone) {VMS}))",
                              legend="{{vmss_name}} zone {{zone}}", instant=True)], width=8))
    d = d.with_panel(panel(timeseries, ids, "Transitions across the fleet",
                           "Each VM's transitions of its own events (a neighbour's listing is not counted).",
                           [Q(f"sum by (event_type, transition) (increase(azure_scheduled_events_transitions_total"
                              f"{{{FLEET}, affects_this_vm!=\"false\"}}[$__rate_interval]) and on(job, instance) "
                              f"{VMS}) > 0", legend="{{event_type}} {{transition}}")]))
    d = d.with_panel(panel(timeseries, ids, "Poll failures across the fleet", "",
                           [Q(f"sum by (outcome) (rate(azure_scheduled_events_polls_total{{{FLEET}, outcome!=\"ok\"}}"
                              f"[$__rate_interval]) and on(job, instance) {VMS})", legend="{{outcome}}")],
                           unit="reqps"))
    return d.build()


def fleet_events_dashboard() -> Any:
    """`se-exporter fleet`: the whole fleet from Event Hubs. Around a partition hand-over two replicas may show the
    same VMs for a moment, so every fleet figure counts distinct VMs over the per-VM series (``count by (...)
    (count by (..., vm_id) (...))``) and every per-VM list keeps one row per VM (``max by (vm_id, ...)``), never a
    sum of the replicas' own totals; those stay for the per-replica panels (partitions, throughput, errors)."""
    ids = Ids()
    d = (db.Dashboard("Azure Scheduled Events: fleet from Event Hubs").uid("se-exporter-fleet-events")
         .tags(["azure", "scheduled-events"]).refresh("30s").time("now-24h", "now").editable()
         .description("Which VMs face which maintenance right now, how many VMs one event hits, which VMs went "
                      "silent: the fleet consumer's view of every forwarded document."))
    d = d.with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    d = d.with_variable(
        db.QueryVariable("job").label("Job").datasource(DS).query("label_values(azure_scheduled_fleet_vms, job)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(True).all_value(".*").multi(True))
    seen = "azure_scheduled_fleet_vm_last_seen_timestamp_seconds"
    for variable in (  # by the VMs' names and places, from the documents they sent (no cluster or node there)
            query_variable("location", "Location", f'label_values({seen}{{job=~"$job"}}, location)'),
            query_variable("vmss_name", "Scale set",
                           f'label_values({seen}{{job=~"$job", location=~"$location"}}, vmss_name)'),
            query_variable("vm_name", "VM", f'label_values({seen}{{job=~"$job", location=~"$location", '
                           'vmss_name=~"$vmss_name"}, vm_name)')):
        d = d.with_variable(variable)
    info = f"azure_scheduled_fleet_event_info{{{FLEET_VMS}, affects_this_vm!=\"false\""
    vm = "vm_id, vm_name, vmss_name, location"  # a VM's identity, the same on every replica that shows it
    d = d.with_row(db.Row("Fleet now").id(ids.take()))
    d = d.with_panel(panel(stat, ids, "VMs known", "VMs whose documents the fleet consumer holds.",
                           [Q("count(count by (vm_id) (azure_scheduled_fleet_vm_last_seen_timestamp_seconds"
                              f"{{{FLEET}}})) or vector(0)")], width=6, height=4))
    d = d.with_panel(panel(stat, ids, "VMs facing impactful maintenance",
                           "VMs with a Reboot, Redeploy, Preempt or Terminate listed for them.",
                           [Q(f"count(count by (vm_id) ({info}, event_type=~\"{IMPACTFUL}\"}})) or vector(0)")],
                           width=6, height=4))
    d = d.with_panel(panel(stat, ids, "VMs in maintenance now", "VMs with a Started event listed for them.",
                           [Q(f"count(count by (vm_id) ({info}, event_status=\"Started\"}})) or vector(0)")],
                           width=6, height=4))
    d = d.with_panel(panel(stat, ids, "VMs gone silent (range)", "VMs forgotten after --vm-expiry without a "
                           "document or heartbeat.",
                           [Q(f"sum(increase(azure_scheduled_fleet_vm_expirations_total{{{FLEET}}}[$__range])) "
                              "or vector(0)")], width=6, height=4))
    d = d.with_panel(
        panel(table, ids, "Upcoming maintenance by VM", "Scheduled events, per VM they concern, soonest first.",
              [Q(f"sort(max by ({vm}, event_id, event_type, event_status, event_source) ("
                 f"azure_scheduled_fleet_event_seconds_until_not_before{{{FLEET}}} * on(job, instance, vm_id, "
                 "event_id) group_left(vm_name, vmss_name, location, event_type, event_status, event_source) "
                 f"{info}}}))", instant=True, table=True)], width=24, height=10)
        .override_by_name("vm_name", [vm_link()])
        .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True},
            "renameByName": {"Value": "seconds until NotBefore"}})))
    d = d.with_panel(panel(bargauge, ids, "Blast radius: VMs per event", "How many VMs each EventId concerns.",
                           [Q(f"count by (event_id, event_type) (count by (event_id, event_type, vm_id) ({info}}}))",
                              legend="{{event_type}} {{event_id}}", instant=True)], width=8))
    d = d.with_panel(panel(bargauge, ids, "What each event cost: the longest pause a VM felt",
                           "Per event, the longest pause any VM felt while it was listed (their sidecars' pauses "
                           "property; docs/fleet.md): what the maintenance did, beside what it announced.",
                           [Q(f"max by (event_id, event_type) (azure_scheduled_fleet_event_longest_pause_seconds"
                              f"{{{FLEET}}})", legend="{{event_type}} {{event_id}}", instant=True)], width=8, unit="s"))
    d = d.with_panel(panel(bargauge, ids, "VMs that paused, per event", "VMs that felt a pause during each event.",
                           [Q(f"sum by (event_id, event_type) (azure_scheduled_fleet_event_paused_vms{{{FLEET}}})",
                              legend="{{event_type}} {{event_id}}", instant=True)], width=8))
    d = d.with_panel(panel(timeseries, ids, "The pause nine VMs in ten stayed under, by type",
                           "Over each VM's longest pause per event it last reported (a picture of now, not a rate).",
                           [Q("histogram_quantile(0.9, sum by (event_type, le) (azure_scheduled_fleet_pause_seconds_"
                              f"bucket{{{FLEET}}}))", legend="{{event_type}}")], width=8, unit="s"))
    d = d.with_panel(panel(bargauge, ids, "VMs with events by scale set", "",
                           [Q(f"count by (vmss_name, event_type) (count by (vmss_name, event_type, vm_id) ("
                              f"{info}, vmss_name!=\"\"}}))",
                              legend="{{vmss_name}} {{event_type}}", instant=True)], width=8))
    d = d.with_panel(panel(table, ids, "Quietest VMs", "Seconds since each VM's last document or heartbeat.",
                           [Q(f"topk(20, time() - max by ({vm}) ("
                              f"azure_scheduled_fleet_vm_last_seen_timestamp_seconds{{{FLEET_VMS}}}))",
                              instant=True, table=True)], width=8, unit="s").override_by_name("vm_name", [vm_link()]))
    d = d.with_panel(panel(timeseries, ids, "Pending VMs by type and status", "",
                           [Q("count by (event_type, event_status) (count by (event_type, event_status, vm_id) ("
                              f"{info}}}))",
                              legend="{{event_type}} {{event_status}}")], width=24))
    d = d.with_panel(panel(stat, ids, "VMs that cannot read IMDS", "Sidecars still reporting whose latest IMDS poll "
                           "failed, or whose last successful read is over 2 minutes older than what they sent: their "
                           "maintenance goes unseen. Older sidecars do not report it.",
                           [Q("count(count by (vm_id) ("
                              f"azure_scheduled_fleet_vm_imds_unreachable_since_timestamp_seconds{{{FLEET_VMS}}})) "
                              "or vector(0)")],
                           width=6))
    d = d.with_panel(panel(table, ids, "VMs that cannot read IMDS: time since their last successful read",
                           "Per VM counted beside; a VM that never read IMDS shows the time since 1970.",
                           [Q(f"sort_desc(time() - max by ({vm}) ("
                              f"azure_scheduled_fleet_vm_imds_unreachable_since_timestamp_seconds{{{FLEET_VMS}}}))",
                              instant=True, table=True)], width=18, unit="s")
                     .override_by_name("vm_name", [vm_link()])
                     .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                         "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True},
                         "renameByName": {"Value": "seconds since the last IMDS read"}})))
    d = two_streams(d, ids)
    d = d.with_row(db.Row("Consumer").id(ids.take()))
    d = d.with_panel(panel(timeseries, ids, "Documents applied", "Per second, changes and heartbeats.",
                           [Q(f"sum by (kind) (rate(azure_scheduled_fleet_documents_applied_total{{{FLEET}}}"
                              "[$__rate_interval]))", legend="{{kind}}")], width=8, unit="reqps"))
    d = d.with_panel(panel(timeseries, ids, "Dropped messages", "Duplicates (resends, older; the platform stream's: "
                           "Event Grid's redeliveries) and invalid messages.",
                           [Q(f"sum by (reason) (rate(azure_scheduled_fleet_duplicate_documents_total{{{FLEET}}}"
                              "[$__rate_interval]))", legend="duplicate {{reason}}"),
                            Q(f"sum by (reason) (rate(azure_scheduled_fleet_invalid_messages_total{{{FLEET}}}"
                              "[$__rate_interval]))", legend="invalid {{reason}}"),
                            Q(f"sum(rate(azure_scheduled_fleet_platform_duplicates_total{{{FLEET}}}"
                              "[$__rate_interval]))", legend="platform duplicate (same Event Grid id)")],
                           width=8, unit="reqps"))
    d = d.with_panel(panel(timeseries, ids, "Partitions per replica", "Owned partitions; the line is the hub's.",
                           [Q(f"sum by (instance) (azure_scheduled_fleet_owned_partitions{{{FLEET}}})",
                              legend="{{instance}}"),
                            Q(f"max(azure_scheduled_fleet_hub_partitions{{{FLEET}}})", legend="partitions")],
                           width=8))
    d = d.with_panel(panel(timeseries, ids, "Lag per partition", "Enqueue time of the newest event minus that of "
                           "the last one handled.",
                           [Q(f"max by (partition_id) (azure_scheduled_fleet_partition_lag_seconds{{{FLEET}}})",
                              legend="partition {{partition_id}}")], width=8, unit="s"))
    d = d.with_panel(panel(timeseries, ids, "Checkpoint age per partition", "How long handled events have waited "
                           "for their checkpoint.",
                           [Q(f"max by (partition_id) (azure_scheduled_fleet_partition_checkpoint_age_seconds"
                              f"{{{FLEET}}})", legend="partition {{partition_id}}")], width=8, unit="s"))
    d = d.with_panel(panel(timeseries, ids, "Client errors", "Errors the Event Hubs client reported, by reason.",
                           [Q(f"sum by (reason) (rate(azure_scheduled_fleet_consumer_errors_total{{{FLEET}}}"
                              "[$__rate_interval]))", legend="{{reason}}")], width=8, unit="reqps"))
    d = d.with_panel(panel(timeseries, ids, "Damaged state and bounds reached", "State blobs (or rows) not used, "
                           "by reason, and bounds on what the consumer keeps reached, by bound.",
                           [Q(f"sum by (reason) (increase(azure_scheduled_fleet_state_damaged_total{{{FLEET}}}"
                              "[$__rate_interval]))", legend="damaged {{reason}}"),
                            Q(f"sum by (bound) (increase(azure_scheduled_fleet_bound_hits_total{{{FLEET}}}"
                              "[$__rate_interval]))", legend="bound {{bound}}"),
                            Q(f"sum by (instance) (azure_scheduled_fleet_state_newer_format_partitions{{{FLEET}}})",
                              legend="partitions with a newer release's state on {{instance}}")], width=24))
    return d.build()


def two_streams(d: Any, ids: Ids) -> Any:
    """The platform stream (Azure's own copy of every scheduled event) beside the sidecars'. An EventId's
    info series comes from the replica that shows its home platform partition (from two around a hand-over: EventIds
    are counted distinct, ``count by (event_id)``, and joined through ``max by (event_id, ...)``); its VMs by
    coverage from every replica, each counting the VMs it judged, so they are summed over the replicas. Counters
    count each EventId and VM on one replica, so they are summed too."""
    info = f"azure_scheduled_fleet_platform_event_info{{{FLEET}"
    vms = f"azure_scheduled_fleet_platform_event_vms{{{FLEET}"
    event = "event_id, event_type, event_status, event_source, scope_type, scope_name, resource_group, location"
    d = d.with_row(db.Row("Two streams: what Azure announced, what the sidecars saw").id(ids.take()))
    d = d.with_panel(panel(stat, ids, "Events announced by Azure, open",
                           "Scheduled or Started events on the platform stream (Event Grid), whether or not a "
                           "sidecar runs on their VMs.",
                           [Q(f"count(count by (event_id) ({info}, event_status=~\"Scheduled|Started\"}})) "
                              "or vector(0)")], width=6, height=4))
    d = d.with_panel(panel(stat, ids, "VMs a live sidecar missed",
                           "(EventId, VM) pairs whose sidecar is alive but did not list the event in time (missed) or "
                           "had not read IMDS since before it (imds_unreachable); ended events for "
                           "--platform-retention.",
                           [Q(f"sum({vms}, coverage=~\"missed|imds_unreachable\"}}) or vector(0)")], width=6, height=4))
    d = d.with_panel(panel(stat, ids, "VMs without a sidecar",
                           "(EventId, VM) pairs no sidecar has been heard from for within --vm-expiry.",
                           [Q(f"sum({vms}, coverage=\"no_sidecar\"}}) or vector(0)")],
                           width=6, height=4))
    d = d.with_panel(panel(stat, ids, "Impact this month",
                           "VM-seconds of maintenance in the last 30 days, Started to Completed by the platform's "
                           "times, per affected VM (a Freeze of 5 s on 300 VMs adds 1,500 s).",
                           [Q(f"sum(increase(azure_scheduled_fleet_impact_seconds_total{{{FLEET}}}[30d])) "
                              "or vector(0)")], width=6, height=4, unit="s"))
    d = d.with_panel(
        panel(table, ids, "Announced by Azure",
              "Every event on the platform stream, ended ones for --platform-retention, with its VMs by coverage: "
              "their sidecar listed it (observed), did not (missed), could not read IMDS (imds_unreachable), or "
              "none is heard from (no_sidecar).",
              [Q(f"max by ({event}) ({info}}})", instant=True, table=True),
               *(Q(f"sum by (event_id) ({vms}, coverage=\"{coverage}\"}})", instant=True, table=True)
                 for coverage in ("observed", "missed", "imds_unreachable", "no_sidecar"))], width=24, height=10)
        .with_transformation(dm.DataTransformerConfig(id_val="joinByField", options={"byField": "event_id",
                                                                                      "mode": "outer"}))
        .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "Time 1": True, "Time 2": True, "Time 3": True, "Time 4": True,
                              "Time 5": True, "Value #A": True},
            "renameByName": {"Value #B": "observed", "Value #C": "missed", "Value #D": "imds_unreachable",
                             "Value #E": "no_sidecar"}})))
    d = d.with_panel(
        panel(table, ids, "Blind spots",
              "Per event, the VMs whose maintenance no sidecar saw, by coverage: missed, imds_unreachable, "
              "no_sidecar. azure_scheduled_fleet_platform_event_missed_vm_info names them (the first 20 per "
              "event and coverage), as the missed-event alerts' `vms` annotation does.",
              [Q(f"sort_desc(sum by (event_id, event_type, coverage) ({vms}, coverage!=\"observed\"}}) "
                 f"* on(event_id) group_left(scope_name, location) max by (event_id, scope_name, location) "
                 f"({info}}}) > 0)", instant=True, table=True)], width=12)
        .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True}, "renameByName": {"Value": "VMs"}})))
    d = d.with_panel(panel(bargauge, ids, "Missed events (range)",
                           "(EventId, VM) pairs counted once when first judged missed, imds_unreachable or no_sidecar, "
                           "by reason.",
                           [Q(f"sum by (event_type, reason) (increase(azure_scheduled_fleet_missed_events_total"
                              f"{{{FLEET}}}[$__range])) > 0", legend="{{event_type}} {{reason}}", instant=True)],
                           width=6))
    d = d.with_panel(panel(bargauge, ids, "Unannounced events (range)",
                           "EventIds live sidecars listed that the platform never announced, in scopes that publish "
                           "to it.",
                           [Q(f"sum by (event_type) (increase(azure_scheduled_fleet_unannounced_events_total"
                              f"{{{FLEET}}}[$__range])) > 0", legend="{{event_type}}", instant=True)], width=6))
    d = d.with_panel(panel(bargauge, ids, "Impact this month by scale set, region and type",
                           "VM-seconds of maintenance in the last 30 days (increase over 30 d of "
                           "impact_seconds_total): the monthly maintenance-impact report.",
                           [Q(f"sort_desc(sum by (event_type, scope_name, location) (increase("
                              f"azure_scheduled_fleet_impact_seconds_total{{{FLEET}}}[30d])) > 0)",
                              legend="{{scope_name}} {{location}} {{event_type}}", instant=True)],
                           width=12, unit="s"))
    d = d.with_panel(panel(bargauge, ids, "Announcement lag (range)",
                           "When a VM first listed an event minus when the platform announced it (below 0: the VM "
                           "knew first), its median and 99th percentile over the range.",
                           [Q(f"histogram_quantile({q}, sum by (le) (increase(azure_scheduled_fleet_announcement_lag_"
                              f"seconds_bucket{{{FLEET}}}[$__range])))", legend=name, instant=True)
                            for q, name in (("0.5", "median"), ("0.99", "p99"))], width=12, unit="s"))
    return d


def render(dashboard: Any) -> str:
    return json.dumps(dashboard, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


MIXIN = HERE.parent / "mixin"
GENERATED = "# Generated from mixin/ by dashboards/generate.py: edit the mixin, then make dashboards.\n"
RULE_KEYS = ("alert", "record", "expr", "for", "labels", "annotations")
# Azure Monitor alert severities (0 Critical .. 4 Verbose) for the rules' severity label.
AZURE_SEVERITY = {"critical": 0, "warning": 2, "info": 3}


def mixin(config: str = "{}") -> dict[str, Any]:
    """The mixin evaluated by jsonnet, with ``config`` merged into its _config (a jsonnet object)."""
    snippet = (f"local m = (import 'mixin.libsonnet') + {{ _config+:: {config} }};\n"
               "{ alerts: m.prometheusAlerts, rules: m.prometheusRules, dashboards: m.grafanaDashboards,\n"
               "  config: m._config }")
    result: dict[str, Any] = json.loads(_jsonnet.evaluate_snippet("render", snippet, jpathdir=[str(MIXIN)]))
    return result


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks, as a person writes rule files."""


_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def _ordered(rule: dict[str, Any]) -> dict[str, Any]:
    return {key: rule[key] for key in RULE_KEYS if key in rule}


def _groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": group["name"], "rules": [_ordered(rule) for rule in group["rules"]]} for group in groups]


def _yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)


def rule_file(kind: str, group: str, config: str = "{}") -> str:
    """One group of the mixin's alerts or rules as a Prometheus rule file, with ``config`` merged into _config."""
    groups = [g for g in mixin(config)[kind]["groups"] if g["name"] == group]
    return GENERATED + _yaml({"groups": _groups(groups)})


def _iso_duration(duration: str) -> str:
    """Prometheus' 3m as ISO 8601's PT3M (what Azure's `for` takes)."""
    unit = {"s": "S", "m": "M", "h": "H"}[duration[-1]]
    return f"PT{int(duration[:-1])}{unit}"


# The _config settings the ARM template takes as parameters: rendered with a sentinel in their place, and each
# sentinel turned into the parameter where it lands (an ARM concat()), so a deployment sets them as the chart's
# values and the mixin's _config do. (name, ARM type, sentinel, what it is.) The rest of _config (which types and
# sources page, Spot, overrides) is rendered in: `generate.py --azure-config '{ ... }'` (docs/alerting.md).
AZURE_SETTINGS: tuple[tuple[str, str, Any, str], ...] = (
    ("impactfulPageSeconds", "int", 987650001, "An impactful event pages once its NotBefore is this close (s)."),
    ("longFreezeSeconds", "int", 987650002, "A Freeze longer than this warns, or pages on a latency-sensitive VM (s)."),
    ("hostFailureWatchedSeconds", "int", 987650003,
     "An event Started at first sight is a host failure only after this long watching IMDS (s)."),
    ("manyVms", "int", 987650004, "The fleet warns of an impactful event on more than this many VMs of a scale set."),
    ("runbookUrl", "string", "https://runbook.sentinel.invalid/ops.md", "Where the runbooks (docs/operations.md) are."),
    ("grafanaUrl", "string", "https://grafana.sentinel.invalid", "Where Grafana serves the mixin's dashboards."),
)
# An action group per severity: pages and warnings reach different people.
AZURE_ACTION_GROUPS = {"critical": "criticalActionGroupId", "warning": "warningActionGroupId",
                       "info": "infoActionGroupId"}


def _arm_string(text: str) -> str:
    """A string as the template writes it: with a setting's sentinel, an ARM concat() of its parameter."""
    parts: list[tuple[bool, str]] = [(False, text)]
    for name, _, sentinel, _ in AZURE_SETTINGS:
        split: list[tuple[bool, str]] = []
        for is_parameter, part in parts:
            if is_parameter:
                split.append((True, part))
                continue
            pieces = part.split(str(sentinel))
            for index, piece in enumerate(pieces):
                if index:
                    split.append((True, name))
                split.append((False, piece))
        parts = split
    if len(parts) == 1:
        return text if not text.startswith("[") else "[" + text  # a literal that starts with [ is written [[
    quoted = [f"string(parameters('{part}'))" if is_parameter else "'" + part.replace("'", "''") + "'"
              for is_parameter, part in parts if is_parameter or part]
    return f"[concat({', '.join(quoted)})]"


def _azure_rule(rule: dict[str, Any]) -> dict[str, Any]:
    if "record" in rule:
        return {"record": rule["record"], "expression": _arm_string(rule["expr"]), "enabled": True}
    severity = rule["labels"]["severity"]
    others = {key: value for key, value in rule["labels"].items() if key != "severity"}
    own = json.dumps(others).replace("'", "''")
    labels = (f"[union(parameters('additionalRuleLabels'), json('{own}'), "
              f"createObject('severity', '{severity}'))]")
    converted: dict[str, Any] = {
        "alert": rule["alert"], "expression": _arm_string(rule["expr"]),
        "enabled": f"[not(contains(parameters('disabledAlerts'), '{rule['alert']}'))]",
        "severity": AZURE_SEVERITY[severity], "labels": labels,
        "annotations": {key: _arm_string(value) for key, value in rule["annotations"].items()},
        "resolveConfiguration": {"autoResolved": True, "timeToResolve": "PT10M"},
        "actions": [{"actionGroupId": f"[parameters('{AZURE_ACTION_GROUPS[severity]}')]"}]}
    if "for" in rule:
        converted["for"] = _iso_duration(rule["for"])
    return converted


def azure_rule_groups(config: str = "{}") -> str:
    """deploy/azure-monitor/prometheus-rule-groups.json: the same groups as Azure Monitor managed Prometheus rule
    groups (an ARM template), for an Azure Monitor workspace, an action group per severity and the settings of
    AZURE_SETTINGS as parameters; ``config`` is merged into _config first (its own values of those settings become
    the parameters' defaults)."""
    defaults = mixin(config)["config"]
    sentinels = ", ".join(f"{name}: {json.dumps(sentinel)}" for name, _, sentinel, _ in AZURE_SETTINGS)
    rendered = mixin(f"({config}) + {{ {sentinels} }}")
    resources = [{
        "type": "Microsoft.AlertsManagement/prometheusRuleGroups", "apiVersion": "2023-03-01",
        "name": group["name"], "location": "[parameters('location')]",
        "properties": {"description": f"se-exporter: {group['name']} (generated from mixin/)",
                       "scopes": ["[parameters('azureMonitorWorkspaceId')]"], "enabled": True, "interval": "PT1M",
                       "rules": [_azure_rule(rule) for rule in group["rules"]]}}
        for group in rendered["alerts"]["groups"] + rendered["rules"]["groups"]]
    parameters: dict[str, Any] = {
        "azureMonitorWorkspaceId": {"type": "string", "metadata": {
            "description": "Resource ID of the Azure Monitor workspace the sidecars' metrics go to."}},
        "criticalActionGroupId": {"type": "string", "metadata": {
            "description": "Resource ID of the action group pages (severity critical) notify: the on-call."}},
        "warningActionGroupId": {"type": "string", "metadata": {
            "description": "Resource ID of the action group warnings notify: a queue read in working hours."}},
        "infoActionGroupId": {"type": "string", "defaultValue": "[parameters('warningActionGroupId')]",
                              "metadata": {"description": "Resource ID of the action group for severity info "
                                                          "(default: the warnings' one)."}},
        "additionalRuleLabels": {"type": "object", "defaultValue": {}, "metadata": {
            "description": "Labels added to every alert (team routing); an alert's own labels win."}},
        "disabledAlerts": {"type": "array", "defaultValue": [], "metadata": {
            "description": "Names of alerts to deploy disabled."}},
        **{name: {"type": kind, "defaultValue": defaults[name], "metadata": {"description": what}}
           for name, kind, _, what in AZURE_SETTINGS},
        "location": {"type": "string", "defaultValue": "[resourceGroup().location]"}}
    template = {
        "$schema": "https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#",
        "contentVersion": "1.0.0.0",
        "metadata": {"description": "Generated from mixin/ by dashboards/generate.py: edit the mixin, then make "
                                    "dashboards. See docs/alerting.md for what differs from Prometheus, and how to "
                                    "render it with your own _config."},
        "parameters": parameters,
        "resources": resources}
    return json.dumps(template, indent=2) + "\n"


def mixin_dashboard(name: str) -> str:
    """A dashboard as the mixin ships it (it imports the generated file): the suite checks both agree."""
    return json.dumps(mixin()["dashboards"][name], indent=2, sort_keys=True) + "\n"


CHART = HERE.parent / "charts" / "se-exporter"
# The chart's PrometheusRules: the node pods' groups, and the fleet's (with fleet.enabled).
CHART_GROUPS = {"node": ["se-exporter", "se-exporter.rules"], "fleet": ["se-exporter-fleet"]}
VALUES_BEGIN = "  # -- generated from mixin/ by dashboards/generate.py (chart_rules.CHART_VALUES): make dashboards --\n"
VALUES_END = "  # -- end of generated values --\n"
# The prometheusRule values the chart's template reads itself; the others are generated.
FIXED_RULE_VALUES = ("enabled", "apiVersion", "labels", "annotations")


@functools.cache
def mixin_rules(config: str = "{}") -> dict[str, Any]:
    """The mixin's alerts, recording rules and _config with ``config`` merged in, once per config (the chart's
    generator renders many; it never changes what it is given)."""
    snippet = (f"local m = (import 'mixin.libsonnet') + {{ _config+:: {config}, chartPlaceholders:: true }};\n"
               "{ alerts: m.prometheusAlerts, rules: m.prometheusRules, config: m._config }")
    result: dict[str, Any] = json.loads(_jsonnet.evaluate_snippet("render", snippet, jpathdir=[str(MIXIN)]))
    return result


def chart_rules_file(render: chart_rules.Render = mixin_rules,
                     values: Sequence[chart_rules.ChartValue] = chart_rules.CHART_VALUES) -> str:
    """charts/se-exporter/files/prometheus-rules.yaml (dashboards/chart_rules.py)."""
    return chart_rules.data_file(render, GENERATED, _yaml, CHART_GROUPS, list(AZURE_SEVERITY), _groups, values)


def chart_values_yaml(chart: Path = CHART, render: chart_rules.Render = mixin_rules,
                 values: Sequence[chart_rules.ChartValue] = chart_rules.CHART_VALUES) -> str:
    """values.yaml with its prometheusRule block's generated part (between the markers) rewritten."""
    text = (chart / "values.yaml").read_text()
    head, _, rest = text.partition(VALUES_BEGIN)
    _, _, tail = rest.partition(VALUES_END)
    return head + VALUES_BEGIN + chart_values.values_block(render, list(AZURE_SEVERITY), values) + VALUES_END + tail


def chart_schema_json(chart: Path = CHART, render: chart_rules.Render = mixin_rules,
                 values: Sequence[chart_rules.ChartValue] = chart_rules.CHART_VALUES) -> str:
    """values.schema.json with the generated properties of prometheusRule rewritten (the others kept)."""
    schema = json.loads((chart / "values.schema.json").read_text())
    properties = schema["properties"]["prometheusRule"]["properties"]
    for stale in [key for key in properties if key not in FIXED_RULE_VALUES]:
        del properties[stale]
    properties.update(chart_values.schema_properties(render, list(AZURE_SEVERITY), values))
    return json.dumps(schema, indent=2) + "\n"


DOCS_BEGIN = "<!-- The table below is generated by dashboards/generate.py (make dashboards): edit CHART_VALUES. -->\n"
DOCS_END = "<!-- End of the generated table. -->\n"


def alerting_doc() -> str:
    """docs/alerting.md with the chart values' table (between the markers) rewritten."""
    text = (HERE.parent / "docs" / "alerting.md").read_text()
    head, _, rest = text.partition(DOCS_BEGIN)
    _, _, tail = rest.partition(DOCS_END)
    return head + DOCS_BEGIN + "\n" + chart_values.docs_table(mixin_rules) + "\n" + DOCS_END + tail


OUTPUTS = {"se-exporter-vm.json": lambda: render(vm_dashboard()),
           "se-exporter-fleet.json": lambda: render(fleet_dashboard()),
           "se-exporter-fleet-events.json": lambda: render(fleet_events_dashboard()),
           "alerts.yaml": lambda: rule_file("alerts", "se-exporter"),
           "fleet-alerts.yaml": lambda: rule_file("alerts", "se-exporter-fleet"),
           "rules.yaml": lambda: rule_file("rules", "se-exporter.rules"),
           "../deploy/azure-monitor/prometheus-rule-groups.json": azure_rule_groups,
           "../charts/se-exporter/files/prometheus-rules.yaml": chart_rules_file,
           "../charts/se-exporter/values.yaml": chart_values_yaml,
           "../charts/se-exporter/values.schema.json": chart_schema_json,
           "../docs/alerting.md": alerting_doc}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON is not what this generates")
    parser.add_argument("--azure-config", metavar="JSONNET", help="print the Azure Monitor rule groups rendered with "
                        "this object merged into the mixin's _config (e.g. \"{ pageSpotPreempt: true }\"), and exit")
    args = parser.parse_args(argv)
    if args.azure_config is not None:
        try:
            sys.stdout.write(azure_rule_groups(args.azure_config))
        except RuntimeError as error:  # the mixin refused the _config: its one line
            parser.error(str(error).splitlines()[0])
        return 0
    stale = []
    for name, build in OUTPUTS.items():
        text = build()
        path = HERE / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
