// Prometheus alerting rules for `se-exporter fleet`, the consumer that keeps every VM's latest forwarded document.
// Around a partition hand-over two replicas may show the same VMs (and the same partition) for a moment, so every
// rule counts distinct VMs over the per-VM series (count by (..., vm_id)) and distinct partitions over the
// per-partition series, never a sum of the replicas' own totals (vms, pending_vms, event_vms, imds_unreachable_vms,
// owned_partitions). Counters (expirations, invalid messages) are summed: they count what each replica did.
// The platform stream (README "Two streams"): platform_event_info of an EventId comes from the one replica that shows
// its home platform partition (two around a hand-over: the rules take one, max by event_id); platform_event_vms from
// every replica, counting the VMs it judged (those it shows), so the rules sum it over the replicas. For the moment
// of a hand-over a moving partition's VMs may be judged by both: an alert's value may count them twice, whether it
// fires does not change (each replica's judgement is true), and it stays one alert per EventId.
// Tested by the suite with `promtool check rules`, `promtool test rules` (cases in tests/fleet/test_alerts.py) and
// against a live Prometheus scraping a live fleet consumer. SeExporterFleetConsumerDown and SeExporterFleetBlind match
// the scrape jobs of _config.fleetJobSelector.
local lib = import '../lib.libsonnet';

