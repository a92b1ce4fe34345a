"""The reference pages list every setting and every metric the code has, and are what scripts/docs.py writes from
the code (so they cannot drift); the README, the operator's guide, stays under 40,000 bytes and links to them."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from scripts import docs as generator
from se_exporter.consume.settings import CONSUME_OPTIONS
from se_exporter.core.lifecycle import diff
from se_exporter.core.model import VmIdentity, parse_document
from se_exporter.infra import http_server
from se_exporter.sidecar.metrics import EVERY_FAMILY, NAMESPACE, Metrics
from se_exporter.sidecar.settings import RUN_OPTIONS
from se_exporter.sidecar.sinks.table import register_families
from se_exporter.simulator import scenario
from se_exporter.simulator.settings import SIMULATE_OPTIONS

ROOT = Path(__file__).parent.parent.parent
REFERENCE = (ROOT / "docs" / "reference.md").read_text()


def test_every_setting_is_in_the_reference() -> None:
    """Each flag and its environment variable appear in the configuration tables of docs/reference.md."""
    for option in (*RUN_OPTIONS, *SIMULATE_OPTIONS, *CONSUME_OPTIONS):
        metavar = f"[{option.metavar}]" if option.const is not None else option.metavar  # as --help shows it
        assert f"`{option.flag} {metavar}`" in REFERENCE, option.flag
        assert f"`{option.env}`" in REFERENCE, option.env


def test_every_metric_is_in_the_reference() -> None:
    """Each metric family the sidecar can expose (process_* aside) has a row in the metrics table."""
    body = json.dumps({"DocumentIncarnation": 1, "Events": [{
        "EventId": "E", "EventType": "Freeze", "EventStatus": "Started", "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
        "DurationInSeconds": 5}]})
    document = parse_document(body)
    snapshot = replace(EVERY_FAMILY, records=diff({}, document, 1.0).records, incarnation=1,
                       identity=VmIdentity(name="vm"))
    registry = CollectorRegistry()
    metrics = Metrics(registry, lambda: snapshot)
    http_server.rejection_counter(registry, NAMESPACE)
    register_families(registry)
    names = {family.name + ("_total" if family.type == "counter" else "") for family in registry.collect()}
    held = [metrics.transitions, metrics.polls, metrics.sink_errors, metrics.bound_hits, metrics.notice,
            metrics.impact, metrics.rebalance_to_preempt, metrics.poll_duration]  # described, not yet counted
    names |= {f"{m.metric.describe()[0].name}{'_total' if m.metric.describe()[0].type == 'counter' else ''}"
              for m in held}
    assert len(names) > 20
    for name in names:
        assert f"| `{name}` |" in REFERENCE, name


def test_the_committed_reference_pages_are_what_the_code_gives() -> None:
    """docs/reference.md and docs/modules.md equal what scripts/docs.py renders from today's code: `make docs`
    after a change of a flag, a metric or a module."""
    for page, render in generator.PAGES.items():  # each rendered once (docs/metrics.md scrapes real sidecars)
        assert page.read_text() == render(), f"{page.name} differs from the code: run make docs"


def test_a_page_that_drifted_from_the_code_fails_the_check(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A generated page edited by hand (or left behind by a change of the code) fails --check, naming the page;
    writing it again makes it pass."""
    page = tmp_path / "reference.md"
    page.write_text(generator.reference().replace("| `--poll-interval DURATION` |", "| `--poll-every DURATION` |"))

    assert generator.main(["--check"], pages={page: generator.reference}) == 1
    assert "reference.md differs from what the code gives: run make docs" in capsys.readouterr().err
    assert generator.main([], pages={page: generator.reference}) == 0
    assert generator.main(["--check"], pages={page: generator.reference}) == 0


def test_the_module_map_lists_every_module_once_and_no_line_counts() -> None:
    """Each module of the package has one row in docs/modules.md; the page counts no lines, so an edit inside a
    module leaves it as it is."""
    modules = (ROOT / "docs" / "modules.md").read_text()
    for path in sorted((ROOT / "se_exporter").rglob("*.py")):
        assert modules.count(f"| `{path.relative_to(ROOT).as_posix()}` |") == 1, path
    assert "| lines |" not in modules and "lines in all" not in modules


