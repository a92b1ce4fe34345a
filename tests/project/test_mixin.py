"""The monitoring mixin: the real jsonnet renders exactly the shipped rule files, PrometheusRule, Azure rule groups
and dashboards; every alert follows one naming scheme, names its machine and links to a runbook section and a
dashboard that exist; its _config really moves the thresholds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tests import promtool
from tests.project.test_doc_links import anchors

ROOT = Path(__file__).parent.parent.parent
sys.path.insert(0, str(ROOT / "dashboards"))
import generate  # noqa: E402  (dashboards/ is not a package: the generator is a script)

DASHBOARDS = {json.loads(path.read_text())["uid"] for path in (ROOT / "dashboards").glob("*.json")}
OLD_NAMES = ("AzureImpactfulMaintenanceScheduled", "AzureLongFreezeScheduled", "AzureMaintenanceStarted",
             "AzureHostFailure", "AksScheduledEventNotSeenBySeExporter", "FleetImpactfulMaintenanceOnManyVms",
             "FleetSidecarMissedImpactfulEvent", "FleetSidecarMissedFreeze", "FleetAnnouncedEventOnVmsWithoutSidecar",
             "FleetVmsWentSilent", "FleetConsumerLagging", "FleetPartitionsUnowned", "FleetCheckpointsStale",
             "FleetInvalidMessages", "FleetVmsCannotReadImds", "FleetConsumerDown")


def alerts() -> list[dict[str, object]]:
    return [rule for group in generate.mixin()["alerts"]["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("name", sorted(generate.OUTPUTS))
def test_the_shipped_files_are_what_the_mixin_and_the_generator_render(name: str) -> None:
    """Byte for byte: edit the mixin (or the dashboards' generator), then `make dashboards`."""
    assert (ROOT / "dashboards" / name).read_text() == generate.OUTPUTS[name](), name


@pytest.mark.parametrize("name", ["se-exporter-vm.json", "se-exporter-fleet.json", "se-exporter-fleet-events.json"])
def test_the_mixins_dashboards_are_the_shipped_files(name: str) -> None:
    """grafanaDashboards, as jsonnet renders them, are the files in dashboards/ byte for byte."""
    assert generate.mixin_dashboard(name) == (ROOT / "dashboards" / name).read_text()


def test_the_jsonnet_command_line_renders_the_same_alerts() -> None:
    """A kube-prometheus user's jsonnet (the binding's, here) sees the same prometheusAlerts as the generator."""
    script = ("import _jsonnet, sys; sys.stdout.write(_jsonnet.evaluate_snippet('m', "
              "\"(import 'mixin.libsonnet').prometheusAlerts\", jpathdir=['mixin']))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=True)
    assert json.loads(out.stdout) == generate.mixin()["alerts"]


def test_one_prefix_severity_machine_runbook_and_dashboard_on_every_alert() -> None:
    """Every alert is SeExporter*, warns or pages, and links to a runbook heading of docs/operations.md and a shipped
    dashboard; every sidecar alert names the VM (vm_name in its summary)."""
    headings = anchors(ROOT / "docs" / "operations.md")
    for rule in alerts():
        name, annotations = str(rule["alert"]), rule["annotations"]
        assert isinstance(annotations, dict)
        assert name.startswith("SeExporter"), name
        assert rule["labels"] in ({"severity": "critical"}, {"severity": "warning"}, {"severity": "info"}), name
        url = urlparse(annotations["runbook_url"])
        assert url.path.endswith("/operations.md") and url.fragment in headings, (name, url.fragment)
        dashboard = urlparse(annotations["dashboard_url"]).path.split("/d/")[1]
        assert dashboard in DASHBOARDS, (name, dashboard)
        if "vm_info" in str(rule["expr"]):
            assert "{{ $labels.vm_name }}" in annotations["summary"], name


def test_every_renamed_alert_is_in_the_documented_mapping() -> None:
    """Users who route or silence on an old name find its new one in docs/alerting.md."""
    doc = (ROOT / "docs" / "alerting.md").read_text()
    current = {str(rule["alert"]) for rule in alerts()}
    for old in OLD_NAMES:
        row = re.search(rf"^\| `{old}` \| (.+) \|$", doc, re.MULTILINE)
        assert row, old
        assert set(re.findall(r"`(\w+)`", row.group(1))) <= current and re.search(r"`SeExporter", row.group(1)), old


def test_config_overrides_move_the_thresholds() -> None:
    """_config is the one place for thresholds: an override reaches the rendered expressions."""
    overridden = generate.mixin("{ impactfulPageSeconds: 1800, longFreezeSeconds: 15, manyVms: 20 }")
    exprs = " ".join(str(rule["expr"]) for group in overridden["alerts"]["groups"] for rule in group["rules"])
    assert "<= 1800" in exprs and "> 15)" in exprs and ") > 20" in exprs
    assert "<= 900" not in exprs


def test_azure_rule_groups_carry_the_same_rules() -> None:
    """The ARM template's rules are the mixin's: same names and expressions, `for` in ISO 8601, severity 0-4."""
    template = json.loads((ROOT / "deploy" / "azure-monitor" / "prometheus-rule-groups.json").read_text())
    rendered = generate.mixin()
    groups = rendered["alerts"]["groups"] + rendered["rules"]["groups"]
    assert [r["name"] for r in template["resources"]] == [g["name"] for g in groups]
    for resource, group in zip(template["resources"], groups, strict=True):
        assert resource["type"] == "Microsoft.AlertsManagement/prometheusRuleGroups"
        for azure, rule in zip(resource["properties"]["rules"], group["rules"], strict=True):
            assert azure["expression"] == rule["expr"]
            assert azure.get("alert") == rule.get("alert") and azure.get("record") == rule.get("record")
            if "alert" in rule:
                assert azure["severity"] in (0, 2, 3) and azure["annotations"] == rule["annotations"]
                if "for" in rule:
                    assert azure["for"] == "PT" + rule["for"][:-1] + rule["for"][-1].upper()
            assert not any(isinstance(v, str) and v.startswith("[") for v in azure.values())  # no ARM expression


def test_promtool_accepts_the_recording_rules() -> None:
    """rules.yaml (the mixin's prometheusRules) passes promtool check rules."""
    promtool.check_rules(ROOT / "dashboards" / "rules.yaml")
    assert yaml.safe_load((ROOT / "dashboards" / "rules.yaml").read_text())["groups"][0]["rules"]
