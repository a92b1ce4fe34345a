"""The chart's PrometheusRules tuned from values (issue 43), with the real helm and the real jsonnet: every value
of dashboards/chart_rules.py's CHART_VALUES reaches every rule exactly as the mixin renders the same _config, the
defaults render the mixin's own rules (no drift), `disabled`, `customRules` and `additionalRuleLabels` reach every
alert, promtool accepts a tuned render, and a misspelt alert name, a negative window, an unknown severity or a value
that would change a query stops `helm template` with one line naming it, by the schema and (the schema skipped) by
the template. The generator's own refusals are tested on a small stand-in mixin."""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import promtool
from tests.support.kube_schemas import CHART, KUBERNETES_VERSIONS, VALUE_SETS, HelmFailed, errors, render, run_helm

ROOT = Path(__file__).parent.parent.parent
sys.path.insert(0, str(ROOT / "dashboards"))
import chart_rules  # noqa: E402  (dashboards/ is not a package: the generator is a script)
import generate  # noqa: E402

FLEET = yaml.safe_load((CHART / "ci" / "fleet-values.yaml").read_text())
assert CHART / "ci" / "fleet-values.yaml" in VALUE_SETS
# What the tests set besides the CHART_VALUES examples: a label with a newline, quotes and YAML that would add keys
# if it were written unquoted (test_chart_quoting's payload), two overrides and two alerts left out.
PAYLOAD = "x\"'\n---\ninjected: 1\n  injected: 1\n#"
EXTRA = {"additionalRuleLabels": {"team": "platform", "note": PAYLOAD},
         "customRules": {"SeExporterDown": {"severity": "critical", "for": "7m"},
                         "SeExporterHostFailure": {"severity": "warning"}},
         "disabled": {"SeExporterStale": True, "SeExporterFleetVmsWentSilent": True, "SeExporterImdsFailing": False}}


def tuned() -> dict[str, Any]:
    """prometheusRule with every CHART_VALUES entry at its example, and EXTRA."""
    values: dict[str, Any] = copy.deepcopy(EXTRA)
    for value in chart_rules.CHART_VALUES:
        *heads, name = value.path.split(".")
        node = values
        for head in heads:
            node = node.setdefault(head, {})
        node[name] = value.example
    return values


def rule_objects(tmp_path: Path, rule_values: dict[str, Any], *, schema: bool = True) -> list[dict[str, Any]]:
    """The PrometheusRules helm renders for the fleet value set with ``rule_values`` under prometheusRule."""
    values = {**FLEET, "prometheusRule": rule_values}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    args = ["template", "se-exporter", "--namespace", "monitoring", "--values", str(path),
            "--show-only", "templates/prometheusrule.yaml"]
    text = run_helm(args + ([] if schema else ["--skip-schema-validation"]))
    return [d for d in yaml.safe_load_all(text) if d]


def render_rules(tmp_path: Path, rule_values: dict[str, Any], *, schema: bool = True) -> dict[str, list[Any]]:
    """The PrometheusRules' groups by object name."""
    return {d["metadata"]["name"]: d["spec"]["groups"] for d in rule_objects(tmp_path, rule_values, schema=schema)}


def expected(rule_values: dict[str, Any]) -> dict[str, list[Any]]:
    """What the chart must render, from the mixin itself: rendered by jsonnet with the same _config, then the
    documented meaning of disabled, customRules and additionalRuleLabels applied (an alert's own labels win)."""
    config = {}
    for value in chart_rules.CHART_VALUES:
        node: Any = rule_values
        for key in value.path.split("."):
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if node != {}:
            config[value.key] = node
    rendered = generate.mixin(json.dumps(config))
    groups = {g["name"]: g for kind in ("alerts", "rules") for g in rendered[kind]["groups"]}
    out: dict[str, list[Any]] = {}
    for owner, names in (("se-exporter", generate.CHART_GROUPS["node"]),
                         ("se-exporter-fleet", generate.CHART_GROUPS["fleet"])):
        out[owner] = []
        for name in names:
            rules = []
            for own in groups[name]["rules"]:
                alert = own.get("alert")
                if alert and rule_values.get("disabled", {}).get(alert):
                    continue
                rule = copy.deepcopy(own)
                if alert:
                    custom = rule_values.get("customRules", {}).get(alert, {})
                    rule["labels"] = {**rule_values.get("additionalRuleLabels", {}), **rule["labels"]}
                    if "severity" in custom:
                        rule["labels"]["severity"] = custom["severity"]
                    if "for" in custom:
                        rule["for"] = custom["for"]
                rules.append(rule)
            out[owner].append({"name": name, "rules": rules})
    return out


