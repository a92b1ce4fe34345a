"""Every paging case of docs/alerting.md on the real sidecar's own scrapes: the simulator serves the event, a real
`se-exporter run` polls it, and what its /metrics says at that moment is promtool's input to the shipped rules
(dashboards/alerts.yaml). Each case says which alert fires and that every other alert of the file stays silent, so a
page that should not be (a scale-in, a Spot eviction, a restart from the portal, a Reboot first seen Started by a pod
that just started, or one restarted after an hour with its state) fails here as it would wake someone."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from se_exporter.sidecar.settings import Settings
from se_exporter.simulator.server import Simulator, SimulatorServer
from tests.conftest import Reliability, SimulatorFactory
from tests.support import promtool
from tests.support.fleet_overlap import promtool_series
from tests.support.helpers import WATCHED_FAST, Sidecar, http_get, parse_samples, wait_until, watched_for_an_hour

pytestmark = pytest.mark.integration
RULES = Path(__file__).parent.parent.parent / "dashboards" / "alerts.yaml"
VM = "web_0"
TARGET = {"job": "se-exporter", "instance": "10.0.0.4:10169"}  # the labels the scrape adds
EVENT_ID = "A1B2C3D4-0000-4000-8000-00000000CA5E"
FAST = WATCHED_FAST
WATCHING = "azure_scheduled_events_watching_since_timestamp_seconds"


@dataclass(frozen=True)
class Paging:
    """One case: the event the simulator lists (EventType, EventSource, notice or Started at first sight), whether
    the sidecar continues a state directory that has watched for an hour, and the one alert it must raise."""

    name: str
    event_type: str
    source: str
    notice: float | None  # None: Started at first sight
    watched: bool
    fires: str

    def event(self) -> dict[str, object]:
        event: dict[str, object] = {"EventId": EVENT_ID, "EventType": self.event_type, "EventSource": self.source,
                                    "Resources": [VM], "appear_at": 0, "started_for": 3600}
        return event | ({"started_at_first_sight": True} if self.notice is None else {"notice": self.notice})


CASES = [
    Paging("platform Reboot 10 minutes away", "Reboot", "Platform", 600, False, "SeExporterImpactfulEventImminent"),
    Paging("platform Redeploy 7 days away", "Redeploy", "Platform", 7 * 86400, False,
           "SeExporterImpactfulEventScheduled"),
    Paging("scale-in Terminate 60 s away", "Terminate", "User", 60, False, "SeExporterImpactfulEventScheduled"),
    Paging("restart from the portal", "Reboot", "User", 300, False, "SeExporterImpactfulEventScheduled"),
    Paging("Spot Preempt 30 s away", "Preempt", "Platform", 30, False, "SeExporterImpactfulEventScheduled"),
    Paging("platform Reboot Started, first seen by a fresh pod", "Reboot", "Platform", None, False,
           "SeExporterImpactfulEventStartedBeforeWatching"),
    Paging("host failure seen by a sidecar that has watched", "Reboot", "Platform", None, True,
           "SeExporterHostFailure"),
]


def scrape(sidecar: Sidecar) -> str | None:
    """The sidecar's exposition once it lists the event and its VM's identity (None until then)."""
    status, text = http_get(sidecar.metrics_url)
    names = {(name, dict(labels).get("event_id")) for name, labels in parse_samples(text)} if status == 200 else set()
    listed = ("azure_scheduled_event_info", EVENT_ID) in names
    return text if listed and ("azure_scheduled_events_vm_info", None) in names else None


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_paging_case_on_the_real_sidecars_scrape(case: Paging, simulator: SimulatorFactory, tmp_path: Path,
                                                      reliability: Reliability) -> None:
    """The real sidecar's scrape, fed to promtool with the shipped rules, raises exactly the case's alert (with the
    rule's labels and rendered annotations) and no other alert of the file: in particular no page unless the case
    is one."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"description": case.name, "events": [case.event()]}))
    _, server = simulator(str(scenario), vm_name=VM)
    state = tmp_path / "state"
    if case.watched:
        watched_for_an_hour(state, server.url)
    process = Sidecar(["--imds-url", server.url, *FAST, "--state-dir", str(state)], tmp_path / "sidecar")
    try:
        text = wait_until(lambda: scrape(process), timeout=30, what="the sidecar to list the event")
    finally:
        process.stop()
    samples = parse_samples(text)
    extra: dict[str, str] = {}
    value = 0.0
    if case.fires in ("SeExporterImpactfulEventScheduled", "SeExporterImpactfulEventImminent"):
        extra = {"event_status": "Scheduled" if case.notice is not None else "Started", "event_source": case.source}
        [value] = [v for (name, own), v in samples.items()
                   if name == "azure_scheduled_event_seconds_until_not_before" and dict(own)["event_id"] == EVENT_ID]
    kind = only(text, case.fires, case.event_type, tmp_path, extra, value)
    reliability("Alerting", f"{case.name}, on the real sidecar's scrape under promtool with the shipped rules",
                f"{case.fires} ({kind}) and no other alert")


def only(text: str, fires: str, event_type: str, tmp_path: Path, extra: dict[str, str] | None = None,
         value: float = 0.0) -> str:
    """promtool with the shipped rules on the scrape ``text``: ``fires`` fires for the event (with the VM's identity
    and ``extra`` labels, at ``value``) and no other alert of the file does; "a page" or "a warning"."""
    series = promtool_series(text, TARGET, 5)
    [vm_info] = [dict(own) for name, own in parse_samples(text) if name == "azure_scheduled_events_vm_info"]
    identity = {key: vm_info[key] for key in ("vm_name", "vmss_name", "location", "subscription_id",
                                                "resource_group") if vm_info.get(key)}
    labels = {**TARGET, **identity, "event_id": EVENT_ID, "event_type": event_type, **(extra or {})}
    cases: list[promtool.Case] = [(alert, series, "1m", [(labels, value)] if alert == fires else [])
                                  for alert in promtool.rules(RULES)]
    promtool.run_rule_tests(RULES, cases, tmp_path)
    return {"critical": "a page", "warning": "a warning"}[promtool.rules(RULES)[fires]["labels"]["severity"]]


def restart_case(tmp_path: Path, simulator: SimulatorFactory,
                 event: dict[str, object]) -> tuple[Simulator, SimulatorServer]:
    """A simulator listing ``event`` when the test advances its held time past the event's ``appear_at``."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"description": "a sidecar restarted with its state", "events": [event]}))
    return simulator(str(scenario), vm_name=VM, held=True)


def continuing(sidecar: Sidecar, since: float) -> bool:
    """The sidecar read IMDS and continued the saved watch."""
    return sidecar.value(WATCHING) == since


def watching_then_stopped(tmp_path: Path, simulator: SimulatorFactory, event: dict[str, object],
                          args: tuple[str, ...], kill: bool) -> tuple[Simulator, SimulatorServer, Path, float]:
    """A sidecar continuing a saved hour-long watch of ``event``'s scenario, then stopped: killed -9 (no orderly
    stop) or by SIGTERM (exit 0). The simulator, its server, the state directory and the saved watch's start."""
    sim, server = restart_case(tmp_path, simulator, event)
    state = tmp_path / "state"
    since = watched_for_an_hour(state, server.url)
    first = Sidecar(["--imds-url", server.url, *args, "--state-dir", str(state)], tmp_path / "first")
    try:
        wait_until(lambda: continuing(first, since), timeout=30, what="the sidecar to continue the saved watch")
    finally:
        if kill:
            first.process.kill()
            first.stop()
        else:
            assert first.stop() == 0
    return sim, server, state, since


