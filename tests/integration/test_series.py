"""The series budget on real scrapes: an idle VM's series and bytes beside the Go peer's, and the first count of a
series new to the sidecar seen by increase() (promtool evaluates the shipped recording rule and the dashboards'
host-failure query over what the real sidecar served, scrape after scrape)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import SimulatorFactory
from tests.support.helpers import Sidecar, http_get, parse_samples, value, wait_until
from tests.support.promtool import promtool

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parent.parent.parent
HOLD = 1.0  # --max-scrape-interval of the sidecar under test
EVERY = 0.25  # seconds between two scrapes of the stand-in scraper: well within HOLD, as the flag asks
STEP = "30s"  # one scrape is one sample of the promtool input series, 30 s apart (the chart's scrape interval)
# A Freeze for this VM announced 60 s ahead, then a host failure (a Reboot first seen Started).
SCENARIO = {"description": "a Freeze, then a host failure", "vm": {"name": "vm0"}, "events": [
    {"EventId": "FREEZE-1", "EventType": "Freeze", "Resources": ["vm0"], "EventSource": "Platform",
     "DurationInSeconds": 5, "appear_at": 10, "notice": 60, "started_for": 20},
    {"EventId": "REBOOT-1", "EventType": "Reboot", "Resources": ["vm0"], "EventSource": "Platform",
     "DurationInSeconds": -1, "appear_at": 100, "started_at_first_sight": True, "started_for": 60}]}
SCHEDULED = ("azure_scheduled_events_transitions_total",
             {"event_type": "Freeze", "transition": "scheduled", "affects_this_vm": "true"})
STARTED = ("azure_scheduled_events_transitions_total",
           {"event_type": "Freeze", "transition": "started", "affects_this_vm": "true"})
HOST_FAILURE = ("azure_scheduled_events_notice_seconds_bucket",
                {"event_type": "Reboot", "affects_this_vm": "true", "le": "0.0"})


class Scraper:
    """Scrapes each sidecar every EVERY seconds, as Prometheus would, and keeps every exposition."""

    def __init__(self, sidecars: dict[str, Sidecar]) -> None:
        self.scrapes: dict[str, list[str]] = {name: [] for name in sidecars}
        self._sidecars = sidecars
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(EVERY):  # the scrape interval: a schedule, not a wait for something to settle
            for name, sidecar in self._sidecars.items():
                status, text = http_get(sidecar.metrics_url)
                assert status == 200
                with self._lock:
                    self.scrapes[name].append(text)

    def latest(self, name: str, metric: tuple[str, dict[str, str]]) -> float | None:
        with self._lock:
            texts = self.scrapes[name][-1:]
        return value(parse_samples(texts[0]), metric[0], **metric[1]) if texts else None

    def count(self) -> int:
        with self._lock:
            return min(len(texts) for texts in self.scrapes.values())

    def stop(self) -> dict[str, list[str]]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.scrapes


def samples(texts: list[str], metric: tuple[str, dict[str, str]]) -> str:
    """The promtool input values of one series over the scrapes: ``_`` where a scrape had no such series."""
    found = [value(parse_samples(text), metric[0], **metric[1]) for text in texts]
    return " ".join("_" if v is None else f"{v:g}" for v in found)


def test_increase_sees_the_first_transition_and_the_first_host_failure(
        simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], tmp_path: Path) -> None:
    """A Freeze's first `started` and a host failure's zero-notice bucket, each the first count of a series new to
    the sidecar, are seen by `increase()` in promtool over the real sidecar's scrapes: the recording rule of
    freezes started counts 1, and the host-failure panel's query 1. With the hold off (--max-scrape-interval 0)
    the same scrapes count 0: the series appear at 1, which increase() cannot tell from a series that was always 1."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps(SCENARIO))
    sim, server = simulator(str(scenario), held=True)
    sidecars = {hold: sidecar("--imds-url", server.url, "--poll-interval", "0.05",
                              env={"SE_EXPORTER_MAX_SCRAPE_INTERVAL": hold}) for hold in (f"{HOLD:g}s", "0")}
    for process in sidecars.values():
        wait_until(lambda p=process: p.value("azure_scheduled_events_up") == 1.0, timeout=30, what="IMDS read")
    scraper = Scraper(sidecars)
    held, plain = sidecars
    try:
        def scrapes_after(count: int) -> None:
            mark = scraper.count()
            wait_until(lambda: scraper.count() >= mark + count, timeout=30, what=f"{count} more scrapes")

        scrapes_after(2)
        # the Freeze listed, then Started, then the host failure
        for until, metric in ((20.0, SCHEDULED), (75.0, STARTED), (105.0, HOST_FAILURE)):
            sim.advance(until - sim.scenario_time())
            wait_until(lambda m=metric: scraper.latest(plain, m) == 1.0, timeout=30, what="the count, unheld")
            wait_until(lambda m=metric: scraper.latest(held, m) == 1.0, timeout=30, what="the count after the hold")
            scrapes_after(2)
    finally:
        scrapes = scraper.stop()
    assert all(text for texts in scrapes.values() for text in texts)
    first_held = samples(scrapes[held], STARTED).split()
    assert "0" in first_held and first_held.index("0") < first_held.index("1"), "no scrape saw the held 0"

    tests = []
    for hold, expect in ((held, 1), (plain, 0)):
        texts = scrapes[hold]
        assert len(texts) < 100, "more scrapes than the 1 h range covers at 30 s"
        end = f"{(len(texts) - 1) * 30}s"
        tests.append({
            "interval": STEP,
            "input_series": [{"series": _series(metric), "values": samples(texts, metric)}
                             for metric in (STARTED, HOST_FAILURE)],
            "promql_expr_test": [
                {"expr": "round(azure_scheduled_events:freezes_started:increase1h)", "eval_time": end,
                 "exp_samples": [{"labels": "{}", "value": expect}]},
                {"expr": 'round(sum(increase(azure_scheduled_events_notice_seconds_bucket{le="0.0", '
                         'affects_this_vm!="false"}[1h])))', "eval_time": end,
                 "exp_samples": [{"labels": "{}", "value": expect}]}]})
    (tmp_path / "rules.yaml").write_text((ROOT / "dashboards" / "rules.yaml").read_text())
    (tmp_path / "series_test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": STEP, "tests": tests}, sort_keys=False))
    result = subprocess.run([promtool(), "test", "rules", "series_test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _series(metric: tuple[str, dict[str, str]]) -> str:
    name, labels = metric
    return name + "{" + ", ".join(f'{key}="{value}"' for key, value in sorted(labels.items())) + "}"


def test_an_idle_vm_and_one_listed_event_keep_to_the_series_budget_beside_the_go_peer() -> None:
    """Real scrapes in one run (scripts/series.py): an idle VM at most 30 azure_* series, one listed event at most 15
    more, and, beside the Go peer polling the same documents, at most 1.5x its series and 2x its bytes."""
    sys.path.insert(0, str(ROOT))
    from scripts import series  # noqa: PLC0415 - a script's module, importable from the checkout's root

    if not series.PEER.exists():
        pytest.skip(f"the Go peer is absent ({series.PEER}): only the absolute bounds are checked by test_docs")
    figures = series.measure()
    idle, listed = figures["idle"], figures["one event listed"]
    ours, go = idle[series.OURS], idle[series.GO]
    assert ours.azure <= 30, ours
    assert listed[series.OURS].series - ours.series <= 15
    assert ours.series <= 1.5 * go.series, (ours.series, go.series)
    assert ours.bytes <= 2 * go.bytes, (ours.bytes, go.bytes)
    assert idle[series.LEAN].series < ours.series