def test_the_defaults_render_the_mixins_own_rules(tmp_path: Path) -> None:
    """No second copy to drift: the default values render exactly what jsonnet renders from the mixin."""
    assert render_rules(tmp_path, {}) == expected({})


def test_the_examples_differ_from_the_defaults_and_cover_every_chart_value() -> None:
    """Each CHART_VALUES example is a change (else rendering it proves nothing) and passes its own pattern."""
    defaults = generate.mixin()["config"]
    for value in chart_rules.CHART_VALUES:
        assert value.example != defaults[value.key], value.key
        assert value.kind != "string" or re.search(value.pattern, str(value.example)), value.key


def test_every_value_reaches_every_rule(tmp_path: Path) -> None:
    """Every CHART_VALUES value at its example, extra labels, overrides and disabled alerts: the chart renders what
    the mixin renders with that _config, and each value is visibly where it should be."""
    values = tuned()
    got = render_rules(tmp_path, values)
    assert got == expected(values)
    alerts = [rule for groups in got.values() for group in groups for rule in group["rules"] if "alert" in rule]
    names = {rule["alert"] for rule in alerts}
    assert "SeExporterStale" not in names and "SeExporterFleetVmsWentSilent" not in names
    assert "SeExporterImdsFailing" in names
    for rule in alerts:
        assert rule["labels"]["team"] == "platform" and rule["labels"]["note"] == PAYLOAD, rule["alert"]
        assert rule["annotations"]["runbook_url"] == (
            f"{values['runbookUrl']}#{rule['alert'].lower()}"), rule["alert"]
        assert rule["annotations"]["dashboard_url"].startswith(values["grafanaUrl"] + "/d/"), rule["alert"]
    by_name = {rule["alert"]: rule for rule in alerts}
    assert by_name["SeExporterDown"]["for"] == "7m"
    assert by_name["SeExporterDown"]["labels"]["severity"] == "critical"
    assert by_name["SeExporterHostFailure"]["labels"]["severity"] == "warning"
    assert "<= 1800)" in by_name["SeExporterImpactfulEventScheduled"]["expr"]
    assert 'event_type=~"Reboot|Redeploy|Preempt", event_source=~"Platform|unknown"' in by_name[
        "SeExporterImpactfulEventImminent"]["expr"]
    assert "> 12.5)" in by_name["SeExporterLongFreeze"]["expr"]
    assert "> 20" in by_name["SeExporterFleetImpactfulMaintenanceOnManyVms"]["expr"]


def test_set_on_the_command_line_reaches_the_rules() -> None:
    """`--set` gives helm whole numbers as integers (a values file gives floats): they reach the rules too."""
    found = render(CHART / "ci" / "default-values.yaml", "prometheusRule.config.impactfulPageSeconds=1800",
                   "prometheusRule.disabled.SeExporterDown=true")
    (rules,) = [d for d in found if d["kind"] == "PrometheusRule"]
    alerts = {r["alert"]: r for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert "<= 1800)" in alerts["SeExporterImpactfulEventImminent"]["expr"]
    assert "SeExporterDown" not in alerts


def test_promtool_and_the_operators_schema_accept_a_tuned_render(tmp_path: Path) -> None:
    """The tuned PrometheusRules are valid against the Prometheus Operator's CRD schema, and their groups, as one rule
    file, pass `promtool check rules` (the real one)."""
    objects = rule_objects(tmp_path, tuned())
    assert [errors(o, KUBERNETES_VERSIONS[-1]) for o in objects] == [[], []]
    got = {o["metadata"]["name"]: o["spec"]["groups"] for o in objects}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [g for groups in got.values() for g in groups]}))
    promtool.check_rules(path)


