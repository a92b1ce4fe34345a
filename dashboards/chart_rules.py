"""The Helm chart's PrometheusRules, generated from the mixin so that chart values reach every rule (issue 43).

CHART_VALUES is the one table: which of the mixin's _config keys are chart values, where under `prometheusRule.`
each lives, its type and what it accepts. From it (and the mixin) this writes

- charts/se-exporter/files/prometheus-rules.yaml: the mixin's rules rendered with a placeholder (``${path}``) where
  each value lands, the alert names, the severities and the table itself; templates/prometheusrule.yaml reads it,
  checks the values, puts each value in place of its placeholder, applies `disabled`, `customRules` and
  `additionalRuleLabels`, and writes every rule with toYaml (so no value can add a field to a manifest);
- through chart_values.py, the `prometheusRule` block of values.yaml (the defaults are the mixin's), its subtree of
  values.schema.json (every value typed; `disabled` and `customRules` accept only the mixin's alert names) and the
  table of docs/alerting.md.

How the placeholders are found, without a second copy of any rule: the mixin is rendered with every chart value set
to a sentinel of its type (a six-digit number, a marked string) and each sentinel's text becomes its placeholder.
That only works for a value the rules carry as written; one the mixin computes with (``page / 60``) or branches on
would be wrong in the chart, so the mixin is rendered again with other sentinels, and the two renders must agree once
tokenised; where they do not, each value alone finds the one to name, and generation stops. A boolean cannot be a
sentinel: the rules are rendered for each combination of the booleans (the chart picks one). Putting the defaults back
must give the mixin's own render, byte for byte (checked here, and by tests/project/test_chart_rules.py with the real
helm).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

Render = Callable[[str], dict[str, Any]]
# Prometheus durations (`for`, lookbacks): one or more number-unit pairs, never negative.
DURATION = r"^([0-9]+(ms|s|m|h|d|w|y))+$"
# Where the runbooks and Grafana are: http(s), and nothing Prometheus' alert templates or a Markdown link would read.
URL = r"^https?://[^\s\"'{}<>\\]+$"
# What each list of event types and EventSources may hold (mixin/validate.libsonnet refuses the rest too).
PAGE_TYPES = r"^(Reboot|Redeploy|Terminate)$"
WARN_TYPES = r"^(Reboot|Redeploy|Preempt|Terminate)$"
SOURCES = r"^(Platform|User|unknown)$"
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
    # "integer" or "number" (at least ``minimum``), "string" (matching ``pattern``), "list" (of at least ``minimum``
    # strings matching ``pattern``, joined by ``separator`` where they land) or "boolean" (the chart carries the rules
    # for each combination of the booleans and picks one).
    kind: str
    description: str
    example: Any  # a valid value other than the default (the docs show it; the tests render it)
    minimum: int = 0
    pattern: str = ""
    separator: str = "|"

    @property
    def token(self) -> str:
        return "${" + self.path + "}"


CHART_VALUES = (
    ChartValue("runbookUrl", "runbookUrl", "string",
               "Where docs/operations.md is served: each alert's runbook_url is this, #, its name in lower case.",
               example="https://runbooks.corp.test/se-exporter/operations.md", pattern=URL),
    ChartValue("grafanaUrl", "grafanaUrl", "string", "Grafana's address: every alert's dashboard_url starts with it.",
               example="https://grafana.corp.test", pattern=URL),
    ChartValue("impactfulPageSeconds", "config.impactfulPageSeconds", "integer",
               "The paging window: an impactful event on a VM warns when scheduled and pages once its NotBefore is "
               "this many seconds away.", example=1800),
    ChartValue("longFreezeSeconds", "config.longFreezeSeconds", "number",
               "A Freeze longer than this many seconds warns (pages on latency-sensitive VMs); shorter ones are only "
               "recorded.", example=12.5),
    ChartValue("pageTypes", "config.pageTypes", "list",
               "The event types that page (from pageSources, within the paging window, or as a host failure).",
               example=["Reboot", "Redeploy"], pattern=PAGE_TYPES),
    ChartValue("pageSources", "config.pageSources", "list",
               "The EventSources whose events page: Platform (Azure's maintenance), User (a restart, a scale-in), "
               "unknown (none given).", example=["Platform", "unknown"], pattern=SOURCES),
    ChartValue("pageSpotPreempt", "config.pageSpotPreempt", "boolean",
               "Page for a Spot eviction (Preempt) as for the types above; by default it only warns.", example=True),
    ChartValue("warnTypes", "config.warnTypes", "list",
               "The event types that warn while scheduled, when not paging.",
               example=["Reboot", "Redeploy", "Preempt"], pattern=WARN_TYPES),
    ChartValue("warnSources", "config.warnSources", "list",
               "The EventSources whose events warn.", example=["Platform"], pattern=SOURCES),
    ChartValue("hostFailureWatchedSeconds", "config.hostFailureWatchedSeconds", "integer",
               "An event first seen Started pages as a host failure only if the sidecar had watched IMDS this many "
               "seconds before; else it warns (it cannot know whether the event was announced).", example=120),
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


def _sentinel(value: ChartValue, index: int, second: bool) -> int | str | list[str]:
    """Six digits (jsonnet's %d, %g and toString all print them as they are) or a marked string (a list of one)."""
    if value.kind in ("string", "list"):
        marked = f"sechartvalue{index}{'b' if second else 'a'}x"
        return [marked] if value.kind == "list" else marked
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


def _text(sentinel: Any) -> str:
    return str(sentinel[0]) if isinstance(sentinel, list) else str(sentinel)


def _tokenised(render: Render, config: dict[str, Any], values: Sequence[ChartValue]) -> dict[str, Any]:
    """The rules rendered with ``config`` (sentinels for ``values``), each sentinel's text made its placeholder."""
    rendered = render(json.dumps(config))
    pairs = [(_text(config[v.key]), v.token) for v in values]

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


def _formatted(value: ChartValue, given: Any) -> str:
    """A value as the template prints it: integers without a point, other numbers Go's shortest form, a list joined
    by its separator."""
    if value.kind == "list":
        return value.separator.join(given)
    if isinstance(given, float) and given.is_integer():
        return str(int(given))
    return str(given)


KINDS: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list) and all(isinstance(item, str) for item in v),
}