def test_the_readme_is_an_operators_guide_under_40000_bytes() -> None:
    """The README stays under 40,000 bytes and leads to the generated reference, where the tables live."""
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) < 40_000, len(readme)
    assert b"](docs/reference.md)" in readme and b"](docs/modules.md)" in readme
    for command in ("make demo", "make test"):
        assert command.encode() in readme


def test_the_readmes_generated_parts_are_rendered_between_their_markers() -> None:
    """A part is rewritten between its markers and nowhere else (the scenario list names every built-in); a README
    that lost a part's markers stops make docs with one line naming them."""
    text = "intro\n<!-- generated:scenarios -->\nstale\n<!-- /generated:scenarios -->\nrest\n"
    rendered = generator.readme(text, {"scenarios": generator.scenario_list})
    assert rendered.startswith("intro\n<!-- generated:scenarios -->\nBuilt-in scenarios") and rendered.endswith(
        ".\n<!-- /generated:scenarios -->\nrest\n")
    assert all(f"`{name}`" in rendered for name in scenario.builtin_names())
    with pytest.raises(SystemExit, match=re.escape("README.md has no <!-- generated:scenarios --> ... ")):
        generator.readme("intro\n")


def test_the_readmes_metric_table_and_excerpt_carry_the_labels_the_code_exports() -> None:
    """The table of first families and the excerpt come from the sidecar's own collectors: pending and
    transitions_total carry affects_this_vm, and the excerpt's Freeze is this VM's, Scheduled, counted once."""
    table, excerpt = generator.first_families(), generator.scrape_excerpt()
    assert "`azure_scheduled_events_pending{affects_this_vm, event_status, event_type}`" in table
    assert "`azure_scheduled_events_transitions_total{affects_this_vm, event_type, transition}`" in table
    assert ('azure_scheduled_events_transitions_total{affects_this_vm="true",event_type="Freeze",'
            'transition="scheduled"} 1.0') in excerpt.splitlines()
    assert ('azure_scheduled_events_pending{affects_this_vm="true",event_status="Scheduled",event_type="Freeze"} '
            '1.0') in excerpt.splitlines()


def test_the_budget_page_holds_the_budget_and_its_fleet_figures_follow_from_its_scrapes() -> None:
    """docs/metrics.md, from real scrapes: an idle VM at most 30 azure_* series, one listed event at most 15 more,
    and the fleet table is its series times the VMs times the samples a month at the chart's scrape interval."""
    page = (ROOT / "docs" / "metrics.md").read_text()
    figures = generator._committed_figures(ROOT / "docs" / "metrics.md")
    assert figures is not None
    idle, listed = figures["idle"]["se-exporter"], figures["one event listed"]["se-exporter"]
    assert idle["azure"] <= 30 and listed["series"] - idle["series"] <= 15
    assert not any(name.endswith("_bucket") for name in idle["families"])
    assert generator.chart_interval() == 30
    samples = 1_000 * idle["series"] * 30 * 86400 / 30
    assert f"| 1,000 | {1_000 * idle['series']:,} | {samples / 1e9:,.2f} billion |" in page
    assert generator.metrics_page(figures) == page


def test_a_budget_page_is_kept_through_a_scrapes_digits_but_not_through_a_series() -> None:
    """The committed figures stay while every series count is the same and every byte count within 5 %; one more
    series, or bytes 6 % off, and the page takes the new figures (so --check fails until make docs)."""
    scrape = {"series": 35, "azure": 29, "bytes": 5000, "gzip_bytes": 1200, "families": {"up": 35}}
    committed = {"idle": {"se-exporter": scrape}}
    assert generator.kept(committed, {"idle": {"se-exporter": {**scrape, "bytes": 5200}}}) is committed
    for changed in ({"series": 36}, {"families": {"up": 34, "x": 1}}, {"bytes": 5320}, {"gzip_bytes": 1100}):
        measured = {"idle": {"se-exporter": {**scrape, **changed}}}
        assert generator.kept(committed, measured) is measured, changed
    assert generator.kept(None, committed) is committed