def test_a_label_value_with_newlines_and_yaml_stays_one_label(tmp_path: Path) -> None:
    """additionalRuleLabels is written by toYaml: a value that, unquoted, would add keys and a document is one label
    value, byte for byte, with the schema checked or skipped."""
    for schema in (True, False):
        got = render_rules(tmp_path, {"additionalRuleLabels": {"note": PAYLOAD}}, schema=schema)
        rules = [rule for groups in got.values() for group in groups for rule in group["rules"]]
        assert all("injected" not in rule for rule in rules)
        assert {rule["labels"]["note"] for rule in rules if "alert" in rule} == {PAYLOAD}


REFUSED = [
    ({"disabled": {"SeExporterDwn": True}}, "SeExporterDwn"),
    ({"customRules": {"SeExporterHostFailur": {"severity": "warning"}}}, "SeExporterHostFailur"),
    ({"config": {"impactfulPageSeconds": -60}}, "impactfulPageSeconds"),
    ({"config": {"longFreezeSeconds": -0.5}}, "longFreezeSeconds"),
    ({"config": {"impactfulPageSeconds": 90.5}}, "impactfulPageSeconds"),
    ({"config": {"vmInfoLookback": "-1h"}}, "vmInfoLookback"),
    ({"customRules": {"SeExporterDown": {"for": "-5m"}}}, "for"),
    ({"customRules": {"SeExporterDown": {"severity": "page"}}}, "severity"),
    ({"customRules": {"SeExporterDown": {"severty": "critical"}}}, "severty"),
    ({"additionalRuleLabels": {"severity": "critical"}}, "severity"),
    ({"additionalRuleLabels": {"my-team": "a"}}, "my-team"),
    ({"additionalRuleLabels": {"team": "{{ $labels.instance }}"}}, "team"),
    ({"config": {"pageTypes": ['Reboot"} or vector(1) #']}}, "pageTypes"),
    ({"config": {"latencySensitiveSelector": 'a="b"} or vector(1) or up{'}}, "latencySensitiveSelector"),
    ({"runbookUrl": "https://x.test/{{ $labels.job }}"}, "runbookUrl"),
]
REFUSED_IDS = ["misspelt-disabled", "misspelt-custom", "negative-window", "negative-freeze", "fractional-window",
               "negative-lookback", "negative-for", "unknown-severity", "unknown-custom-key", "severity-label",
               "bad-label-name", "templated-label", "types-injection", "selector-injection", "templated-url"]


@pytest.mark.parametrize(("rule_values", "named"), REFUSED, ids=REFUSED_IDS)
def test_bad_values_are_refused_by_the_schema_in_one_line(tmp_path: Path, rule_values: dict[str, Any],
                                                          named: str) -> None:
    """helm's schema check (as `helm install` runs it) stops the render with one line naming the value."""
    with pytest.raises(HelmFailed, match="values don't meet the specifications of the schema") as refused:
        render_rules(tmp_path, rule_values)
    lines = [line for line in str(refused.value).splitlines() if "prometheusRule" in line]
    assert len(lines) == 1 and named in lines[0], str(refused.value)


@pytest.mark.parametrize(("rule_values", "named"), REFUSED, ids=REFUSED_IDS)
def test_bad_values_are_refused_by_the_template_without_the_schema(tmp_path: Path, rule_values: dict[str, Any],
                                                                   named: str) -> None:
    """The template checks each value as the schema does (`--skip-schema-validation` cannot get a bad value into a
    rule): one `fail` line naming it."""
    with pytest.raises(HelmFailed, match="execution error") as refused:
        render_rules(tmp_path, rule_values, schema=False)
    (line,) = [line for line in str(refused.value).splitlines() if "execution error" in line]
    assert "prometheusRule" in line and named in line


