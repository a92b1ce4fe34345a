"""The monitoring mixin: the real jsonnet renders exactly the shipped rule files, PrometheusRule, Azure rule groups
and dashboards; every alert follows one naming scheme, names its machine and links to a runbook section and a
dashboard that exist; its _config really moves the thresholds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from tests.project.test_doc_links import anchors
from tests.support import promtool

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


ARM_TOKEN = re.compile(r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<number>-?\d+)|(?P<name>\w+)|(?P<punct>[(),]))")


def arm(value: Any, parameters: dict[str, Any]) -> Any:
    """What Azure Resource Manager makes of a template value, for the functions the template uses (concat, string,
    parameters, union, json, createObject, not, contains): an independent reading of the generated expressions."""
    if isinstance(value, dict):
        return {key: arm(item, parameters) for key, item in value.items()}
    if isinstance(value, list):
        return [arm(item, parameters) for item in value]
    if not isinstance(value, str) or not value.startswith("["):
        return value
    if value.startswith("[["):
        return value[1:]
    assert value.endswith("]"), value
    tokens = [m for m in ARM_TOKEN.finditer(value[1:-1]) if m.group(0).strip()]
    assert "".join(m.group(0) for m in tokens).strip() == value[1:-1].strip(), value
    at = 0

    def call() -> Any:
        nonlocal at
        token = tokens[at]
        at += 1
        if token.group("string") is not None:
            return token.group("string")[1:-1].replace("''", "'")
        if token.group("number") is not None:
            return int(token.group("number"))
        name = token.group("name")
        assert tokens[at].group("punct") == "(", value
        at += 1
        args = []
        while tokens[at].group("punct") != ")":
            args.append(call())
            if tokens[at].group("punct") == ",":
                at += 1
        at += 1
        functions = {"concat": lambda *a: "".join(a), "string": str, "parameters": lambda n: parameters[n],
                     "union": lambda *a: {k: v for o in a for k, v in o.items()}, "json": json.loads,
                     "createObject": lambda *a: dict(zip(a[::2], a[1::2], strict=True)), "not": lambda a: not a,
                     "contains": lambda a, b: b in a}
        return functions[name](*args)

    result = call()
    assert at == len(tokens), value
    return result


def deployed(template: dict[str, Any], **given: Any) -> dict[str, Any]:
    """The template's resources as deployed with ``given`` parameters (the others at their defaults)."""
    parameters = {name: spec["defaultValue"] for name, spec in template["parameters"].items()
                  if "defaultValue" in spec
                  and not (isinstance(spec["defaultValue"], str) and spec["defaultValue"].startswith("["))}
    parameters |= {"criticalActionGroupId": "/ag/oncall", "warningActionGroupId": "/ag/queue", **given}
    parameters.setdefault("infoActionGroupId", parameters["warningActionGroupId"])
    return {resource["name"]: arm(resource["properties"]["rules"], parameters) for resource in template["resources"]}


def assert_same_rules(rules: dict[str, Any], rendered: dict[str, Any], extra_labels: dict[str, str],
                      disabled: set[str]) -> None:
    groups = rendered["alerts"]["groups"] + rendered["rules"]["groups"]
    assert list(rules) == [g["name"] for g in groups]
    groups_to = {"critical": "/ag/oncall", "warning": "/ag/queue", "info": "/ag/queue"}
    for group in groups:
        for azure, rule in zip(rules[group["name"]], group["rules"], strict=True):
            assert azure["expression"] == rule["expr"]
            assert azure.get("alert") == rule.get("alert") and azure.get("record") == rule.get("record")
            if "alert" not in rule:
                continue
            severity = rule["labels"]["severity"]
            assert azure["severity"] == {"critical": 0, "warning": 2, "info": 3}[severity]
            assert azure["labels"] == {**extra_labels, **rule["labels"]}
            assert azure["annotations"] == rule["annotations"]
            assert azure["actions"] == [{"actionGroupId": groups_to[severity]}], rule["alert"]
            assert azure["enabled"] is (rule["alert"] not in disabled)
            if "for" in rule:
                assert azure["for"] == "PT" + rule["for"][:-1] + rule["for"][-1].upper()


def test_azure_rule_groups_carry_the_same_rules() -> None:
    """Deployed with its defaults, the ARM template's rules are the mixin's: same names, expressions, labels and
    annotations, `for` in ISO 8601, severity 0-4, and pages to the critical action group, warnings to the warning
    one."""
    template = json.loads((ROOT / "deploy" / "azure-monitor" / "prometheus-rule-groups.json").read_text())
    assert_same_rules(deployed(template), generate.mixin(), {}, set())


def test_azure_parameters_are_the_mixins_settings() -> None:
    """The template's parameters set what _config sets: deployed with a paging window, a Freeze threshold and links
    of one's own, its rules are the mixin's rendered with the same _config; extra labels reach every alert (its own
    severity wins) and a disabled alert is deployed disabled."""
    template = json.loads(generate.azure_rule_groups())
    settings = {"impactfulPageSeconds": 1800, "longFreezeSeconds": 15, "hostFailureWatchedSeconds": 120,
                "manyVms": 20, "runbookUrl": "https://wiki.corp/se-exporter", "grafanaUrl": "https://g.corp"}
    rules = deployed(template, **settings, additionalRuleLabels={"team": "web", "severity": "none"},
                     disabledAlerts=["SeExporterDown"])
    assert_same_rules(rules, generate.mixin(json.dumps(settings)), {"team": "web"}, {"SeExporterDown"})


