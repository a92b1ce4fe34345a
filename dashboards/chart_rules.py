"""The Helm chart's PrometheusRules, generated from the mixin so that chart values reach every rule (issue 43).

CHART_VALUES is the one table: which of the mixin's _config keys are chart values, where under `prometheusRule.`
each lives, its type and what it accepts. From it (and the mixin) this writes

- charts/se-exporter/files/prometheus-rules.yaml: the mixin's rules rendered with a placeholder (``${path}``) where
  each value lands, the alert names, the severities and the table itself; templates/prometheusrule.yaml reads it,
  checks the values, puts each value in place of its placeholder, applies `disabled`, `customRules` and
  `additionalRuleLabels`, and writes every rule with toYaml (so no value can add a field to a manifest);
- the `prometheusRule` block of values.yaml (the defaults are the mixin's) and its subtree of values.schema.json
  (every value typed; `disabled` and `customRules` accept only the mixin's alert names).

How the placeholders are found, without a second copy of any rule: the mixin is rendered with every chart value set
to a sentinel of its type (a six-digit number, a marked string) and each sentinel's text becomes its placeholder.
That only works for a value the rules carry as written; one the mixin computes with (``page / 60``) or branches on
would be wrong in the chart, so each value is also rendered with a second sentinel alone, and the two renders must
agree once tokenised: otherwise generation stops naming the key. Putting the defaults back must give the mixin's
own render, byte for byte (checked here, and by tests/project/test_chart_rules.py with the real helm).
"""

from __future__ import annotations

import copy
import json
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

Render = Callable[[str], dict[str, Any]]
# Prometheus durations (`for`, lookbacks): one or more number-unit pairs, never negative.
DURATION = r"^([0-9]+(ms|s|m|h|d|w|y))+$"
# Where the runbooks and Grafana are: http(s), and nothing Prometheus' alert templates or a Markdown link would read.
URL = r"^https?://[^\s\"'{}<>\\]+$"
# Event types as a PromQL regex alternation (inside a double-quoted label matcher).
EVENT_TYPES = r"^[A-Za-z]+(\|[A-Za-z]+)*$"
# A PromQL label matcher list on target labels: name, operator, a double-quoted value without quotes or escapes.
SELECTOR = r'^[a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~)"[^"\\{}\n]*"(, ?[a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~)"[^"\\{}\n]*")*$'
# Extra labels on every alert: Prometheus label names; values are literal text (no alert-template delimiters).
LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
LABEL_VALUE = r"^[^{}]*$"
# The rule fields a value may land in (all strings, or maps of strings).
FIELDS = ("expr", "for", "labels", "annotations")


@dataclass(frozen=True)
class ChartValue:
    """One _config key of the mixin offered as a chart value at ``prometheusRule.<path>``."""

    key: str
    path: str
    kind: str  # "integer", "number" (both at least ``minimum``) or "string" (matching ``pattern``)
    description: str
    example: int | float | str  # a valid value other than the default (the docs show it; the tests render it)
    minimum: int = 0
    pattern: str = ""

    @property
    def token(self) -> str:
        return "${" + self.path + "}"


CHART_VALUES = (
    ChartValue("runbookUrl", "runbookUrl", "string",
               "Where docs/operations.md is served: each alert's runbook_url is this plus #<alert name in lower case>.",
               example="https://runbooks.corp.test/se-exporter/operations.md", pattern=URL),
    ChartValue("grafanaUrl", "grafanaUrl", "string", "Grafana's address: every alert's dashboard_url starts with it.",
               example="https://grafana.corp.test", pattern=URL),
    ChartValue("impactfulPageSeconds", "config.impactfulPageSeconds", "integer",
               "The paging window: an impactful event on a VM warns when scheduled and pages once its NotBefore is "
               "this many seconds away.", example=1800),
    ChartValue("longFreezeSeconds", "config.longFreezeSeconds", "number",
               "A Freeze longer than this many seconds warns (pages on latency-sensitive VMs); shorter ones are only "
               "recorded.", example=12.5),
    ChartValue("impactfulTypes", "config.impactfulTypes", "string",
               "The event types that take a VM away, as a regex alternation (Reboot|Redeploy).",
               example="Reboot|Redeploy", pattern=EVENT_TYPES),
    ChartValue("latencySensitiveSelector", "config.latencySensitiveSelector", "string",
               "PromQL matchers on the sidecars' target labels: the VMs on which a long Freeze pages.",
               example='tier="db", env!="dev"', pattern=SELECTOR),
    ChartValue("manyVms", "config.manyVms", "integer",
               "Fleet: an impactful event on more than this many VMs of one scale set at once warns.", example=20),
    ChartValue("vmInfoLookback", "config.vmInfoLookback", "string",
               "How long a sidecar that stopped answering is still named from its last vm_info (a duration).",
               example="3h", pattern=DURATION),
)