def test_the_schema_knows_every_alert_and_value() -> None:
    """disabled and customRules accept exactly the mixin's alert names; every CHART_VALUES path is in the schema."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["prometheusRule"]
    names = set(chart_rules.alert_names(generate.mixin()))
    for key in ("disabled", "customRules"):
        assert set(schema["properties"][key]["properties"]) == names
        assert schema["properties"][key]["additionalProperties"] is False
    for value in chart_rules.CHART_VALUES:
        node = schema
        for key in value.path.split("."):
            node = node["properties"][key]
        assert node["type"] == {"list": "array"}.get(value.kind, value.kind)


# The generator on a stand-in mixin: one alert whose expr is what the function makes of its _config.
WINDOW = chart_rules.ChartValue("window", "config.window", "integer", "a window", example=60)


def stand_in(expr: Any, defaults: dict[str, Any] | None = None) -> chart_rules.Render:
    def render(config: str) -> dict[str, Any]:
        c = {"window": 900, **(defaults or {}), **json.loads(config)}
        rule = {"alert": "A", "expr": expr(c), "labels": {"severity": "warning"}, "annotations": {}}
        return {"config": c, "alerts": {"groups": [{"name": "g", "rules": [rule]}]}, "rules": {"groups": []}}
    return render


def test_the_generator_puts_a_placeholder_where_a_value_lands() -> None:
    rendered = chart_rules.tokenised_rules(stand_in(lambda c: f"x > {c['window']}"), [WINDOW])
    assert rendered["alerts"]["groups"][0]["rules"][0]["expr"] == "x > ${config.window}"


@pytest.mark.parametrize(("expr", "defaults", "values", "refusal"), [
    (lambda c: f"x > {c['window']} and y > {c['window'] * 2}", None, [WINDOW], "window: the mixin computes with it"),
    (lambda c: f"x > {c['window'] // 60}", None, [WINDOW], "window: the mixin computes with it"),
    (lambda c: "x > 1" if c["window"] > 300000 else "x > 2", None, [WINDOW], "window: .* branches on it"),
    (lambda c: "x", None, [WINDOW], "window: reaches no rule"),
    (lambda c: f"x > {c['window']}", None, [chart_rules.ChartValue("nope", "nope", "integer", "", example=1)],
     "nope: not a key of the mixin's _config"),
    (lambda c: f"x > {c['window']}", {"window": "15m"}, [WINDOW], "window: the mixin's default '15m' is not"),
], ids=["computed", "only-computed", "branched", "unused", "unknown-key", "wrong-kind"])
def test_the_generator_refuses_a_value_the_rules_do_not_carry_as_written(expr: Any, defaults: dict[str, Any] | None,
                                                                         values: list[Any], refusal: str) -> None:
    """A _config key the mixin computes with, branches on or never uses, or one it does not have, cannot be a chart
    value: generation stops naming it (the other helper's new knobs are checked the same way)."""
    with pytest.raises(chart_rules.ChartValueError, match=refusal):
        chart_rules.tokenised_rules(stand_in(expr, defaults), values)


# A stand-in mixin with the kinds of knob still to come (a list of page types, a boolean that adds an alert), put
# through the whole pipeline: the generator writes a copy of the chart's data file, values and schema, the real helm
# renders the copy.
KNOBS = (WINDOW,
         chart_rules.ChartValue("pageTypes", "config.pageTypes", "list", "types that page", example=["Reboot"],
                                minimum=1, pattern=r"^[A-Za-z]+$"),
         chart_rules.ChartValue("spotPages", "config.spotPages", "boolean", "Spot pages", example=True))


def knob_mixin(config: str) -> dict[str, Any]:
    c = {"window": 900, "pageTypes": ["Reboot", "Redeploy"], "spotPages": False, **json.loads(config)}
    rule = {"alert": "SeExporterPage", "expr": f'x{{t=~"{"|".join(c["pageTypes"])}"}} < {c["window"]}',
            "labels": {"severity": "critical"}, "annotations": {"summary": f"pages {c['window']} s ahead"}}
    rules = [rule] + ([{"alert": "SeExporterSpotPage", "expr": "spot > 0", "labels": {"severity": "critical"},
                        "annotations": {}}] if c["spotPages"] else [])
    return {"config": c, "alerts": {"groups": [{"name": "se-exporter", "rules": rules},
                                               {"name": "se-exporter-fleet", "rules": [rule]}]},
            "rules": {"groups": [{"name": "se-exporter.rules", "rules": [{"record": "r", "expr": "vector(1)"}]}]}}


@pytest.fixture(scope="module")
def knob_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chart = tmp_path_factory.mktemp("chart") / "se-exporter"
    shutil.copytree(CHART, chart)
    (chart / "files" / "prometheus-rules.yaml").write_text(generate.chart_rules_file(knob_mixin, KNOBS))
    (chart / "values.yaml").write_text(generate.chart_values_yaml(chart, knob_mixin, KNOBS))
    (chart / "values.schema.json").write_text(generate.chart_schema_json(chart, knob_mixin, KNOBS))
    return chart


def knob_alerts(chart: Path, tmp_path: Path, rule_values: dict[str, Any], *,
                schema: bool = True) -> dict[str, dict[str, Any]]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"image": {"repository": "r"}, "prometheusRule": rule_values}))
    text = run_helm(["template", "se-exporter", "--values", str(path), "--show-only", "templates/prometheusrule.yaml",
                     *([] if schema else ["--skip-schema-validation"])], chart)
    (rule_object,) = [d for d in yaml.safe_load_all(text) if d]
    return {r["alert"]: r for g in rule_object["spec"]["groups"] for r in g["rules"] if "alert" in r}


