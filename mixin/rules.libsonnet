// Recording rules: what the dashboards and reports count, each EventId once (an availability set lists one event
// on every VM of the set), and each VM once. No alert depends on them.
{
  prometheusRules+:: {
    groups+: [{
      name: 'se-exporter.rules',
      rules: [
        {
          // Distinct EventIds listed anywhere, by type and status.
          record: 'azure_scheduled_events:event_ids:count',
          expr: 'count by (event_type, event_status) (count by (event_id, event_type, event_status) (azure_scheduled_event_info))',
        },
        {
          // VMs listed in an event as theirs, by type and status (a neighbour's listing does not count).
          record: 'azure_scheduled_events:affected_vms:count',
          expr: 'count by (event_type, event_status) (count by (job, instance, event_type, event_status) (azure_scheduled_event_info{affects_this_vm!="false"}))',
        },
        {
          // Freezes started on their VMs: the short ones are recorded here and on the dashboards, never alerted.
          record: 'azure_scheduled_events:freezes_started:increase1h',
          expr: 'sum(increase(azure_scheduled_events_transitions_total{event_type="Freeze", transition="started", affects_this_vm!="false"}[1h]))',
        },
      ],
    }],
  },
}
