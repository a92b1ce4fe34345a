"""Every metric name written where users read it (the rules' expressions and annotations, the dashboards' queries,
the README, docs/, deploy/, every command's --help) is a name that `run` or `fleet` exposes (`consume` exposes
none), or a recording rule the shipped rules define: a runbook can no longer send an operator to a metric that
does not exist. The names come from the programs' own collectors, so a renamed metric fails here too."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import ProcessCollector
from prometheus_client.metrics_core import Metric

from scripts import docs as generator
from se_exporter.cli import build_parser
from se_exporter.fleet.collector import PartitionCollector
from se_exporter.sidecar.metrics import StateCollector
from se_exporter.sidecar.snapshot import Snapshot

ROOT = Path(__file__).parent.parent.parent
NAMESPACES = ("azure_scheduled_events_", "azure_scheduled_event_", "azure_scheduled_fleet_")
# A full name of ours, and a short one as prose writes it (`forward_errors_total{reason}`): a word ending in _total.
FULL = re.compile(r"\bazure_scheduled_(?:events?|fleet)_[a-z0-9_]*[a-z0-9]\b")
SHORT = re.compile(r"(?<![\w$.-])[a-z][a-z0-9]*(?:_[a-z0-9]+)*_total\b")
# Counters of other programs that the shipped text names (Prometheus' and Alertmanager's own).
FOREIGN = frozenset({"prometheus_notifications_dropped_total"})


def forms(family: Metric) -> set[str]:
    """The names a family's series go by in Prometheus (and the family's own, as docs name a histogram)."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created", ""),
                "summary": ("_sum", "_count", "_created", ""), "info": ("_info",)}.get(family.type, ("",))
    return {family.name + suffix for suffix in suffixes}


def exposed() -> set[str]:
    """What `run` and `fleet` can expose: their collectors' families (as the reference page lists them), what the
    state collectors describe, and the process collector's."""
    families: list[Metric] = [*generator.run_families(), *generator.fleet_families()]
    families += StateCollector(Snapshot, lambda: 0.0).describe()
    families += PartitionCollector(dict, lambda: None).describe()
    families += ProcessCollector(registry=None).collect()
    return {name for family in families for name in forms(family)}


def recorded() -> set[str]:
    """The recording rules the shipped rule files define."""
    names = set()
    for rules in sorted((ROOT / "dashboards").glob("*.yaml")):
        for group in yaml.safe_load(rules.read_text())["groups"]:
            names |= {rule["record"] for rule in group["rules"] if "record" in rule}
    return names


def help_texts() -> Iterator[tuple[str, str]]:
    """Every command's --help, as a user sees it."""
    for command in ("run", "fleet", "consume", "simulate"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        yield f"se-exporter {command} --help", out.getvalue()


def shipped_texts() -> Iterator[tuple[str, str]]:
    """The text users read: README, CHANGELOG, docs/, the dashboards and rules, deploy/, --help."""
    paths: Iterable[Path] = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")),
                             *sorted((ROOT / "dashboards").glob("*.yaml")),
                             *sorted((ROOT / "dashboards").glob("*.json")),
                             *sorted(path for path in (ROOT / "deploy").rglob("*") if path.is_file())]
    for path in paths:
        yield path.relative_to(ROOT).as_posix(), path.read_text()
    yield from help_texts()


def unknown_names(texts: Iterable[tuple[str, str]], known: set[str]) -> list[str]:
    """Each metric name of ``texts`` that is not in ``known``, as 'where: name'. A short name (`polls_total`) is
    known when one of the namespaces before it makes a known name."""
    found = []
    for where, text in texts:
        for name in sorted(set(FULL.findall(text))):
            if name not in known:
                found.append(f"{where}: {name}")
        for name in sorted({name for name in SHORT.findall(text) if not FULL.fullmatch(name)} - FOREIGN):
            if name not in known and not any(prefix + name in known for prefix in NAMESPACES):
                found.append(f"{where}: {name}")
    return found


def test_every_metric_name_users_read_is_one_the_programs_expose() -> None:
    """No rule, annotation, runbook, dashboard query, page or --help names a metric that run and fleet do not
    expose or the rules do not record."""
    known = exposed() | recorded()
    assert len(known) > 100
    assert unknown_names(shipped_texts(), known) == []


def test_the_check_finds_a_missing_name_in_full_and_in_short() -> None:
    """The checker itself: a full name and a short `_total` name that nothing exposes are reported with where they
    were read; names that exist in full, in short, with their suffixes, and recorded ones are not."""
    known = exposed() | {"azure_scheduled_fleet:vms:count"}
    text = ("see imds_errors_total and azure_scheduled_events_imds_errors_total; fine: polls_total{outcome}, "
            "azure_scheduled_events_notice_seconds_bucket, azure_scheduled_events_polls_total, "
            "forward_errors_total, $__rate_interval")
    assert unknown_names([("runbook", text)], known) == [
        "runbook: azure_scheduled_events_imds_errors_total", "runbook: imds_errors_total"]
