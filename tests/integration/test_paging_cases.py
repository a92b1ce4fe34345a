"""Every paging case of docs/alerting.md on the real sidecar's own scrapes: the simulator serves the event, a real
`se-exporter run` polls it, and what its /metrics says at that moment is promtool's input to the shipped rules
(dashboards/alerts.yaml). Each case says which alert fires and that every other alert of the file stays silent, so a
page that should not be (a scale-in, a Spot eviction, a restart from the portal, a Reboot first seen Started by a pod
that just started) fails here as it would wake someone."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from se_exporter.sidecar.lifecycle_store import LifecycleStore
from tests import promtool
from tests.conftest import Reliability, SimulatorFactory
from tests.fleet_overlap import promtool_series
from tests.helpers import Sidecar, http_get, parse_samples, wait_until

pytestmark = pytest.mark.integration
RULES = Path(__file__).parent.parent.parent / "dashboards" / "alerts.yaml"
VM = "web_0"
TARGET = {"job": "se-exporter", "instance": "10.0.0.4:10169"}  # the labels the scrape adds
EVENT_ID = "A1B2C3D4-0000-4000-8000-00000000CA5E"
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")


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
    if case.watched:  # what a sidecar that ran for an hour leaves behind (restored state counts as watching)
        LifecycleStore(state, scope=server.url).save({}, watching_since=time.time() - 3600)
    process = Sidecar(["--imds-url", server.url, *FAST, "--state-dir", str(state)], tmp_path / "sidecar")
    try:
        text = wait_until(lambda: scrape(process), timeout=30, what="the sidecar to list the event")
    finally:
        process.stop()
    series = promtool_series(text, TARGET, 5)
    samples = parse_samples(text)
    [vm_info] = [dict(own) for name, own in samples if name == "azure_scheduled_events_vm_info"]
    identity = {key: vm_info[key] for key in ("vm_name", "vmss_name", "location", "subscription_id",
                                                "resource_group") if vm_info.get(key)}
    labels = {**TARGET, **identity, "event_id": EVENT_ID, "event_type": case.event_type}
    value = 0.0
    if case.fires in ("SeExporterImpactfulEventScheduled", "SeExporterImpactfulEventImminent"):
        labels |= {"event_status": "Scheduled" if case.notice is not None else "Started", "event_source": case.source}
        [value] = [v for (name, own), v in samples.items()
                   if name == "azure_scheduled_event_seconds_until_not_before" and dict(own)["event_id"] == EVENT_ID]
    cases: list[promtool.Case] = [(alert, series, "1m", [(labels, value)] if alert == case.fires else [])
                                  for alert in promtool.rules(RULES)]
    promtool.run_rule_tests(RULES, cases, tmp_path)
    kind = {"critical": "a page", "warning": "a warning"}[promtool.rules(RULES)[case.fires]["labels"]["severity"]]
    reliability("Alerting", f"{case.name}, on the real sidecar's scrape under promtool with the shipped rules",
                f"{case.fires} ({kind}) and no other alert")
