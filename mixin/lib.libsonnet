// Helpers the alert rules share: the join that names the machine, and the links every alert carries.
{
  // `expr`, per (job, instance), with the VM's identity from azure_scheduled_events_vm_info joined in the rule itself
  // (no recording rule to deploy). A sidecar that has not read its identity yet still alerts: its `up` stands in,
  // and the identity labels are empty.
  withVm(expr, config):: |||
    (
    %(expr)s
    )
      * on(job, instance) group_left(%(labels)s)
    (azure_scheduled_events_vm_info or on(job, instance) (azure_scheduled_events_up * 0 + 1))
  ||| % { expr: std.rstripChars(expr, '\n'), labels: std.join(', ', config.vmLabels) },

  // The same for a sidecar that stopped answering: its last vm_info within vmInfoLookback names it.
  withLastVm(expr, config):: |||
    (
    %(expr)s
    )
      * on(job, instance) group_left(%(labels)s)
    (
      topk by (job, instance) (1, last_over_time(azure_scheduled_events_vm_info[%(lookback)s]))
      or on(job, instance) (%(expr)s) * 0 + 1
    )
  ||| % { expr: std.rstripChars(expr, '\n'), labels: std.join(', ', config.vmLabels), lookback: config.vmInfoLookback },

  // A text block as one paragraph (YAML's folded style): Alertmanager shows it as written.
  fold(text):: std.join(' ', std.filter(function(w) w != '', std.split(std.strReplace(text, '\n', ' '), ' '))),

  // One line naming the machine, for summaries: the VM, its scale set and AKS node where it has them, its location.
  machine:: '{{ $labels.vm_name }} ({{ with $labels.vmss_name }}scale set {{ . }}, {{ end }}'
            + '{{ with $labels.node }}node {{ . }}, {{ end }}{{ $labels.location }}, {{ $labels.instance }})',

  runbook(config, alert):: '%s#%s' % [config.runbookUrl, std.asciiLower(alert)],
  vmDashboard(config):: '%s/d/%s?var-vm_name={{ $labels.vm_name }}' % [config.grafanaUrl, config.vmDashboardUid],
  fleetDashboard(config, uid):: '%s/d/%s' % [config.grafanaUrl, uid],
}
