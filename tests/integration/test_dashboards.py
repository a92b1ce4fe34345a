"""Dashboards and alert rules against the real thing: every expression runs on a real Prometheus that scrapes a
real sidecar driven through the demo scenario, and returns data where the scenario lights it up."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from se_exporter.simulator.faults import Fault
from tests.conftest import SimulatorFactory
from tests.integration.test_prometheus import Prometheus
from tests.support.child_logs import attach
from tests.support.helpers import (
    WATCHED_FAST,
    Sidecar,
    free_port,
    http_get,
    parse_samples,
    pause_process,
    step_through,
    stop_process,
    wait_until,
    watched_for_an_hour,
)
from tests.support.kube_schemas import CHART, render

pytestmark = pytest.mark.integration
DASHBOARDS = Path(__file__).parent.parent.parent / "dashboards"
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")
# Grafana's placeholders, as Grafana would fill them for a scrape interval of 1 s.
PLACEHOLDERS = {"$__rate_interval": "10s", "$__interval": "1s", "$__range": "10m", "$job": ".*", "$instance": ".*",
                "$cluster": ".*", "$location": ".*", "$vmss_name": ".*", "$node": ".*", "$vm_name": ".*"}
# Expressions that cannot light up within a test's minutes or the demo scenario, and why; promtool's unit tests cover
# them.
NEEDS_MINUTES = {"SeExporterStale": "needs five minutes without a valid document",
                 "SeExporterLongFreezeOnLatencySensitiveVm": "needs a target marked latency-sensitive",
                 "SeExporterSpotRebalanceRecommended": "needs a SpotRebalanceRecommendation, which the demo lacks",
                 "SeExporterImpactfulEventImminent": "the demo's only impactful event near on this VM is a Spot "
                 "Preempt, which warns (pageSpotPreempt); tests/integration/test_paging_cases.py lights it on the "
                 "real sidecar's scrape",
                 "SeExporterImpactfulEventStartedBeforeWatching": "SeExporterHostFailure's complement on the same "
                 "event: this sidecar has watched (so the host failure lights); test_paging_cases.py lights it"}


VALUE_SETS_DIR = CHART / "ci"
# Kubernetes node names as AKS gives them; IMDS calls the first one's VM something else (WestNO_0 here).
NODE, OTHER_NODE = "aks-nodepool1-12345678-vmss000000", "aks-spot-87654321-vmss000003"
NODE_PANEL = "AKS node conditions (kube-state-metrics)"
NPD_RULE = "SeExporterAksEventNotSeen"


class StaticTarget:
    """A scrape target on 127.0.0.1 that serves whatever text the test sets: here, kube-state-metrics' exposition
    of node conditions, which needs a Kubernetes API server to produce for real. Prometheus scrapes it as usual."""

    def __init__(self) -> None:
        self.body = ""
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                payload = target.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: scrapes come every second."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def kube_state_metrics() -> Iterator[StaticTarget]:
    target = StaticTarget()
    yield target
    target.stop()


def node_conditions(conditions: dict[tuple[str, str], str]) -> str:
    """kube_node_status_condition as kube-state-metrics writes it: one series per status, the current one 1."""
    lines = ["# HELP kube_node_status_condition [STABLE] The condition of a cluster node",
             "# TYPE kube_node_status_condition gauge"]
    for (node, condition), current in conditions.items():
        lines += [f'kube_node_status_condition{{node="{node}",condition="{condition}",status="{status}"}} '
                  f"{1 if status == current else 0}" for status in ("true", "false", "unknown")]
    return "\n".join(lines) + "\n"


def pod_monitor_relabelling() -> list[dict[str, Any]]:
    """The relabelings of the PodMonitor the Helm chart renders (the real helm), as the Prometheus Operator writes
    them into Prometheus' configuration."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex",
             "replacement": "replacement", "action": "action", "separator": "separator"}
    documents = render(VALUE_SETS_DIR / "pod-monitor-values.yaml")
    monitor = next(d for d in documents if d["kind"] == "PodMonitor")
    return [{names[key]: value for key, value in rule.items()}
            for rule in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]]


