(import 'alerts/sidecar.libsonnet') + (import 'alerts/fleet.libsonnet') + {
  prometheusAlerts+:: {
    groups+: [
      { name: 'se-exporter', rules: $.sidecarAlerts },
      { name: 'se-exporter-fleet', rules: $.fleetAlerts },
    ],
  },
}
