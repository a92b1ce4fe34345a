// Every threshold and selector of the se-exporter mixin, in one place. Override any of them where you import it:
//   (import 'se-exporter-mixin/mixin.libsonnet') + { _config+:: { impactfulPageSeconds: 1800 } }
{
  _config+:: {
    // The scrape jobs: the sidecars' (SeExporterDown) and the fleet consumer's (SeExporterFleetConsumerDown, ...Blind).
    sidecarJobSelector: 'job=~".*se-exporter.*", job!~".*se-exporter-fleet.*"',
    fleetJobSelector: 'job=~".*se-exporter-fleet.*"',

    // Impactful events take the VM away (memory lost, or the VM deleted); a Freeze only pauses it. Which of them
    // page and which only warn (docs/alerting.md): a page wakes a person, so it is kept for what Azure initiated
    // and leaves time to act on. EventSource is `Platform` or `User` (`unknown` where IMDS gives none).
    // Pages: these types, from these sources, once NotBefore is within impactfulPageSeconds (or they started after
    // the sidecar saw them Scheduled), and as a host failure when Started at first sight.
    pageTypes: ['Reboot', 'Redeploy', 'Terminate'],
    pageSources: ['Platform'],
    // A Spot eviction (Preempt) comes 30 s ahead: nobody can act on it, and Spot users accepted it. It warns; true
    // pages it as well (with the types above, from the same sources).
    pageSpotPreempt: false,
    impactfulPageSeconds: 900,
    // Warnings: these types, from these sources, while Scheduled and not paging (days away, a user's restart or
    // scale-in, a Spot eviction), and when Started at first sight by a sidecar that had not watched long enough.
    warnTypes: ['Reboot', 'Redeploy', 'Preempt', 'Terminate'],
    warnSources: ['Platform', 'User', 'unknown'],
    // An event first seen Started is a host failure only if the sidecar had been watching IMDS for this long
    // before (azure_scheduled_events_watching_since_timestamp_seconds; restored state counts): a sidecar that
    // just started cannot know whether the event was announced, so it warns instead. Longer than a poll and its
    // backoff, far shorter than any notice Azure gives.
    hostFailureWatchedSeconds: 60,
    // A Freeze longer than this warns (Azure's sample approves Freezes up to 9 s); shorter ones are only recorded.
    longFreezeSeconds: 9,
    // A pause the VM felt with no event of its own listed (azure_scheduled_events_pause_seconds{event_type="none"})
    // longer than this warns: the VM stood still without notice. One of the histogram's bucket bounds (0.25, 0.5,
    // 1, 2, 5, 10, 30, 60 s); pauses under a second are seen only while an event is listed.
    unannouncedPauseSeconds: 5,
    // VMs for which a long Freeze pages: a selector on the sidecar's target labels (relabel it onto the target).
    latencySensitiveSelector: 'latency_sensitive="true"',
    // Fleet: an impactful event on more than this many VMs of one scale set at once warns.
    manyVms: 5,

    // The labels of azure_scheduled_events_vm_info every sidecar alert carries: which machine it is.
    vmLabels: ['vm_name', 'vmss_name', 'location', 'subscription_id', 'resource_group'],
    // How long a sidecar that stopped answering is still named from its last vm_info.
    vmInfoLookback: '1h',

    // Per-alert changes, as a mixin user (or the chart's values) writes them: { SeExporterLongFreeze: { severity:
    // 'critical', 'for': '1m' } }. A name that is no alert, a severity other than critical, warning or info, or a
    // `for` that is no duration is refused when the mixin renders (mixin/validate.libsonnet).
    alertOverrides: {},

    // Where the runbooks (docs/operations.md) and Grafana are served; alerts link to both.
    runbookUrl: 'https://se-exporter.example.internal/docs/operations.md',
    grafanaUrl: 'https://grafana.example.internal',

    // The dashboards' uids (mixin/dashboards.libsonnet ships them under these).
    vmDashboardUid: 'se-exporter-vm',
    fleetDashboardUid: 'se-exporter-fleet',
    fleetEventsDashboardUid: 'se-exporter-fleet-events',
  },
}