class ChartValueError(ValueError):
    """A CHART_VALUES entry the rules cannot carry as a chart value; the message names the key."""


def _sentinel(value: ChartValue, index: int, second: bool) -> int | str:
    """Six digits (jsonnet's %d, %g and toString all print them as they are) or a marked string."""
    if value.kind == "string":
        return f"sechartvalue{index}{'b' if second else 'a'}x"
    return (314000 if second else 271000) + index


def _strings(rule: dict[str, Any]) -> Iterator[tuple[str, str | None]]:
    """(field, label or annotation name) of every string a value may land in."""
    for field in FIELDS:
        if isinstance(rule.get(field), str):
            yield field, None
        elif isinstance(rule.get(field), dict):
            for name in rule[field]:
                yield field, name


def _map_strings(rendered: dict[str, Any], change: Callable[[str], str]) -> dict[str, Any]:
    out = copy.deepcopy(rendered)
    for kind in ("alerts", "rules"):
        for group in out[kind]["groups"]:
            for rule in group["rules"]:
                for field, name in _strings(rule):
                    if name is None:
                        rule[field] = change(rule[field])
                    else:
                        rule[field][name] = change(rule[field][name])
    return out


def _tokenised(render: Render, sentinels: dict[str, int | str], values: Sequence[ChartValue]) -> dict[str, Any]:
    rendered = render(json.dumps(sentinels))
    pairs = [(str(sentinels[v.key]), v.token) for v in values]

    def change(text: str) -> str:
        for sentinel, token in pairs:
            text = text.replace(sentinel, token)
        return text

    tokenised = _map_strings({k: rendered[k] for k in ("alerts", "rules")}, change)
    everywhere = json.dumps(tokenised)
    for sentinel, token in pairs:
        if sentinel in everywhere:
            raise ChartValueError(f"{token}: its sentinel lands outside {', '.join(FIELDS)} of a rule")
    return tokenised