def variants(render: Render, values: Sequence[ChartValue] = CHART_VALUES) -> list[tuple[tuple[bool, ...], Any]]:
    """The mixin's rules with every chart value's placeholder in its place, once for each combination of the boolean
    values (False before True, in CHART_VALUES' order): a boolean may change which rules there are, so the chart
    carries each combination and picks one. ChartValueError names a value the rules cannot carry."""
    defaults = render("{}")["config"]
    for value in values:
        if value.key not in defaults:
            raise ChartValueError(f"{value.key}: not a key of the mixin's _config (CHART_VALUES in {__name__})")
        if value.kind not in KINDS or not KINDS[value.kind](defaults[value.key]):
            raise ChartValueError(f"{value.key}: the mixin's default {defaults[value.key]!r} is not a {value.kind}")
    flags = [v for v in values if v.kind == "boolean"]
    placed = [v for v in values if v.kind != "boolean"]
    first = {v.key: _sentinel(v, i, second=False) for i, v in enumerate(placed)}
    out = []
    for combination in itertools.product((False, True), repeat=len(flags)):
        config = {**first, **{flag.key: on for flag, on in zip(flags, combination, strict=True)}}
        tokenised = _tokenised(render, config, placed)
        second = {v.key: _sentinel(v, i, second=True) for i, v in enumerate(placed)}
        if _tokenised(render, {**config, **second}, placed) == tokenised:
            out.append((combination, tokenised))
            continue  # one render with every second sentinel agrees: no value is computed with
        for value in placed:
            if _tokenised(render, {**config, value.key: second[value.key]}, placed) != tokenised:
                raise ChartValueError(f"{value.key}: the mixin computes with it or branches on it; the chart can only "
                                      "carry a value the rules hold as written")
        raise ChartValueError("the second sentinels together change the rules, each alone does not")
    text = json.dumps([rules for _, rules in out])
    for value in placed:
        if value.token not in text:
            raise ChartValueError(f"{value.key}: reaches no rule as written (the mixin does not use it, or only "
                                  "computes with it), so it cannot be a chart value")
    for index, flag in enumerate(flags):
        if all(rules == out[n ^ (1 << (len(flags) - 1 - index))][1] for n, (_, rules) in enumerate(out)):
            raise ChartValueError(f"{flag.key}: changes no rule, so it cannot be a chart value")
    default = tuple(defaults[flag.key] for flag in flags)
    restored = _map_strings(dict(out)[default], lambda s: _put_back(s, defaults, placed))
    own = render("{}")
    if restored != {k: own[k] for k in ("alerts", "rules")}:
        raise ChartValueError("the defaults put back into the placeholders are not the mixin's own rules")
    return out


def tokenised_rules(render: Render, values: Sequence[ChartValue] = CHART_VALUES) -> dict[str, Any]:
    """The rules with placeholders for the booleans' defaults (variants' checks included)."""
    defaults = render("{}")["config"]
    found = dict(variants(render, values))
    rules: dict[str, Any] = found[tuple(defaults[v.key] for v in values if v.kind == "boolean")]
    return rules


def _put_back(text: str, config: dict[str, Any], values: Sequence[ChartValue]) -> str:
    for value in values:
        text = text.replace(value.token, _formatted(value, config[value.key]))
    return text


def alert_names(rendered: dict[str, Any]) -> list[str]:
    return [r["alert"] for g in rendered["alerts"]["groups"] for r in g["rules"]]


def every_alert(found: list[tuple[tuple[bool, ...], Any]]) -> list[str]:
    """The alert names of every variant, in order of first appearance."""
    return list(dict.fromkeys(name for _, rules in found for name in alert_names(rules)))


def _key(combination: tuple[bool, ...]) -> str:
    """A variant's name in the data file: the booleans, in order, as the template prints them (true,false)."""
    return ",".join("true" if on else "false" for on in combination)


def data_file(render: Render, generated: str, dump: Callable[[Any], str], groups: dict[str, list[str]],
              severities: list[str], order: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
              values: Sequence[ChartValue] = CHART_VALUES) -> str:
    """charts/se-exporter/files/prometheus-rules.yaml: each variant's tokenised groups by PrometheusRule (``groups``
    maps "node" and "fleet" to group names), and what the template checks the values against."""
    found = variants(render, values)
    by_variant = {}
    for combination, rules in found:
        every = {g["name"]: g for kind in ("alerts", "rules") for g in rules[kind]["groups"]}
        by_variant[_key(combination)] = {owner: order([every[name] for name in names if name in every])
                                         for owner, names in groups.items()}
    data = {
        "values": [{"token": v.token, "path": v.path.split("."), "kind": v.kind, "minimum": v.minimum,
                    "pattern": v.pattern, "separator": v.separator} for v in values if v.kind != "boolean"],
        "flags": [{"path": v.path.split(".")} for v in values if v.kind == "boolean"],
        "alerts": every_alert(found),
        "severities": severities,
        "duration": DURATION,
        "labelName": LABEL_NAME,
        "labelValue": LABEL_VALUE,
        "variants": by_variant,
    }
    return generated + dump(data)