def test_a_sidecar_stopped_longer_than_the_allowed_gap_warns_for_an_event_announced_and_started_meanwhile(
        simulator: SimulatorFactory, tmp_path: Path, reliability: Reliability) -> None:
    """The sidecar has watched for an hour, is killed (a node drained, a VM rebooted: no orderly stop), and while
    it is down a platform Reboot is announced and starts. Restarted with its state after more than the allowed gap
    (derived from its settings: 6 s at a 0.1 s poll), it first sees the event Started: it cannot know the event
    was announced, so the scrape warns (SeExporterImpactfulEventStartedBeforeWatching) and pages no one, where the
    saved hour-long watch would have paged SeExporterHostFailure."""
    args = ("--poll-interval", "0.1", "--max-backoff", "0.2")
    gap = Settings(poll_interval=0.1, max_backoff=0.2).watch_gap
    assert gap == 6.0
    event = {"EventId": EVENT_ID, "EventType": "Reboot", "EventSource": "Platform", "Resources": [VM],
             "appear_at": 60, "notice": 600, "started_for": 3600}
    sim, server, state, _ = watching_then_stopped(tmp_path, simulator, event, args, kill=True)
    stopped = time.monotonic()
    sim.advance(120)  # announced: Scheduled, 10 minutes of notice, unseen
    sim.advance(600)  # and started
    wait_until(lambda: time.monotonic() - stopped > gap, timeout=gap + 5, what="the allowed gap to pass",
               interval=0.1)
    second = Sidecar(["--imds-url", server.url, *args, "--state-dir", str(state)], tmp_path / "second")
    try:
        text = wait_until(lambda: scrape(second), timeout=30, what="the restarted sidecar to list the event")
    finally:
        second.stop()
    kind = only(text, "SeExporterImpactfulEventStartedBeforeWatching", "Reboot", tmp_path)
    reliability("Alerting", "a platform Reboot announced and started while the sidecar was down longer than its "
                "allowed gap, seen Started by the restarted sidecar with its state, on its scrape under promtool",
                f"SeExporterImpactfulEventStartedBeforeWatching ({kind}) and no page")


def test_a_quick_restart_keeps_the_watch_and_a_host_failure_meanwhile_pages(
        simulator: SimulatorFactory, tmp_path: Path, reliability: Reliability) -> None:
    """A quick pod restart (SIGTERM, started again at once with the state directory) keeps the hour-long watch:
    a host failure that happened meanwhile (an event listed Started with no notice) still pages. (--max-backoff
    makes the allowed gap 20 s: a restart on a busy machine is quick beside it.)"""
    args = ("--poll-interval", "0.05", "--max-backoff", "10")
    gap = Settings(poll_interval=0.05, max_backoff=10).watch_gap
    assert gap == 20.0
    event = {"EventId": EVENT_ID, "EventType": "Reboot", "EventSource": "Platform", "Resources": [VM],
             "appear_at": 60, "started_at_first_sight": True, "started_for": 3600}
    sim, server, state, since = watching_then_stopped(tmp_path, simulator, event, args, kill=False)
    stopped = time.monotonic()
    sim.advance(120)
    second = Sidecar(["--imds-url", server.url, *args, "--state-dir", str(state)], tmp_path / "second")
    try:
        text = wait_until(lambda: scrape(second), timeout=30, what="the restarted sidecar to list the event")
        restarted_in = time.monotonic() - stopped
    finally:
        second.stop()
    assert restarted_in < gap / 2, restarted_in  # quick: within half a gap of the last write, it continues
    assert parse_samples(text).get((WATCHING, frozenset())) == since
    kind = only(text, "SeExporterHostFailure", "Reboot", tmp_path)
    reliability("Alerting", "a host failure while the sidecar restarted quickly with its state, on its scrape "
                "under promtool", f"SeExporterHostFailure ({kind}): the watch continued")