def _formatted(value: Any) -> str:
    """A value as the template prints it: integers without a point, other numbers Go's shortest form."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def tokenised_rules(render: Render, values: Sequence[ChartValue] = CHART_VALUES) -> dict[str, Any]:
    """The mixin's rules with every chart value's placeholder in its place (ChartValueError when one cannot be)."""
    defaults = render("{}")["config"]
    for value in values:
        if value.key not in defaults:
            raise ChartValueError(f"{value.key}: not a key of the mixin's _config (CHART_VALUES in {__name__})")
        default = defaults[value.key]
        expected = str if value.kind == "string" else (int, float)
        if isinstance(default, bool) or not isinstance(default, expected):
            raise ChartValueError(f"{value.key}: the mixin's default {default!r} is not a {value.kind}")
    first = {v.key: _sentinel(v, i, second=False) for i, v in enumerate(values)}
    tokenised = _tokenised(render, first, values)
    text = json.dumps(tokenised)
    for index, value in enumerate(values):
        if value.token not in text:
            raise ChartValueError(f"{value.key}: reaches no rule as written (the mixin does not use it, or only "
                                  "computes with it), so it cannot be a chart value")
        if _tokenised(render, {**first, value.key: _sentinel(value, index, second=True)}, values) != tokenised:
            raise ChartValueError(f"{value.key}: the mixin computes with it or branches on it; the chart can only "
                                  "carry a value the rules hold as written")
    restored = _map_strings(tokenised, lambda s: _put_back(s, defaults, values))
    own = render("{}")
    if restored != {k: own[k] for k in ("alerts", "rules")}:
        raise ChartValueError("the defaults put back into the placeholders are not the mixin's own rules")
    return tokenised


def _put_back(text: str, config: dict[str, Any], values: Sequence[ChartValue]) -> str:
    for value in values:
        text = text.replace(value.token, _formatted(config[value.key]))
    return text


def alert_names(rendered: dict[str, Any]) -> list[str]:
    return [r["alert"] for g in rendered["alerts"]["groups"] for r in g["rules"]]


def data_file(render: Render, generated: str, dump: Callable[[Any], str], groups: dict[str, list[str]],
              severities: list[str], order: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> str:
    """charts/se-exporter/files/prometheus-rules.yaml: the tokenised groups by PrometheusRule (``groups`` maps
    "node" and "fleet" to group names), and what the template checks the values against."""
    tokenised = tokenised_rules(render)
    every = {g["name"]: g for kind in ("alerts", "rules") for g in tokenised[kind]["groups"]}
    data = {
        "values": [{"token": v.token, "path": v.path.split("."), "kind": v.kind, "minimum": v.minimum,
                    "pattern": v.pattern} for v in CHART_VALUES],
        "alerts": alert_names(tokenised),
        "severities": severities,
        "duration": DURATION,
        "labelName": LABEL_NAME,
        "labelValue": LABEL_VALUE,
        "groups": {owner: order([every[name] for name in names]) for owner, names in groups.items()},
    }
    return generated + dump(data)


def _default(value: ChartValue, defaults: dict[str, Any]) -> Any:
    return defaults[value.key]


def values_block(render: Render) -> str:
    """The generated part of values.yaml's prometheusRule block (indented two spaces), defaults from the mixin."""
    defaults = render("{}")["config"]
    lines = ["  # Every alert gets these labels (e.g. team: platform, for routing); an alert's own labels win.",
             "  additionalRuleLabels: {}",
             "  # <AlertName>: true leaves that alert out (the names: docs/alerting.md).",
             "  disabled: {}",
             "  # <AlertName>: {severity: critical|warning|info, for: 5m} overrides that alert's severity and `for`.",
             "  customRules: {}"]
    nested: dict[str, list[ChartValue]] = {}
    for value in CHART_VALUES:
        head, _, _ = value.path.rpartition(".")
        nested.setdefault(head, []).append(value)
    for head, members in nested.items():
        indent = "  "
        if head:
            lines.append("  # The mixin's _config thresholds and selectors (mixin/config.libsonnet), by their names.")
            lines.append(f"  {head}:")
            indent = "    "
        for value in members:
            lines += textwrap.wrap(value.description, 116, initial_indent=f"{indent}# ",
                                   subsequent_indent=f"{indent}# ")
            name = value.path.rpartition(".")[2]
            lines.append(f"{indent}{name}: {json.dumps(_default(value, defaults))}")
    return "\n".join(lines) + "\n"


def schema_properties(render: Render, severities: list[str]) -> dict[str, Any]:
    """The generated properties of values.schema.json's prometheusRule object."""
    names = alert_names(render("{}"))
    properties: dict[str, Any] = {
        "additionalRuleLabels": {
            "type": "object", "properties": {"severity": False}, "additionalProperties": False,
            "patternProperties": {LABEL_NAME: {"type": "string", "pattern": LABEL_VALUE}},
            "description": "labels on every alert (severity: see customRules); values are literal text"},
        "disabled": {
            "type": "object", "additionalProperties": False,
            "properties": {name: {"type": "boolean"} for name in names},
            "description": "alerts to leave out, by name"},
        "customRules": {
            "type": "object", "additionalProperties": False,
            "properties": {name: {"type": "object", "additionalProperties": False, "properties": {
                "severity": {"enum": severities}, "for": {"type": "string", "pattern": DURATION}}}
                for name in names},
            "description": "severity and `for` of alerts, by name"},
    }
    nested: dict[str, Any] = properties
    for value in CHART_VALUES:
        *heads, name = value.path.split(".")
        nested = properties
        for head in heads:
            nested = nested.setdefault(head, {"type": "object", "additionalProperties": False,
                                              "properties": {}})["properties"]
        if value.kind == "string":
            nested[name] = {"type": "string", "pattern": value.pattern, "description": value.description}
        else:
            nested[name] = {"type": value.kind, "minimum": value.minimum, "description": value.description}
    return properties
