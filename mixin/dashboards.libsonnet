// The dashboards, as dashboards/generate.py builds them with Grafana's foundation SDK (the JSON files beside it):
// the mixin ships them unchanged, so a kube-prometheus user gets the same files the Helm chart and dashboards/ do.
{
  grafanaDashboards+:: {
    'se-exporter-vm.json': import '../dashboards/se-exporter-vm.json',
    'se-exporter-fleet.json': import '../dashboards/se-exporter-fleet.json',
    'se-exporter-fleet-events.json': import '../dashboards/se-exporter-fleet-events.json',
  },
}
