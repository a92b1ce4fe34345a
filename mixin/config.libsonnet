// Every threshold and selector of the se-exporter mixin, in one place. Override any of them where you import it:
//   (import 'se-exporter-mixin/mixin.libsonnet') + { _config+:: { impactfulPageSeconds: 1800 } }
{
  _config+:: {
    // The scrape jobs: the sidecars' (SeExporterDown) and the fleet consumer's (SeExporterFleetConsumerDown, ...Blind).
    sidecarJobSelector: 'job=~".*se-exporter.*", job!~".*se-exporter-fleet.*"',
    fleetJobSelector: 'job=~".*se-exporter-fleet.*"',

    // Event types that take the VM away (memory lost, or the VM deleted); a Freeze only pauses it.
    impactfulTypes: 'Reboot|Redeploy|Preempt|Terminate',
    // An impactful event on this VM warns when scheduled, and pages once its NotBefore is this close (or it started).
    impactfulPageSeconds: 900,
    // A Freeze longer than this warns (Azure's sample approves Freezes up to 9 s); shorter ones are only recorded.
    longFreezeSeconds: 9,
    // VMs for which a long Freeze pages: a selector on the sidecar's target labels (relabel it onto the target).
    latencySensitiveSelector: 'latency_sensitive="true"',
    // Fleet: an impactful event on more than this many VMs of one scale set at once warns.
    manyVms: 5,

    // The labels of azure_scheduled_events_vm_info every sidecar alert carries: which machine it is.
    vmLabels: ['vm_name', 'vmss_name', 'location', 'subscription_id', 'resource_group'],
    // How long a sidecar that stopped answering is still named from its last vm_info.
    vmInfoLookback: '1h',

    // Where the runbooks (docs/operations.md) and Grafana are served; alerts link to both.
    runbookUrl: 'https://se-exporter.example.internal/docs/operations.md',
    grafanaUrl: 'https://grafana.example.internal',

    // The dashboards' uids (mixin/dashboards.libsonnet ships them under these).
    vmDashboardUid: 'se-exporter-vm',
    fleetDashboardUid: 'se-exporter-fleet',
    fleetEventsDashboardUid: 'se-exporter-fleet-events',
  },
}
