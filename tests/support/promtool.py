"""Alert rules under promtool, shared by the sidecar's and the fleet's rule tests: read a rule file, render the
annotations an alert should carry, `promtool check rules`, and `promtool test rules` over a table of cases."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

# (alert, {series: values}, eval_time, [(labels, value), ...]): the alerts expected at eval_time; [] for silence.
Case = tuple[str, dict[str, str], str, list[tuple[dict[str, str], float]]]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: `make test` installs Debian's prometheus package")
    return path


def humanize_duration(value: float) -> str:
    """Prometheus' humanizeDuration for 0 and whole seconds (what these cases use)."""
    if value < 60:
        return f"{value:.4g}s"
    seconds = int(value)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m {secs}s"
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    return f"{minutes}m {secs}s"


# The one query an annotation runs (the fleet's missed-event alerts list the VMs): one metric, selected by the
# alert's job and event_id and a coverage regex, max by (vm_name, coverage), sorted by vm_name.
_QUERY = re.compile(r'\{\{ range query \(printf "max by \(vm_name, coverage\) \((\w+)\{job=%q, event_id=%q, '
                    r'coverage=~%q\}\)" \$labels\.job \$labels\.event_id "([^"]*)"\) \| sortByLabel "vm_name" \}\}'
                    r'(.*?)\{\{ end \}\}')
_SERIES = re.compile(r"^(\w+)\{(.*)\}$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _labels_of(series: str) -> tuple[str, dict[str, str]]:
    match = _SERIES.match(series)
    return (match.group(1), dict(_LABEL.findall(match.group(2)))) if match else (series, {})


def _query(match: re.Match[str], labels: dict[str, str], series: dict[str, str]) -> str:
    """The series of the case the annotation's query selects, once per (vm_name, coverage), by vm_name, each
    rendered with the range's body (``.Labels.<name>``). The cases' series hold their values to the eval time."""
    metric, coverages, body = match.groups()
    found = set()
    for name in series:
        got, own = _labels_of(name)
        if (got == metric and own.get("job") == labels.get("job") and own.get("event_id") == labels.get("event_id")
                and re.fullmatch(coverages, own.get("coverage", ""))):
            found.add((own["vm_name"], own["coverage"]))
    def one(vm: str, coverage: str) -> str:
        return re.sub(r"\{\{ \.Labels\.(\w+) \}\}", lambda m: {"vm_name": vm, "coverage": coverage}[m.group(1)],
                      body)

    return "".join(one(vm, coverage) for vm, coverage in sorted(found))


def render(template: str, labels: dict[str, str], value: float, series: dict[str, str] | None = None) -> str:
    """A small independent renderer for the constructs the rules use; promtool compares it with Prometheus'.
    ``series``: the case's input, for an annotation that queries it."""
    text = _QUERY.sub(lambda m: _query(m, labels, series or {}), template)
    text = re.sub(r"\{\{ with \$labels\.(\w+) \}\}(.*?)\{\{ end \}\}",
                  lambda m: m.group(2).replace("{{ . }}", labels[m.group(1)]) if labels.get(m.group(1)) else "",
                  text)
    text = re.sub(r'\{\{ if eq \$labels\.(\w+) "([^"]*)" \}\}(.*?)\{\{ else \}\}(.*?)\{\{ end \}\}',
                  lambda m: m.group(3) if labels.get(m.group(1)) == m.group(2) else m.group(4), text)
    text = re.sub(r"\{\{\s*\$value\s*\|\s*humanizeDuration\s*\}\}", humanize_duration(value), text)
    text = re.sub(r"\{\{\s*\$value\s*\}\}", f"{value:g}", text)
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), text)


def rules(path: Path) -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(path.read_text())
    return {rule["alert"]: rule for group in data["groups"] for rule in group["rules"]}


def expected(path: Path, alert: str, labels: dict[str, str], value: float,
             series: dict[str, str] | None = None) -> dict[str, Any]:
    rule = rules(path)[alert]
    all_labels = {**labels, **rule.get("labels", {})}
    return {"exp_labels": all_labels,
            "exp_annotations": {k: render(v, all_labels, value, series) for k, v in rule["annotations"].items()}}


def firing_and_silent(cases: list[Case]) -> tuple[set[str], set[str]]:
    """The alerts some case expects to fire, and those some case expects silent (each rule wants both)."""
    return ({alert for alert, _, _, alerts in cases if alerts}, {alert for alert, _, _, alerts in cases if not alerts})


def check_rules(path: Path) -> None:
    """promtool check rules on a rule file."""
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def run_rule_tests(path: Path, cases: list[Case], workdir: Path) -> None:
    """promtool test rules: every case fires exactly its alerts, with labels and rendered annotations."""
    tests = [{"interval": "1m",
              "input_series": [{"series": name, "values": values} for name, values in series.items()],
              "alert_rule_test": [{"eval_time": eval_time, "alertname": alert,
                                   "exp_alerts": [expected(path, alert, labels, value, series)
                                                  for labels, value in alerts]}]}
             for alert, series, eval_time, alerts in cases]
    shutil.copy(path, workdir / path.name)
    (workdir / "rules_test.yaml").write_text(yaml.safe_dump(
        {"rule_files": [path.name], "evaluation_interval": "1m", "tests": tests}, sort_keys=False))
    result = subprocess.run([promtool(), "test", "rules", "rules_test.yaml"], cwd=workdir, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

