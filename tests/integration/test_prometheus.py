"""A real Prometheus (Debian's package) scrapes a real sidecar fed by the simulator."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from se_exporter.simulator.faults import Fault
from se_exporter.simulator.server import Simulator
from tests.conftest import SimulatorFactory
from tests.support.child_logs import attach
from tests.support.helpers import Sidecar, free_port, http_get, stop_process, wait_until

pytestmark = pytest.mark.integration
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")
FREEZE = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: `make test` installs Debian's prometheus package (apt-get install prometheus)")
    return path


class Prometheus:
    def __init__(self, target: str, workdir: Path, extra_targets: list[str] | None = None,
                 rule_file: Path | None = None, target_labels: dict[str, str] | None = None,
                 relabel_configs: list[dict[str, Any]] | None = None,
                 extra_jobs: list[dict[str, Any]] | None = None, alertmanager: str | None = None,
                 interval: float = 1.0, job_name: str = "se-exporter") -> None:
        """Scrape ``target`` (with ``target_labels``, as service discovery would attach them, then
        ``relabel_configs``) and ``extra_targets`` in job ``job_name``, plus any ``extra_jobs``, and evaluate
        ``rule_file`` every ``interval`` seconds; send alerts to the Alertmanager at ``alertmanager`` (HOST:PORT)."""
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        self.interval = interval
        groups: list[dict[str, Any]] = [{"targets": [target], "labels": target_labels or {}}]
        if extra_targets:
            groups.append({"targets": extra_targets})
        job: dict[str, Any] = {"job_name": job_name, "static_configs": groups}
        if relabel_configs:
            job["relabel_configs"] = relabel_configs
        every = f"{round(interval * 1000)}ms"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": every, "scrape_timeout": f"{round(interval * 900)}ms",
                       "evaluation_interval": every},
            **({"rule_files": [str(rule_file)]} if rule_file else {}),
            **({"alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}}
               if alertmanager else {}),
            "scrape_configs": [job, *(extra_jobs or [])]}, sort_keys=False))
        self.log = workdir / "prometheus.log"
        for _ in range(3):  # the free port may be taken between probe and bind; try another
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            with self.log.open("wb") as log:
                self.process = subprocess.Popen(
                    [_tool("prometheus"), f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
                     f"--storage.tsdb.path={workdir / 'data'}", "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT)
            attach(f"Prometheus (pid {self.process.pid})", self.log, lambda: self.process.poll() is None)
            ready = wait_until(lambda: self.process.poll() is not None or http_get(self.url + "/-/ready")[0] == 200,
                               timeout=30, what="Prometheus to be ready")
            if self.process.poll() is None and ready:
                return
        raise AssertionError(f"Prometheus did not start: {self.log.read_text()}")

    def query(self, expr: str) -> list[dict[str, object]]:
        status, body = http_get(f"{self.url}/api/v1/query?query={urllib.parse.quote(expr)}")
        assert status == 200, body
        payload = json.loads(body)
        assert payload["status"] == "success", payload
        return payload["data"]["result"]  # type: ignore[no-any-return]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None  # type: ignore[index]

    def stop(self) -> None:
        stop_process(self.process)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], Prometheus]]:
    started: list[Prometheus] = []

    def make(target: str) -> Prometheus:
        server = Prometheus(target, tmp_path / f"prometheus{len(started)}")
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def scraped(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
            prometheus: Callable[[str], Prometheus]) -> tuple[Simulator, Prometheus]:
    """The live-migration Freeze listed as Scheduled, polled by a sidecar that Prometheus scrapes and sees up."""
    sim, server = simulator("live-migration")
    sim.advance(10)
    process = sidecar("--imds-url", server.url, *FAST)
    prom = prometheus(process.base_url.removeprefix("http://"))
    wait_until(lambda: prom.value('up{job="se-exporter"}') == 1, timeout=30, what="target up")
    wait_until(lambda: prom.value("azure_scheduled_events_up") == 1, timeout=30, what="exporter up")
    return sim, prom


def test_prometheus_scrapes_the_lifecycle(scraped: tuple[Simulator, Prometheus]) -> None:
    """Queried through Prometheus: up, the pending Freeze with its countdown, then its completion and disappearance."""
    sim, prom = scraped
    info = wait_until(lambda: prom.query('azure_scheduled_event_info{event_type="Freeze"}'), timeout=30,
                      what="the Freeze in Prometheus")
    labels = info[0]["metric"]
    assert (labels["event_id"], labels["event_status"], labels["affects_this_vm"]) == (FREEZE, "Scheduled", "true")  # type: ignore[index]
    countdown = prom.value(f'azure_scheduled_event_seconds_until_not_before{{event_id="{FREEZE}"}}')
    assert countdown is not None and 800 < countdown <= 900
    assert prom.value('sum(azure_scheduled_events_pending{event_status="Scheduled"})') == 1
    # only what is listed: no zero-filled series of the types and statuses this VM does not list
    assert prom.value('count(azure_scheduled_events_pending)') == 1

    sim.advance(900)  # Started
    wait_until(lambda: prom.value('azure_scheduled_events_pending{event_type="Freeze",event_status="Started"}') == 1,
               timeout=30, what="Started in Prometheus")
    sim.advance(40)  # gone
    wait_until(lambda: prom.value('sum(azure_scheduled_events_transitions_total{event_type="Freeze",'
                                  'transition="completed"})') == 1, timeout=30, what="completion in Prometheus")
    wait_until(lambda: prom.query("azure_scheduled_event_info") == [], timeout=30,
               what="the event's series to go stale")
    assert prom.value('azure_scheduled_events_notice_seconds_count{event_type="Freeze",affects_this_vm="true"}') == 1


def test_prometheus_sees_imds_failure_and_recovery(scraped: tuple[Simulator, Prometheus]) -> None:
    """A 503 storm shows as up 0 and a rising http_error counter, while the last document's events stay listed."""
    sim, prom = scraped
    sim.inject(Fault("status", status=503, count=0))
    wait_until(lambda: prom.value("azure_scheduled_events_up") == 0, timeout=30, what="exporter down")
    assert (prom.value('azure_scheduled_events_polls_total{outcome="http_error"}') or 0) > 0
    assert prom.value("count(azure_scheduled_event_info)") == 1
    sim.clear_faults()
    wait_until(lambda: prom.value("azure_scheduled_events_up") == 1, timeout=30, what="exporter recovered")


