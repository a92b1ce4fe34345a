// The alert groups, after the checks of validate.libsonnet: a _config that would render an invalid rule stops the
// rendering with one line naming the key, and _config.alertOverrides is applied (and checked) here.
local validate = import 'validate.libsonnet';

(import 'alerts/sidecar.libsonnet') + (import 'alerts/fleet.libsonnet') + {
  local c = $._config,
  local all = validate.overridden(c, $.sidecarAlerts + $.fleetAlerts),
  local sidecar = std.length($.sidecarAlerts),
  prometheusAlerts+:: {
    // The chart's generator (dashboards/chart_rules.py) renders with placeholder values and checks the chart's
    // values itself (values.schema.json and the template); every other rendering is checked here.
    assert (std.objectHasAll($, 'chartPlaceholders') && $.chartPlaceholders) || validate.config(c),
    groups+: [
      { name: 'se-exporter', rules: all[:sidecar] },
      { name: 'se-exporter-fleet', rules: all[sidecar:] },
    ],
  },
}