{
  local c = $._config,
  local alert(name, severity, expr, summary, description, extra={}, annotations={}) = {
    alert: name,
    expr: expr,
  } + extra + {
    labels: { severity: severity },
    annotations: {
      summary: summary,
      description: lib.fold(description),
      runbook_url: lib.runbook(c, name),
      dashboard_url: lib.fleetDashboard(c, c.fleetEventsDashboardUid),
    } + annotations,
  },
  // The VMs of one event that missed it, by name, from the fleet's bounded list of them
  // (azure_scheduled_fleet_platform_event_missed_vm_info: the first 20 per event and coverage): the `vms`
  // annotation of the missed-event alerts, as `vm (coverage)`, sorted by name.
  local missedVms(coverages) =
    '{{ range query (printf "max by (vm_name, coverage) (azure_scheduled_fleet_platform_event_missed_vm_info'
    + '{job=%%q, event_id=%%q, coverage=~%%q})" $labels.job $labels.event_id "%s") | sortByLabel "vm_name" }}' % coverages
    + '{{ .Labels.vm_name }} ({{ .Labels.coverage }}) {{ end }}',
  local impactful = std.join('|', c.pageTypes + (if c.pageSpotPreempt then ['Preempt'] else [])),
  local pageSources = std.join('|', c.pageSources),

  fleetAlerts:: [
    alert(
      "SeExporterFleetImpactfulMaintenanceOnManyVms", "warning",
      |||
        count by (job, vmss_name, event_type) (
          count by (job, vmss_name, event_type, vm_id) (
            azure_scheduled_fleet_event_info{event_type=~"Reboot|Redeploy|Preempt|Terminate", event_status="Scheduled", affects_this_vm!="false", vmss_name!=""}
          )
        ) > %(manyVms)d
      ||| % { manyVms: c.manyVms },
      "{{ $labels.event_type }} scheduled for {{ $value }} VMs of scale set {{ $labels.vmss_name }}",
      |||
        Azure scheduled a {{ $labels.event_type }} for {{ $value }} VMs of the scale set {{ $labels.vmss_name }} at once: more than one instance at a time may be out.
      |||,
    ),
    alert(
      "SeExporterFleetSidecarMissedImpactfulEvent", "critical",
      |||
        sum by (job, event_id, event_type) (
          azure_scheduled_fleet_platform_event_vms{coverage=~"missed|imds_unreachable", event_type=~"%(impactful)s"}
        )
        * on (job, event_id) group_left (scope_type, scope_name, location)
        max by (job, event_id, scope_type, scope_name, location) (
          azure_scheduled_fleet_platform_event_info{event_status=~"Scheduled|Started", event_source=~"%(sources)s"}
        )
        > 0
      ||| % { impactful: impactful, sources: pageSources },
      "Azure announced a {{ $labels.event_type }} for {{ $value }} VMs of {{ $labels.scope_name }} that their running sidecars did not see",
      |||
        The platform stream announced {{ $labels.event_type }} {{ $labels.event_id }} ({{ $labels.scope_type }} {{ $labels.scope_name }}, {{ $labels.location }}). On {{ $value }} of its VMs the sidecar is alive but has not listed it --reconcile-grace after the announcement, or has not read IMDS since before it: nothing on those VMs prepares for it, and no alert of theirs will fire. The `vms` annotation names them (the first 20 of each kind).
      |||,
      annotations={ vms: missedVms('missed|imds_unreachable') },
    ),
    alert(
      "SeExporterFleetSidecarMissedFreeze", "warning",
      |||
        sum by (job, event_id, event_type) (
          azure_scheduled_fleet_platform_event_vms{coverage=~"missed|imds_unreachable", event_type="Freeze"}
        )
        * on (job, event_id) group_left (scope_type, scope_name, location)
        max by (job, event_id, scope_type, scope_name, location) (
          azure_scheduled_fleet_platform_event_info{event_status=~"Scheduled|Started"}
        )
        > 0
      |||,
      "Azure announced a Freeze for {{ $value }} VMs of {{ $labels.scope_name }} that their running sidecars did not see",
      |||
        The platform stream announced Freeze {{ $labels.event_id }} ({{ $labels.scope_type }} {{ $labels.scope_name }}, {{ $labels.location }}): a pause of a few seconds. On {{ $value }} of its VMs the sidecar is alive but did not list it, or has not read IMDS since before it. The `vms` annotation names them (the first 20 of each kind).
      |||,
      annotations={ vms: missedVms('missed|imds_unreachable') },
    ),
    alert(
      "SeExporterFleetAnnouncedEventOnVmsWithoutSidecar", "warning",
      |||
        sum by (job, event_id, event_type) (azure_scheduled_fleet_platform_event_vms{coverage="no_sidecar"})
        * on (job, event_id) group_left (scope_type, scope_name, location)
        max by (job, event_id, scope_type, scope_name, location) (
          azure_scheduled_fleet_platform_event_info{event_status=~"Scheduled|Started"}
        )
        > 0
        and on (job)
        count by (job) (azure_scheduled_fleet_vm_last_seen_timestamp_seconds) > 0
      |||,
      "Azure announced a {{ $labels.event_type }} for {{ $value }} VMs of {{ $labels.scope_name }} that run no sidecar",
      |||
        The platform stream announced {{ $labels.event_type }} {{ $labels.event_id }} ({{ $labels.scope_type }} {{ $labels.scope_name }}, {{ $labels.location }}) for {{ $value }} VMs no sidecar has been heard from within --vm-expiry: this fleet sees their maintenance only through Azure's copy, and nothing on those VMs reacts to it. The `vms` annotation names them (the first 20). (Silent in a fleet that hears from no sidecar at all: the platform stream alone.)
      |||,
      extra={ 'for': '5m' },
      annotations={ vms: missedVms('no_sidecar') },
    ),
    alert(
      "SeExporterFleetVmsWentSilent", "warning",
      |||
        sum by (job) (increase(azure_scheduled_fleet_vm_expirations_total[15m])) > 0
      |||,
      "{{ $value }} VMs stopped reporting to the fleet consumer",
      |||
        {{ $value }} VMs sent neither a document nor a heartbeat for --vm-expiry and were forgotten in the last 15 minutes: their maintenance is invisible centrally.
      |||,
    ),
    alert(
      "SeExporterFleetConsumerLagging", "warning",
      |||
        max by (job, partition_id) (azure_scheduled_fleet_partition_lag_seconds) > 300
      |||,
      "Fleet consumer {{ $value | humanizeDuration }} behind on partition {{ $labels.partition_id }}",
      |||
        The newest document in partition {{ $labels.partition_id }} was enqueued {{ $value | humanizeDuration }} after the last one handled: the fleet view is that much out of date.
      |||,
      extra={ 'for': '10m' },
    ),
    alert(
      "SeExporterFleetPartitionsUnowned", "warning",
      |||
        (
          count by (job) (count by (job, partition_id) (azure_scheduled_fleet_partition_checkpoint_age_seconds))
          or 0 * max by (job) (azure_scheduled_fleet_hub_partitions)
        ) < max by (job) (azure_scheduled_fleet_hub_partitions)
      |||,
      "Fleet consumer reads only {{ $value }} of the hub's partitions",
      |||
        Fewer partitions are owned than the event hub has for 5 minutes: the VMs of the others are missing from the fleet view.
      |||,
      extra={ 'for': '5m' },
    ),
    alert(
      "SeExporterFleetCheckpointsStale", "warning",
      |||
        max by (job, instance, partition_id) (azure_scheduled_fleet_partition_checkpoint_age_seconds) > 300
      |||,
      "Partition {{ $labels.partition_id }} on {{ $labels.instance }} has not been checkpointed for {{ $value | humanizeDuration }}",
      |||
        Handled documents are not written to the checkpoint store: a restart would replay them, and a replica taking this partition over would start from an old state.
      |||,
      extra={ 'for': '5m' },
    ),
    alert(
      "SeExporterFleetInvalidMessages", "info",
      |||
        sum by (job, reason) (increase(azure_scheduled_fleet_invalid_messages_total[15m])) > 0
      |||,
      "{{ $value }} messages on the hub are not forwarded documents ({{ $labels.reason }})",
      |||
        Messages that are not se-exporter documents reached the fleet consumer in the last 15 minutes; they were skipped and counted.
      |||,
    ),
    alert(
      "SeExporterFleetVmsCannotReadImds", "warning",
      |||
        count by (job) (count by (job, vm_id) (azure_scheduled_fleet_vm_imds_unreachable_since_timestamp_seconds)) > 0
      |||,
      "{{ $value }} VMs cannot read their Scheduled Events from IMDS",
      |||
        The sidecars of {{ $value }} VMs still report to the fleet, but their latest IMDS poll failed, or their last successful read is more than 2 minutes older than what they sent, for 5 minutes: maintenance scheduled for these VMs goes unseen, centrally and on the VM.
      |||,
      extra={ 'for': '5m' },
    ),
    alert(
      "SeExporterFleetBlind", "critical",
      // A blind fleet: no replica of the consumer answers, or those that answer read none of the hub's partitions.
      // Every other fleet alert is silent then, so this one pages.
      |||
        count by (job) (up{%(fleet)s}) unless on(job) count by (job) (up{%(fleet)s} == 1)
        or
        max by (job) (azure_scheduled_fleet_hub_partitions) > 0
          unless on(job)
        max by (job) (azure_scheduled_fleet_owned_partitions) > 0
      ||| % { fleet: c.fleetJobSelector },
      "The fleet consumer {{ $labels.job }} is blind: no replica answers or reads a partition",
      |||
        For 5 minutes no replica of {{ $labels.job }} has answered a scrape, or none owns any of the hub's
        partitions: no maintenance of any VM is seen centrally, and no other fleet alert can fire.
      |||,
      extra={ 'for': '5m' },
    ),
    alert(
      "SeExporterFleetConsumerDown", "warning",
      |||
        up{%(fleet)s} == 0
      ||| % { fleet: c.fleetJobSelector },
      "Fleet consumer {{ $labels.instance }} does not answer scrapes",
      |||
        Prometheus cannot scrape {{ $labels.instance }} (job {{ $labels.job }}) for 2 minutes.
      |||,
      extra={ 'for': '2m' },
    ),
  ],
}
