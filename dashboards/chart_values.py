"""What the chart-values table (chart_rules.CHART_VALUES) gives besides the rules: the generated block of the chart's
values.yaml (defaults from the mixin), the prometheusRule properties of values.schema.json (every value typed, the
alert-name maps closed to other names) and the table of docs/alerting.md, so that the values, the schema and the docs
cannot drift from the rules."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any

from chart_rules import (
    CHART_VALUES,
    DURATION,
    LABEL_NAME,
    LABEL_VALUE,
    PAGE_TYPES,
    SELECTOR,
    SOURCES,
    URL,
    WARN_TYPES,
    ChartValue,
    Render,
    every_alert,
    variants,
)

# What each pattern accepts, in words (the docs' table).
IN_WORDS = {URL: "an http(s) URL without spaces, quotes or braces", PAGE_TYPES: "Reboot, Redeploy, Terminate",
            WARN_TYPES: "Reboot, Redeploy, Preempt, Terminate", SOURCES: "Platform, User, unknown",
            SELECTOR: 'PromQL matchers such as `tier="db", env!~"dev.*"` (no backslash or braces)',
            DURATION: "a Prometheus duration (`30s`, `1h30m`)"}

def values_block(render: Render, severities: Sequence[str], values: Sequence[ChartValue] = CHART_VALUES) -> str:
    """The generated part of values.yaml's prometheusRule block (indented two spaces), defaults from the mixin."""
    defaults = render("{}")["config"]
    lines = ["  # Every alert gets these labels (e.g. team: platform, for routing); an alert's own labels win.",
             "  additionalRuleLabels: {}",
             "  # <AlertName>: true leaves that alert out (the names: docs/alerting.md).",
             "  disabled: {}",
             f"  # <AlertName>: {{severity: {'|'.join(severities)}, for: 5m}} overrides that alert's severity and "
             "`for`.",
             "  customRules: {}"]
    nested: dict[str, list[ChartValue]] = {}
    for value in values:
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
            lines.append(f"{indent}{name}: {json.dumps(defaults[value.key])}")
    return "\n".join(lines) + "\n"


def _schema(value: ChartValue) -> dict[str, Any]:
    if value.kind == "string":
        return {"type": "string", "pattern": value.pattern, "description": value.description}
    if value.kind == "boolean":
        return {"type": "boolean", "description": value.description}
    if value.kind == "list":
        return {"type": "array", "minItems": value.minimum, "items": {"type": "string", "pattern": value.pattern},
                "description": value.description}
    return {"type": value.kind, "minimum": value.minimum, "description": value.description}


def schema_properties(render: Render, severities: list[str],
                      values: Sequence[ChartValue] = CHART_VALUES) -> dict[str, Any]:
    """The generated properties of values.schema.json's prometheusRule object."""
    names = every_alert(variants(render, values))
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
    for value in values:
        *heads, name = value.path.split(".")
        nested = properties
        for head in heads:
            nested = nested.setdefault(head, {"type": "object", "additionalProperties": False,
                                              "properties": {}})["properties"]
        nested[name] = _schema(value)
    return properties


def _accepts(value: ChartValue) -> str:
    words = IN_WORDS.get(value.pattern, f"text matching `{value.pattern}`")
    if value.kind == "string":
        return words
    if value.kind == "list":
        return f"a list of at least {value.minimum}, each {words}"
    if value.kind == "boolean":
        return "true or false"
    return f"{'a whole number' if value.kind == 'integer' else 'a number'}, at least {value.minimum}"


def docs_table(render: Render, values: Sequence[ChartValue] = CHART_VALUES) -> str:
    """The Markdown table of the tunable values (docs/alerting.md), and the alert names `disabled` and
    `customRules` take."""
    defaults = render("{}")["config"]
    rows = ["| value | mixin `_config` | default | accepts | what it does |", "|---|---|---|---|---|"]
    for value in values:
        accepts, what = (text.replace("|", "\\|") for text in (_accepts(value), value.description))
        default = json.dumps(defaults[value.key]).replace("|", "\\|")
        rows.append(f"| `prometheusRule.{value.path}` | `{value.key}` | `{default}` | {accepts} | {what} |")
    names = ", ".join(f"`{name}`" for name in every_alert(variants(render, values)))
    return "\n".join(rows) + f"\n\nThe alerts `disabled` and `customRules` take: {names}.\n"