def on_aks(ksm: StaticTarget) -> dict[str, Any]:
    """Prometheus options for the sidecar as the PodMonitor scrapes it on node NODE, beside kube-state-metrics
    (scraped with honor_labels, as kube-prometheus-stack does, so its own `node` label stays)."""
    return {"target_labels": {"__meta_kubernetes_pod_node_name": NODE}, "relabel_configs": pod_monitor_relabelling(),
            "extra_jobs": [{"job_name": "kube-state-metrics", "honor_labels": True,
                            "static_configs": [{"targets": [ksm.address]}]}]}


def dashboard_expressions(fleet_consumer: bool = False) -> list[tuple[str, str]]:
    """The sidecar dashboards' expressions, or (``fleet_consumer``) those of `se-exporter fleet`'s dashboard,
    which tests/integration/test_fleet.py runs against a fleet consumer."""
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        if ("azure_scheduled_fleet_" in path.read_text()) != fleet_consumer:
            continue
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                found.append((f"{path.stem}: {panel['title']} [{target['refId']}]", target["expr"]))
        for variable in dashboard["templating"]["list"]:
            query = variable.get("query")
            if isinstance(query, str) and query.startswith("label_values("):
                # Grafana's label_values(selector, label) asks Prometheus for the selector's series.
                selector = query[len("label_values("):].rsplit(",", 1)[0]
                found.append((f"{path.stem}: variable {variable['name']}", selector))
    return found


def rule_expressions() -> list[tuple[str, str]]:
    """The sidecars' alert rules and the recording rules (alerts.yaml, rules.yaml)."""
    data = [yaml.safe_load((DASHBOARDS / name).read_text()) for name in ("alerts.yaml", "rules.yaml")]
    return [(rule.get("alert") or rule["record"], rule["expr"]) for rules in data for group in rules["groups"]
            for rule in group["rules"]]