def test_a_list_and_a_boolean_knob_reach_the_rules(knob_chart: Path, tmp_path: Path) -> None:
    """A list is joined where the mixin joins it; a boolean picks the mixin's rules for it (an alert it adds
    appears); the defaults are the stand-in's own rules; the schema knows every variant's alerts."""
    alerts = knob_alerts(knob_chart, tmp_path, {})
    assert set(alerts) == {"SeExporterPage"}
    assert alerts["SeExporterPage"]["expr"] == 'x{t=~"Reboot|Redeploy"} < 900'
    alerts = knob_alerts(knob_chart, tmp_path, {"config": {"window": 60, "pageTypes": ["Reboot"], "spotPages": True},
                                                "customRules": {"SeExporterSpotPage": {"severity": "warning"}}})
    assert alerts["SeExporterPage"]["expr"] == 'x{t=~"Reboot"} < 60'
    assert alerts["SeExporterPage"]["annotations"]["summary"] == "pages 60 s ahead"
    assert alerts["SeExporterSpotPage"]["labels"]["severity"] == "warning"
    assert set(knob_alerts(knob_chart, tmp_path, {"disabled": {"SeExporterSpotPage": True}})) == {"SeExporterPage"}


@pytest.mark.parametrize("schema", [True, False], ids=["schema", "template"])
@pytest.mark.parametrize(("config", "named"), [
    ({"pageTypes": []}, "pageTypes"), ({"pageTypes": ['Re"boot']}, "pageTypes"), ({"spotPages": "yes"}, "spotPages"),
    ({"window": -1}, "window")], ids=["empty-list", "bad-item", "not-a-boolean", "negative"])
def test_bad_knob_values_are_refused(knob_chart: Path, tmp_path: Path, config: dict[str, Any], named: str,
                                     schema: bool) -> None:
    """The list's, the boolean's and the number's checks, by the generated schema and by the template alone."""
    with pytest.raises(HelmFailed, match="schema" if schema else "execution error") as refused:
        knob_alerts(knob_chart, tmp_path, {"config": config}, schema=schema)
    assert named in str(refused.value)