def test_promtool_check_metrics_is_clean(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar]) -> None:
    """promtool's linter finds nothing to say about /metrics, with events of every kind listed."""
    sim, server = simulator("demo")
    sim.advance(250)  # Scheduled and Started events, a countdown, durations
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="first document")
    wait_until(lambda: process.value("azure_scheduled_events_vm_info", vm_name="WestNO_0", vm_id=sim.vm["vmId"],
                                     vmss_name="", location=sim.vm["location"],
                                     resource_group=sim.vm["resourceGroupName"],
                                     subscription_id=sim.vm["subscriptionId"], vm_size=sim.vm["vmSize"],
                                     zone=sim.vm["zone"]), what="identity")
    status, text = http_get(process.metrics_url)
    assert status == 200
    assert "azure_scheduled_event_seconds_until_not_before" in text
    result = subprocess.run([_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


HOSTILE = ('{"DocumentIncarnation": 3, "Events": [' + ", ".join(
    '{"EventId": "' + event_id + '", "EventType": "Freeze", "EventStatus": "Scheduled", "Resources": ["WestNO_0"]}'
    for event_id in (r"LLLL-\ud800", r"X\n2026-11-22T02:55:46.262Z critical \u001b[31m", r'Q\\\"=\u0000\u2028',
                     "\u00e9\u4e2d\U0001f600")) + "]}")


def test_prometheus_scrapes_strings_from_any_document(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                                      prometheus: Callable[[str], Prometheus]) -> None:
    """EventIds holding an unpaired surrogate, a newline, ANSI escapes, a quote, a backslash, NUL, a line separator
    and non-BMP text: the real Prometheus scrapes every one of them (the scrape was an HTTP 500 before)."""
    sim, server = simulator("live-migration")
    sim.inject(Fault("body", text=HOSTILE, count=0))
    process = sidecar("--imds-url", server.url, *FAST)
    prom = prometheus(process.base_url.removeprefix("http://"))
    wait_until(lambda: prom.value("count(azure_scheduled_event_info)") == 4, timeout=30, what="four events scraped")
    assert prom.value('up{job="se-exporter"}') == 1
    ids = {str(result["metric"]["event_id"]) for result in prom.query("azure_scheduled_event_info")}  # type: ignore[index]
    assert "LLLL-\\ud800" in ids and "X\n2026-11-22T02:55:46.262Z critical \x1b[31m" in ids