def test_azure_rule_groups_render_with_ones_own_config(capsys: pytest.CaptureFixture[str]) -> None:
    """`generate.py --azure-config` renders the template with one's own _config (what is no parameter: which types
    and sources page, Spot), and refuses a _config the mixin refuses with one line."""
    assert generate.main(["--azure-config", "{ pageSpotPreempt: true, pageSources: ['Platform', 'User'] }"]) == 0
    template = json.loads(capsys.readouterr().out)
    rules = deployed(template)
    rendered = generate.mixin("{ pageSpotPreempt: true, pageSources: ['Platform', 'User'] }")
    assert_same_rules(rules, rendered, {}, set())
    imminent = next(r for r in rules["se-exporter"] if r.get("alert") == "SeExporterImpactfulEventImminent")
    assert 'event_type=~"Reboot|Redeploy|Terminate|Preempt", event_source=~"Platform|User"' in imminent["expression"]
    with pytest.raises(SystemExit):
        generate.main(["--azure-config", "{ impactfulPageSeconds: -900 }"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("_config.impactfulPageSeconds: -900 is negative"), error


# A _config the mixin must refuse, and the one line it says.
BAD_CONFIGS = [
    ("{ impactfulPageSeconds: -1 }", "_config.impactfulPageSeconds: -1 is negative"),
    ("{ longFreezeSeconds: '9' }", '_config.longFreezeSeconds: "9" is not a number of seconds'),
    ("{ hostFailureWatchedSeconds: -60 }", "_config.hostFailureWatchedSeconds: -60 is negative"),
    ("{ pageTypes: ['Reboot', 'Preempt'] }", '_config.pageTypes: "Preempt" is not one of Reboot, Redeploy, Terminate'),
    ("{ pageTypes: 'Reboot' }", '_config.pageTypes: "Reboot" is not a list'),
    ("{ warnTypes: ['Reboot', 'Freeze'] }", '_config.warnTypes: "Freeze" is not one of Reboot, Redeploy, Preempt, '
                                            "Terminate"),
    ("{ pageSources: ['platform'] }", '_config.pageSources: "platform" is not one of Platform, User, unknown'),
    ("{ pageSpotPreempt: 'yes' }", '_config.pageSpotPreempt: "yes" is not true or false'),
    ("{ manyVms: 2.5 }", "_config.manyVms: 2.5 is not a whole number of VMs"),
    ("{ vmInfoLookback: '1 hour' }", '_config.vmInfoLookback: "1 hour" is not a duration (5m, 1h)'),
    ("{ alertOverrides: { SeExporterHostFailur: { severity: 'warning' } } }",
     '_config.alertOverrides: "SeExporterHostFailur" names no alert of the mixin'),
    ("{ alertOverrides: { SeExporterHostFailure: { severity: 'page' } } }",
     '_config.alertOverrides.SeExporterHostFailure.severity: "page" is not one of critical, warning, info'),
    ("{ alertOverrides: { SeExporterDown: { 'for': '-2m' } } }",
     '_config.alertOverrides.SeExporterDown.for: "-2m" is not a duration (5m, 1h)'),
    ("{ alertOverrides: { SeExporterDown: { severty: 'info' } } }",
     '_config.alertOverrides.SeExporterDown: "severty" is not severity or for'),
]


@pytest.mark.parametrize(("config", "message"), BAD_CONFIGS, ids=[config for config, _ in BAD_CONFIGS])
def test_the_mixin_refuses_a_config_that_would_render_an_invalid_rule(config: str, message: str) -> None:
    """A negative window, an unknown type, source or severity, a misspelt alert name: rendering stops with one line
    naming the key and the value, and no rule is rendered."""
    with pytest.raises(RuntimeError) as refused:
        generate.mixin(config)
    assert str(refused.value).splitlines()[0] == f"RUNTIME ERROR: {message}", str(refused.value)


def test_alert_overrides_change_severity_and_for() -> None:
    """_config.alertOverrides sets an alert's severity and `for`, and nothing else of it or of any other alert."""
    plain = {str(r["alert"]): r for r in alerts()}
    overridden = generate.mixin("{ alertOverrides: { SeExporterLongFreeze: { severity: 'critical', 'for': '1m' } } }")
    changed = {r["alert"]: r for g in overridden["alerts"]["groups"] for r in g["rules"]}
    assert changed["SeExporterLongFreeze"] == {**plain["SeExporterLongFreeze"], "for": "1m",
                                               "labels": {"severity": "critical"}}
    assert {k: v for k, v in changed.items() if k != "SeExporterLongFreeze"} == \
        {k: v for k, v in plain.items() if k != "SeExporterLongFreeze"}


def test_promtool_accepts_the_recording_rules() -> None:
    """rules.yaml (the mixin's prometheusRules) passes promtool check rules."""
    promtool.check_rules(ROOT / "dashboards" / "rules.yaml")
    assert yaml.safe_load((ROOT / "dashboards" / "rules.yaml").read_text())["groups"][0]["rules"]
