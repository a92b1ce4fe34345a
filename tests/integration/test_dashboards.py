"""Dashboards and alert rules against the real thing: every expression runs on a real Prometheus that scrapes a
real sidecar driven through the demo scenario, and returns data where the scenario lights it up."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from se_exporter.simulator.faults import Fault
from tests.conftest import SimulatorFactory
from tests.helpers import Sidecar, free_port, http_get, parse_samples, step_through, wait_until
from tests.integration.test_prometheus import Prometheus

pytestmark = pytest.mark.integration
DASHBOARDS = Path(__file__).parent.parent.parent / "dashboards"
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")
# Grafana's placeholders, as Grafana would fill them for a scrape interval of 1 s.
PLACEHOLDERS = {"$__rate_interval": "10s", "$__interval": "1s", "$__range": "10m", "$job": ".*", "$instance": ".*"}
# Expressions that cannot light up within a test's minutes, and why; promtool's unit tests cover them.
NEEDS_MINUTES = {"SeExporterStale": "needs five minutes without a valid document"}


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
    data = yaml.safe_load((DASHBOARDS / "alerts.yaml").read_text())
    return [(rule["alert"], rule["expr"]) for group in data["groups"] for rule in group["rules"]]


def substitute(expr: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        expr = expr.replace(placeholder, value)
    assert "$" not in expr, f"unsubstituted placeholder in {expr}"
    return expr


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
                                                           sidecar: Callable[..., Sidecar], tmp_path: Path) -> None:
    """Each dashboard and rule expression parses on Prometheus and returns data at one of the scenario's moments;
    every metric they name is one the sidecar exposes."""
    sim, server = simulator("demo")
    process = sidecar("--imds-url", server.url, *FAST, "--forward-file", str(tmp_path / "docs.jsonl"),
                      "--spool-max-bytes", "12KiB", "--eventhub-send-timeout", "1", "--eventhub-retry-max", "0.3",
                      env={"SE_EXPORTER_EVENTHUB_CONNECTION_STRING":
                           f"Endpoint=sb://127.0.0.1:{free_port()};SharedAccessKeyName=k;SharedAccessKey=a2V5;"
                           "UseDevelopmentEmulator=true;EntityPath=hub"})
    dead = f"127.0.0.1:{free_port()}"  # an exporter that is down, for the 'exporters down' panels and rule
    prom = Prometheus(process.base_url.removeprefix("http://"), tmp_path / "prometheus", extra_targets=[dead],
                      rule_file=DASHBOARDS / "alerts.yaml")
    try:
        wait_until(lambda: prom.value('azure_scheduled_events_up') == 1, timeout=30, what="Prometheus scraping")
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

