// The sidecars' alerts, by who can act and when (docs/alerting.md): a page is an impactful event on this VM that
// Azure initiated and that is near or started after it was seen Scheduled (_config.pageTypes, pageSources,
// pageSpotPreempt), a host failure seen by a sidecar that had been watching, or a long Freeze on a latency-sensitive
// VM; a warning is maintenance with time to prepare, one a user asked for, a Spot eviction, an event already Started
// before the sidecar watched, a long Freeze elsewhere, advice (Spot rebalance) or a sidecar that cannot see; a short
// Freeze, scheduled or started, is only recorded (azure_scheduled_events_transitions_total, the dashboards). Every
// rule joins the VM's identity in itself and counts only events that list this VM (affects_this_vm != "false").
local lib = import '../lib.libsonnet';

{
  local c = $._config,
  local mine = 'affects_this_vm!="false"',
  local re(names) = std.join('|', names),
  // What pages and what warns, as label selectors on azure_scheduled_event_info.
  local pages = 'event_type=~"%s", event_source=~"%s"' % [
    re(c.pageTypes + (if c.pageSpotPreempt then ['Preempt'] else [])), re(c.pageSources)],
  local warns = 'event_type=~"%s", event_source=~"%s"' % [re(c.warnTypes), re(c.warnSources)],
  // Of the events Started at first sight, those this sidecar had watched long enough to have seen Scheduled.
  local watched = |||
    (azure_scheduled_event_first_seen_timestamp_seconds
       - on(job, instance) group_left() azure_scheduled_events_watching_since_timestamp_seconds) >= %(watched)s
  ||| % { watched: c.hostFailureWatchedSeconds },
  local atFirstSight = |||
    (azure_scheduled_event_started_timestamp_seconds
       - on(job, instance, event_id, event_type) azure_scheduled_event_first_seen_timestamp_seconds) == 0
  |||,
  local alert(name, severity, expr, summary, description, dashboard='vm', extra={}) = {
    alert: name,
    expr: expr,
  } + extra + {
    labels: { severity: severity },
    annotations: {
      summary: summary,
      description: lib.fold(description),
      runbook_url: lib.runbook(c, name),
      dashboard_url: if dashboard == 'vm' then lib.vmDashboard(c) else lib.fleetDashboard(c, dashboard),
    },
  },

  sidecarAlerts:: [
    alert(
      'SeExporterImpactfulEventScheduled', 'warning',
      // Every Scheduled event that warns, unless it pages now: days away, or of a type or source that never pages.
      lib.withVm(|||
        (
          azure_scheduled_event_seconds_until_not_before
            * on(job, instance, event_id) group_left(event_status, event_source)
          azure_scheduled_event_info{%(warns)s, event_status="Scheduled", %(mine)s}
        )
          unless on(job, instance, event_id)
        (
          (azure_scheduled_event_seconds_until_not_before <= %(page)d)
            and on(job, instance, event_id)
          azure_scheduled_event_info{%(pages)s, event_status="Scheduled", %(mine)s}
        )
      ||| % { page: c.impactfulPageSeconds, pages: pages, warns: warns, mine: mine }, c),
      '{{ $labels.event_type }} of %s in {{ $value | humanizeDuration }}' % lib.machine,
      |||
        Azure scheduled a {{ $labels.event_type }} ({{ $labels.event_source }}, event {{ $labels.event_id }}) for
        VM {{ $labels.vm_name }}; it may start in {{ $value | humanizeDuration }} (NotBefore), or earlier if someone
        approves it. Events of %(pageTypes)s from %(pageSources)s page %(page)d s before NotBefore; others only
        warn.
      ||| % { page: c.impactfulPageSeconds, pageTypes: re(c.pageTypes + (if c.pageSpotPreempt then ['Preempt'] else [])),
              pageSources: re(c.pageSources) },
    ),
    alert(
      'SeExporterImpactfulEventImminent', 'critical',
      // Scheduled within the paging window, or Started after this sidecar saw it Scheduled (one Started at first
      // sight is SeExporterHostFailure's, or SeExporterImpactfulEventStartedBeforeWatching's).
      lib.withVm(|||
        max without (resource_type, affects_this_vm) (
          (azure_scheduled_event_seconds_until_not_before <= %(page)d)
            * on(job, instance, event_id) group_left(event_status, event_source)
          azure_scheduled_event_info{%(pages)s, event_status="Scheduled", %(mine)s}
          or
          0 * (
            azure_scheduled_event_info{%(pages)s, event_status="Started", %(mine)s}
              and on(job, instance, event_id)
            (azure_scheduled_event_started_timestamp_seconds
               - on(job, instance, event_id, event_type) azure_scheduled_event_first_seen_timestamp_seconds) > 0
          )
        )
      ||| % { page: c.impactfulPageSeconds, pages: pages, mine: mine }, c),
      '{{ $labels.event_type }} of %s {{ if eq $labels.event_status "Started" }}in progress{{ else }}in {{ $value | humanizeDuration }}{{ end }}' % lib.machine,
      |||
        Event {{ $labels.event_id }} ({{ $labels.event_type }}, {{ $labels.event_source }}) is {{ $labels.event_status }}
        on VM {{ $labels.vm_name }}: no more than %(page)d s of notice are left. It resolves when Azure removes the
        event from the document.
      ||| % { page: c.impactfulPageSeconds },
    ),
    alert(
      'SeExporterHostFailure', 'critical',
      // Started at first sight by a sidecar that had been watching long enough to have seen it Scheduled.
      lib.withVm(|||
        %(atFirstSight)s
          and on(job, instance, event_id)
        azure_scheduled_event_info{%(pages)s, event_status="Started", %(mine)s}
          and on(job, instance, event_id)
        %(watched)s
      ||| % { atFirstSight: std.rstripChars(atFirstSight, '\n'), pages: pages, mine: mine,
              watched: std.rstripChars(watched, '\n') }, c),
      '{{ $labels.event_type }} with no notice on %s: host failure' % lib.machine,
      |||
        Event {{ $labels.event_id }} was already Started when se-exporter first saw it on VM {{ $labels.vm_name }},
        after watching IMDS for at least %(watched)s s: Azure skips the notice when the host fails, and recovers
        the VM on another host.
      ||| % { watched: c.hostFailureWatchedSeconds },
    ),
    alert(
      'SeExporterImpactfulEventStartedBeforeWatching', 'warning',
      // Started at first sight by a sidecar that had not watched long enough (a pod replaced mid-wave with no state,
      // or one restarted after a long stop): it cannot know whether the event was announced, so it does not page.
      lib.withVm(|||
        (
          %(atFirstSight)s
            and on(job, instance, event_id)
          azure_scheduled_event_info{%(warns)s, event_status="Started", %(mine)s}
        )
          unless on(job, instance, event_id)
        %(watched)s
      ||| % { atFirstSight: std.rstripChars(atFirstSight, '\n'), warns: warns, mine: mine,
              watched: std.rstripChars(watched, '\n') }, c),
      '{{ $labels.event_type }} already in progress when se-exporter started watching %s' % lib.machine,
      |||
        Event {{ $labels.event_id }} was already Started when se-exporter first saw it on VM {{ $labels.vm_name }},
        less than %(watched)s s after this sidecar started watching IMDS (with no state to continue, or after a stop
        longer than its allowed gap): it cannot tell a host failure from maintenance announced before it watched, so
        this warns rather than pages.
      ||| % { watched: c.hostFailureWatchedSeconds },
    ),
    alert(
      'SeExporterLongFreeze', 'warning',
      lib.withVm(|||
        (azure_scheduled_event_duration_seconds{event_type="Freeze"} > %(long)s)
          * on(job, instance, event_id) group_left(event_status)
        azure_scheduled_event_info{event_status=~"Scheduled|Started", %(mine)s}
      ||| % { long: c.longFreezeSeconds, mine: mine }, c),
      '{{ $value }} s Freeze {{ $labels.event_status }} on %s' % lib.machine,
      |||
        A Freeze of {{ $value }} seconds (event {{ $labels.event_id }}) is {{ $labels.event_status }} on VM
        {{ $labels.vm_name }}: longer than %(long)s s. CPU and network pause; memory and open files are kept.
      ||| % { long: c.longFreezeSeconds },
    ),
    alert(
      'SeExporterLongFreezeOnLatencySensitiveVm', 'critical',
      lib.withVm(|||
        (azure_scheduled_event_duration_seconds{event_type="Freeze"} > %(long)s)
          * on(job, instance, event_id) group_left(event_status)
        azure_scheduled_event_info{event_status=~"Scheduled|Started", %(mine)s}
          and on(job, instance)
        azure_scheduled_events_up{%(sensitive)s}
      ||| % { long: c.longFreezeSeconds, mine: mine, sensitive: c.latencySensitiveSelector }, c),
      '{{ $value }} s Freeze {{ $labels.event_status }} on latency-sensitive %s' % lib.machine,
      |||
        A Freeze of {{ $value }} seconds (event {{ $labels.event_id }}) is {{ $labels.event_status }} on VM
        {{ $labels.vm_name }}, which is marked latency-sensitive (%(sensitive)s): fail its role over first.
      ||| % { sensitive: c.latencySensitiveSelector },
    ),
    alert(
      'SeExporterUnannouncedPause', 'warning',
      // Pauses longer than the bound in the last 15 minutes: the count less those within the bound's bucket.
      lib.withVm(|||
        (
          sum by (job, instance) (increase(azure_scheduled_events_pause_seconds_count{event_type="none"}[15m]))
          - sum by (job, instance) (
              increase(azure_scheduled_events_pause_seconds_bucket{event_type="none", le=~"%(bound)s(\\.0+)?"}[15m]))
        ) > 0
      ||| % { bound: c.unannouncedPauseSeconds }, c),
      'Unannounced pause of more than %s s on %s' % [c.unannouncedPauseSeconds, lib.machine],
      |||
        VM {{ $labels.vm_name }} stood still for more than %(bound)s s with no scheduled event of its own listed
        ({{ $value }} such pauses in 15 minutes). The host may have frozen it without notice, or
        the sidecar was stopped or starved (docs/events.md, "Pauses"); look at what ran on it then.
      ||| % { bound: c.unannouncedPauseSeconds },
    ),
    alert(
      'SeExporterSpotRebalanceRecommended', 'warning',
      lib.withVm(|||
        azure_scheduled_event_info{event_type="SpotRebalanceRecommendation", %(mine)s}
      ||| % { mine: mine }, c),
      'Spot eviction risk is elevated for %s' % lib.machine,
      |||
        Azure recommends rebalancing Spot VM {{ $labels.vm_name }} (event {{ $labels.event_id }}): its eviction
        risk is elevated. It is advice, not an eviction: prepare (start a replacement, move work away). There is
        nothing to approve.
      |||,
    ),
    alert(
      'SeExporterAksEventNotSeen', 'warning',
      // AKS only, and only with kube-state-metrics: AKS's node-problem-detector (NPD) condition for a scheduled
      // event on a node that se-exporter does not list, matched on the node (the scrape-time `node` label, see
      // the Helm chart's monitors) and, where the condition names it, the event type. Where se-exporter
      // lists the event its own alerts speak (or deliberately stay quiet, as for a short Freeze) and this one does
      // not. `for: 3m` outlasts NPD's one-minute check plus a kube-state-metrics scrape, during which the
      // condition stays True after the event has left IMDS (and se-exporter's series).
      |||
        (
          max by (node, condition) (kube_node_status_condition{condition="VMEventScheduled", status="true"} == 1)
            unless on(node)
          azure_scheduled_event_info
        )
        or
        (
          label_replace(
            max by (node, condition) (kube_node_status_condition{condition=~"(Freeze|Reboot|Redeploy|Preempt|Terminate)Scheduled", status="true"} == 1),
            "event_type", "$1", "condition", "(.+)Scheduled")
            unless on(node, event_type)
          azure_scheduled_event_info
        )
      |||,
      '{{ $labels.condition }} on AKS node {{ $labels.node }}, not seen by se-exporter',
      |||
        kube-state-metrics reports the node-problem-detector condition {{ $labels.condition }} as True on node
        {{ $labels.node }} for 3 minutes, but no se-exporter scraped with node="{{ $labels.node }}" lists such an
        event: this maintenance gets no countdown, no duration and none of se-exporter's alerts.
      |||,
      dashboard=c.fleetDashboardUid, extra={ 'for': '3m' },
    ),
    alert(
      'SeExporterDown', 'warning',
      lib.withLastVm('up{%s} == 0' % c.sidecarJobSelector, c),
      'se-exporter on %s does not answer scrapes' % lib.machine,
      'Prometheus cannot scrape {{ $labels.instance }} (job {{ $labels.job }}) for 2 minutes: maintenance of VM {{ $labels.vm_name }} is invisible.',
      extra={ 'for': '2m' },
    ),
    alert(
      'SeExporterImdsFailing', 'warning',
      lib.withVm('azure_scheduled_events_up == 0', c),
      'se-exporter on %s cannot read Scheduled Events' % lib.machine,
      'The last polls of IMDS failed for 2 minutes; the metrics show the last valid state.',
      extra={ 'for': '2m' },
    ),
    alert(
      'SeExporterStale', 'warning',
      lib.withVm('time() - azure_scheduled_events_last_success_timestamp_seconds > 300', c),
      'No valid Scheduled Events document from %s for {{ $value | humanizeDuration }}' % lib.machine,
      'se-exporter answers but has not read a valid document for over 5 minutes (never, if it just started).',
      extra={ 'for': '1m' },
    ),
    alert(
      'SeExporterForwardingBacklog', 'warning',
      lib.withVm(|||
        azure_scheduled_events_spool_documents > 0
          and on(job, instance)
        increase(azure_scheduled_events_forwarded_documents_total{sink="eventhubs"}[10m]) == 0
      |||, c),
      '{{ $value }} documents from %s waiting for Event Hubs' % lib.machine,
      'Documents are spooled and Event Hubs has acknowledged none of them for 10 minutes.',
      extra={ 'for': '10m' },
    ),
    alert(
      'SeExporterDocumentsDropped', 'warning',
      // Two ways to lose a document: the spool was full (oldest dropped), or a target refused it (full disk,
      // write error) for longer than the in-memory queue could hold, or the sidecar stopped with it queued.
      lib.withVm(|||
        sum without (sink) (increase(azure_scheduled_events_spool_dropped_documents_total[15m])) > 0
        or sum without (sink) (increase(azure_scheduled_events_forward_dropped_documents_total[15m])) > 0
      |||, c),
      '%s dropped documents meant for forwarding' % lib.machine,
      |||
        Documents were dropped in the last 15 minutes (a full spool, or a refusing target whose in-memory queue
        filled up): central logging has a gap.
      |||,
    ),
  ],
}
