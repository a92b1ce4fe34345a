// se-exporter's monitoring mixin: prometheusAlerts, prometheusRules, grafanaDashboards and their _config.
//   local seExporter = (import 'mixin.libsonnet') + { _config+:: { longFreezeSeconds: 15 } };
//   seExporter.prometheusAlerts   // a Prometheus rule file's content; likewise .prometheusRules
// dashboards/generate.py renders it into dashboards/alerts.yaml, fleet-alerts.yaml, the PrometheusRule and the
// Azure Monitor rule groups; the suite checks those files are exactly what it renders.
(import 'config.libsonnet') +
(import 'alerts.libsonnet') +
(import 'rules.libsonnet') +
(import 'dashboards.libsonnet')
