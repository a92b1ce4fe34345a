"""The generated dashboards type-check against Grafana's published schema types (@grafana/schema, tsc); their
variables are all used, their links all open a shipped dashboard."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

ROOT = Path(__file__).parent.parent.parent
TOOLS = Path(__file__).parent.parent / "grafana_schema"
HEADER = """import type { Dashboard, VariableModel } from "@grafana/schema";
// The SDK writes the interval-variable fields auto, auto_count and auto_min on every variable.
type SdkVariable = VariableModel & { auto?: boolean; auto_count?: number; auto_min?: string };
type SdkDashboard = Omit<Dashboard, "templating"> & { templating?: { list?: SdkVariable[] } };
"""


@pytest.mark.integration  # needs tests/grafana_schema/node_modules, which make test installs and make unit does not
def test_dashboards_match_grafana_schema_types(tmp_path: Path) -> None:
    """`const d: Dashboard = <generated JSON>` compiles with tsc --noEmit (only the SDK's auto* fields allowed)."""
    tsc = TOOLS / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        pytest.fail("tests/grafana_schema/node_modules is missing: `make test` runs npm ci there")
    files = sorted((ROOT / "dashboards").glob("*.json"))
    assert files
    body = "".join(f"export const dashboard{i}: SdkDashboard = {path.read_text()};\n" for i, path in enumerate(files))
    (tmp_path / "dashboards.gen.ts").write_text(HEADER + body)
    shutil.copy(TOOLS / "tsconfig.json", tmp_path / "tsconfig.json")
    (tmp_path / "node_modules").symlink_to(TOOLS / "node_modules")
    result = subprocess.run([str(tsc), "-p", str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


DASHBOARDS = {path.name: json.loads(path.read_text()) for path in sorted((ROOT / "dashboards").glob("*.json"))}
BY_UID = {dashboard["uid"]: dashboard for dashboard in DASHBOARDS.values()}
# Where the VMs run and their names, on the dashboards of the sidecars' series; the fleet consumer's documents say
# nothing of clusters or nodes.
FINDERS = {"se-exporter-vm.json": {"cluster", "location", "vmss_name", "node", "vm_name"},
           "se-exporter-fleet.json": {"cluster", "location", "vmss_name", "node", "vm_name"},
           "se-exporter-fleet-events.json": {"location", "vmss_name", "vm_name"}}


def texts(dashboard: dict[str, Any]) -> list[str]:
    """Every query and variable query of a dashboard (where a variable may be used)."""
    found = [str(v.get("query", "")) for v in dashboard["templating"]["list"]]
    for panel in dashboard["panels"]:
        found += [target["expr"] for target in panel.get("targets", [])]
    return found


def links(dashboard: dict[str, Any]) -> list[str]:
    """The URLs of every data link, in field defaults and in overrides."""
    found = []
    for panel in dashboard["panels"]:
        config = panel.get("fieldConfig", {})
        found += [link["url"] for link in config.get("defaults", {}).get("links", [])]
        for override in config.get("overrides", []):
            for prop in override["properties"]:
                if prop["id"] == "links":
                    found += [link["url"] for link in prop["value"]]
    return found


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_vms_are_found_by_name_and_place(name: str) -> None:
    """The dashboards have variables for where a VM runs and what it is called, not only its address."""
    variables = {v["name"] for v in DASHBOARDS[name]["templating"]["list"]}
    assert FINDERS[name] <= variables, FINDERS[name] - variables


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_fleet_views_repeat_no_panel_per_vm(name: str) -> None:
    """A panel repeated per VM is unreadable at a few thousand VMs: tables and aggregates instead."""
    assert not [panel["title"] for panel in DASHBOARDS[name]["panels"] if panel.get("repeat")]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_variable_is_used(name: str) -> None:
    """A variable no query reads would filter nothing while looking as if it did."""
    dashboard = DASHBOARDS[name]
    used = " ".join(texts(dashboard))
    for variable in dashboard["templating"]["list"]:
        if variable["name"] == "datasource":
            continue
        assert re.search(rf"\$\{{?{variable['name']}\b", used), variable["name"]


def test_every_link_resolves_to_a_shipped_dashboard_and_its_variables() -> None:
    """Drill-downs from the fleet tables and the alerts' dashboard_url open a dashboard shipped here, setting only
    variables it has; every table of VM names links to the VM dashboard."""
    found = [url for dashboard in DASHBOARDS.values() for url in links(dashboard)]
    rules = [yaml.safe_load((ROOT / "dashboards" / f).read_text()) for f in ("alerts.yaml", "fleet-alerts.yaml")]
    found += [rule["annotations"]["dashboard_url"] for data in rules for group in data["groups"]
              for rule in group["rules"]]
    assert found
    for url in found:
        parsed = urlparse(url)
        uid = parsed.path.split("/d/")[1].strip("/")
        assert uid in BY_UID, url
        names = {v["name"] for v in BY_UID[uid]["templating"]["list"]}
        for key in parse_qs(parsed.query):
            assert key.removeprefix("var-") in names, url
    for name in ("se-exporter-fleet.json", "se-exporter-fleet-events.json"):
        for panel in DASHBOARDS[name]["panels"]:
            if panel["type"] == "table" and "vm_name" in " ".join(t["expr"] for t in panel["targets"]):
                assert any("/d/se-exporter-vm?" in url for url in links({"panels": [panel]})), panel["title"]


def test_the_first_fleet_panel_answers_what_happens_where_and_when() -> None:
    """The fleet dashboard opens on every VM's own events with the VM's name and the seconds left, soonest first."""
    first = DASHBOARDS["se-exporter-fleet.json"]["panels"][0]
    expr = first["targets"][0]["expr"]
    assert first["type"] == "table" and first["title"].startswith("What is about to happen where")
    assert expr.startswith("sort(") and "vm_name" in expr and "seconds_until_not_before" in expr
    assert 'affects_this_vm!="false"' in expr