def substitute(expr: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        expr = expr.replace(placeholder, value)
    assert not re.search(r"\$(?!\d)", expr), f"unsubstituted placeholder in {expr}"  # $1: label_replace's group
    return expr


@pytest.mark.long(seconds=36)
def test_generated_dashboards_are_committed() -> None:
    """Regenerating the dashboards reproduces the committed JSON byte for byte."""
    result = subprocess.run([sys.executable, str(DASHBOARDS / "generate.py"), "--check"], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_dashboards_are_import_ready() -> None:
    """Every panel and query uses the $datasource variable, every panel has an id, every query a refId."""
    for path in DASHBOARDS.glob("*.json"):
        dashboard = json.loads(path.read_text())
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert all(isinstance(i, int) and i > 0 for i in ids) and len(set(ids)) == len(ids), path.name
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            ref_ids = [t["refId"] for t in panel["targets"]]
            assert ref_ids and len(set(ref_ids)) == len(ref_ids) and all(ref_ids), panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


def test_every_expression_runs_on_prometheus_and_lights_up(simulator: SimulatorFactory,
                                                           sidecar: Callable[..., Sidecar], tmp_path: Path,
                                                           kube_state_metrics: StaticTarget) -> None:
    """Each dashboard and rule expression parses on Prometheus and returns data at one of the scenario's moments
    (on AKS, beside kube-state-metrics: a Scheduled-Events condition on the sidecar's node and on a node without
    one); every azure_scheduled_* metric they name is one the sidecar exposes."""
    sim, server = simulator("demo")
    # A sidecar that has watched for an hour (its state directory says so), so the demo's host failure pages.
    watched_for_an_hour(tmp_path / "state", server.url)
    process = sidecar("--imds-url", server.url, *WATCHED_FAST, "--state-dir", str(tmp_path / "state"),
                      "--forward-file", str(tmp_path / "docs.jsonl"),
                      "--spool-max-bytes", "12KiB", "--eventhub-send-timeout", "1", "--eventhub-retry-max", "0.3",
                      env={"SE_EXPORTER_EVENTHUB_CONNECTION_STRING":
                           f"Endpoint=sb://127.0.0.1:{free_port()};SharedAccessKeyName=k;SharedAccessKey=a2V5;"
                           "UseDevelopmentEmulator=true;EntityPath=hub"})
    # An exporter that is down, for the 'exporters down' panels and rule: a port held bound but not listening, so
    # that connecting is refused and nobody else (Prometheus' own free port, say) can take it meanwhile.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{held.getsockname()[1]}"
    kube_state_metrics.body = node_conditions({(NODE, "VMEventScheduled"): "true", (NODE, "Ready"): "true",
                                               (OTHER_NODE, "PreemptScheduled"): "true"})
    prom = Prometheus(process.base_url.removeprefix("http://"), tmp_path / "prometheus", extra_targets=[dead],
                      rule_file=DASHBOARDS / "alerts.yaml", **on_aks(kube_state_metrics))
    try:
        wait_until(lambda: prom.value('azure_scheduled_events_up') == 1, timeout=30, what="Prometheus scraping")
        wait_until(lambda: prom.query("kube_node_status_condition"), timeout=30, what="kube-state-metrics scraped")
        expressions = dashboard_expressions() + rule_expressions()
        lit: set[str] = set()
        exposed: set[str] = set()

        def checkpoint() -> None:
            incarnation = process.value("azure_scheduled_events_document_incarnation")
            wait_until(lambda: prom.value("azure_scheduled_events_document_incarnation") == incarnation, timeout=30,
                       what="Prometheus to see the latest document")
            for name, expr in expressions:
                if prom.query(substitute(expr)):  # query() fails the test if Prometheus refuses the expression
                    lit.add(name)
            status, text = http_get(process.metrics_url)
            assert status == 200
            exposed.update(name for (name, _labels) in parse_samples(text))

        sim.inject(Fault("throttle", status=429, count=3))
        step_through(sim, process, until=305)  # neighbour Reboot and host failure Started, Redeploy Scheduled
        checkpoint()
        step_through(sim, process, until=460)   # a 12 s Freeze Scheduled, rescheduled
        pause_process(process, 0.5)  # felt during the listed Redeploy (the most impactful): the pause panels
        wait_until(lambda: prom.value("max(azure_scheduled_event_longest_pause_seconds)"), timeout=30,
                   what="Prometheus to see the pause of a listed event")
        checkpoint()
        step_through(sim, process, until=592)  # nothing listed: pauses are unannounced (the detector still armed)
        pause_process(process, 0.5)  # one within unannouncedPauseSeconds, scraped before the next one
        wait_until(lambda: prom.value('azure_scheduled_events_pause_seconds_count{event_type="none"}'), timeout=30,
                   what="Prometheus to see an unannounced pause")
        pause_process(process, 6.0)  # and one past it: SeExporterUnannouncedPause
        wait_until(lambda: prom.value('azure_scheduled_events_pause_seconds_count{event_type="none"}') == 2,
                   timeout=30, what="Prometheus to see the long unannounced pause")
        checkpoint()
        sim.inject(Fault("status", status=503, count=0))
        wait_until(lambda: prom.value("azure_scheduled_events_up") == 0, timeout=30, what="IMDS failing")
        checkpoint()
        dark = {name for name, _ in expressions} - lit - set(NEEDS_MINUTES)
        assert not dark, f"expressions that never returned data: {sorted(dark)}"

        for name, expr in expressions:
            for metric in re.findall(r"\b(azure_scheduled_events?_[a-z_]+)", expr):
                assert metric in exposed, f"{name}: {metric} is not exposed by the sidecar"
    finally:
        prom.stop()
        held.close()



def test_node_conditions_meet_the_vms_events_on_the_node_label(simulator: SimulatorFactory,
                                                                sidecar: Callable[..., Sidecar], tmp_path: Path,
                                                                kube_state_metrics: StaticTarget) -> None:
    """Scraped through the PodMonitor's relabelling, the sidecar's series carry its Kubernetes node, and that label
    joins them to kube-state-metrics: the VM panel is empty (not an error) without node conditions, then shows its
    own node's and no other's; the NPD rule's expression stays silent for the node whose se-exporter lists the
    event, speaks for a node without one, and for ours once the event is gone while NPD still says True."""
    vm = json.loads((DASHBOARDS / "se-exporter-vm.json").read_text())
    (panel,) = [p for p in vm["panels"] if p["title"] == NODE_PANEL]
    panel_expr = substitute(panel["targets"][0]["expr"])
    rule_expr = dict(rule_expressions())[NPD_RULE]
    sim, server = simulator("live-migration")
    process = sidecar("--imds-url", server.url, *FAST)
    prom = Prometheus(process.base_url.removeprefix("http://"), tmp_path / "prometheus", **on_aks(kube_state_metrics))
    try:
        wait_until(lambda: prom.value(f'azure_scheduled_events_up{{node="{NODE}"}}') == 1, timeout=30,
                   what="the sidecar's series with its node label")
        wait_until(lambda: prom.value('up{job="kube-state-metrics"}') == 1, timeout=30, what="kube-state-metrics up")
        assert prom.query(panel_expr) == [] and prom.query(rule_expr) == []  # no conditions: empty, no error
        assert panel["fieldConfig"]["defaults"]["noValue"].startswith("No AKS node conditions")

        sim.advance(10)  # the Freeze of WestNO_0 and WestNO_1 is Scheduled
        wait_until(lambda: prom.query("azure_scheduled_event_info"), timeout=30, what="the Freeze in Prometheus")
        kube_state_metrics.body = node_conditions({(NODE, "VMEventScheduled"): "true", (NODE, "Ready"): "true",
                                                   (OTHER_NODE, "VMEventScheduled"): "true"})
        wait_until(lambda: len(prom.query("kube_node_status_condition")) == 9, timeout=30,
                   what="the node conditions in Prometheus")
        shown = prom.query(panel_expr)
        assert [(s["metric"], s["value"][1]) for s in shown] == [  # type: ignore[index]
            ({"node": NODE, "condition": "VMEventScheduled"}, "1")]
        assert {s["metric"]["node"] for s in prom.query(rule_expr)} == {OTHER_NODE}  # type: ignore[index]

        sim.advance(1000)  # started and gone from IMDS; NPD has not looked again yet
        wait_until(lambda: prom.query("azure_scheduled_event_info") == [], timeout=30, what="the Freeze to go")
        assert {s["metric"]["node"] for s in prom.query(rule_expr)} == {NODE, OTHER_NODE}  # type: ignore[index]
        assert prom.query(panel_expr)  # the panel still shows NPD's view beside ours
    finally:
        prom.stop()


def test_readme_inhibition_recipe_mutes_the_node_alert_of_the_same_node_only(tmp_path: Path) -> None:
    """The README's Alertmanager recipe, loaded into a real Alertmanager: while se-exporter's alert fires for a node,
    the user's node-condition alert for that node is suppressed, and the same alert for another node is not."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.fail("alertmanager not found: `make test` installs Debian's prometheus-alertmanager package")
    readme = (DASHBOARDS.parent / "README.md").read_text()
    (recipe,) = [block for block in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "inhibit_rules" in block]
    config = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}], **yaml.safe_load(recipe)}
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    with (tmp_path / "alertmanager.log").open("wb") as log:
        process = subprocess.Popen([binary, f"--config.file={tmp_path / 'alertmanager.yml'}",
                                    f"--storage.path={tmp_path / 'data'}", f"--web.listen-address={url[7:]}",
                                    "--cluster.listen-address=", "--log.level=warn"], stdout=log, stderr=log)
    attach(f"Alertmanager (pid {process.pid})", tmp_path / "alertmanager.log", lambda: process.poll() is None)
    try:
        wait_until(lambda: http_get(f"{url}/-/ready")[0] == 200, timeout=30, what="Alertmanager ready")
        alerts = [{"labels": {"alertname": "SeExporterImpactfulEventScheduled", "node": NODE, "event_type": "Reboot"}},
                  {"labels": {"alertname": "NodeVMEventScheduled", "node": NODE}},
                  {"labels": {"alertname": "NodeVMEventScheduled", "node": OTHER_NODE}}]
        request = urllib.request.Request(f"{url}/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200

        def states() -> dict[tuple[str, str], str]:
            status, body = http_get(f"{url}/api/v2/alerts")
            assert status == 200, body
            return {(a["labels"]["alertname"], a["labels"]["node"]): a["status"]["state"] for a in json.loads(body)}

        # The inhibitor learns of source alerts asynchronously: wait for the suppression, then check all three.
        wait_until(lambda: states().get(("NodeVMEventScheduled", NODE)) == "suppressed", timeout=30,
                   what="the same node's alert to be inhibited")
        assert states() == {("SeExporterImpactfulEventScheduled", NODE): "active",
                            ("NodeVMEventScheduled", NODE): "suppressed",
                            ("NodeVMEventScheduled", OTHER_NODE): "active"}
    finally:
        stop_process(process)
