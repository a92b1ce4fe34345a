"""From IMDS to a page: the simulator feeds sidecars, a real Prometheus scrapes them and evaluates
dashboards/alerts.yaml, Debian's Alertmanager runs the shipped deploy/alertmanager/alertmanager.yml (only the
webhook URL and the group timings shortened) and pages a webhook receiver here."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from se_exporter.sidecar.imds import USER_AGENT
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.server import Simulator, SimulatorServer, start
from tests.conftest import Reliability
from tests.integration.test_prometheus import Prometheus
from tests.support.alerting import ALERTMANAGER_CONFIG, Alertmanager, Notification, Webhook, shortened, tool
from tests.support.helpers import WATCHED_FAST, Sidecar, http_get, wait_until, watched_for_an_hour
from tests.support.promtool import render
from tests.support.promtool import rules as rules_of

pytestmark = pytest.mark.integration
RULES = Path(__file__).parent.parent.parent / "dashboards" / "alerts.yaml"
FLEET_RULES = RULES.parent / "fleet-alerts.yaml"
# The fleet's alerts that go to the VMs' owners, one notification per EventId: Azure announced an event a live
# sidecar did not see. Every other fleet alert concerns the monitoring itself and goes to its operators.
FLEET_MAINTENANCE = {"SeExporterFleetSidecarMissedImpactfulEvent", "SeExporterFleetSidecarMissedFreeze",
                     "SeExporterFleetImpactfulMaintenanceOnManyVms"}
# The sidecars' alerts that go to the VMs' owners: their maintenance (docs/alerting.md).
MAINTENANCE = {"SeExporterImpactfulEventScheduled", "SeExporterImpactfulEventImminent", "SeExporterHostFailure",
               "SeExporterImpactfulEventStartedBeforeWatching",
               "SeExporterLongFreeze", "SeExporterLongFreezeOnLatencySensitiveVm", "SeExporterSpotRebalanceRecommended"}
SCHEDULED, IMMINENT = "SeExporterImpactfulEventScheduled", "SeExporterImpactfulEventImminent"
# The receivers of the shipped configuration: pages and warnings apart, for the VMs' owners and for the monitoring's.
PAGES, WARNINGS = "vm-owners-pages", "vm-owners"
OPERATOR_PAGES, OPERATORS = "se-exporter-operators-pages", "se-exporter-operators"
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")
INTERVAL = 0.5  # Prometheus' scrape and evaluation interval in these tests (production: 15-30 s)
GROUP_WAIT, GROUP_INTERVAL = "2s", "1s"  # shipped: 30 s / 5 s and 1-5 min
CANCELED = "D1C6E3F0-7B2A-4C59-9E1D-3A5B7C9D0E03"  # scenario "canceled": a Reboot, rescheduled, then cancelled
HOST_FAILURE = "6F2D9B41-8C3E-4A7D-B5E0-1C9F8A2B3D04"  # scenario "host-failure": Started at first sight
NEIGHBOUR, OWN = "F1A3B5C7-D9E0-4F2A-8B4C-6D8E0F1A3B08", "0B2C4D6E-8F0A-4B1C-9D3E-5F7A9B1C2D09"  # availability-set
WAVE = "7E1D2C3B-4A59-4687-9A0B-1C2D3E4F5A60"
WAVE_VMS = ["myScaleSet_0", "myScaleSet_1", "myScaleSet_2"]


@dataclass
class Vm:
    sim: Simulator
    process: Sidecar

    @property
    def instance(self) -> str:
        return self.process.base_url.removeprefix("http://")

    def advance_to(self, scenario_time: float) -> None:
        self.sim.advance(max(0.0, scenario_time - self.sim.scenario_time()))


@dataclass
class Pipeline:
    webhook: Webhook
    alertmanager: Alertmanager
    prometheus: Prometheus
    vms: dict[str, Vm]


def wave_scenario(path: Path) -> str:
    path.write_text(json.dumps({"description": "scale-in of three instances", "events": [{
        "EventId": WAVE, "EventType": "Terminate", "Resources": WAVE_VMS, "EventSource": "User",
        "Description": "Virtual machine is being deleted.", "appear_at": 60, "notice": 300, "started_for": 60}]}))
    return str(path)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """One pipeline for the module's stories (a Prometheus takes 5 s to scrape its first target): a simulator and
    a sidecar per VM, one Prometheus scraping them all with the shipped rules, the shipped Alertmanager
    configuration paging a webhook here. Each story has its own VMs and EventIds and drives its own simulators."""
    tmp = tmp_path_factory.mktemp("alerting")
    webhook = Webhook()
    config = shortened(yaml.safe_load(ALERTMANAGER_CONFIG.read_text()), webhook, GROUP_WAIT, GROUP_INTERVAL)
    alertmanager = Alertmanager(config, tmp / "alertmanager")
    stories = {"canceled": ("canceled", None), "host-failure": ("host-failure", None),
               "WestNO_0": ("availability-set", "WestNO_0"), "WestNO_1": ("availability-set", "WestNO_1"),
               **{name: (wave_scenario(tmp / "wave.json"), name) for name in WAVE_VMS}}
    servers: list[SimulatorServer] = []
    vms: dict[str, Vm] = {}
    prom: Prometheus | None = None
    try:
        for key, (scenario, vm_name) in stories.items():
            sim = Simulator(scenarios.load(scenario), vm_name=vm_name)
            servers.append(start(sim))
            watched = key == "host-failure"
            if watched:  # a sidecar that has watched for an hour (its state directory says so)
                watched_for_an_hour(tmp / key / "state", servers[-1].url)
            vms[key] = Vm(sim, Sidecar(["--imds-url", servers[-1].url, *(WATCHED_FAST if watched else FAST)],
                                       tmp / key))
        targets = [vm.instance for vm in vms.values()]
        prom = Prometheus(targets[0], tmp / "prometheus", extra_targets=targets[1:], rule_file=RULES,
                          alertmanager=alertmanager.address, interval=INTERVAL)
        wait_until(lambda: prom.value("count(azure_scheduled_events_up == 1)") == len(targets), timeout=60,
                   what="Prometheus to scrape every sidecar")
        yield Pipeline(webhook, alertmanager, prom, vms)
    finally:
        for vm in vms.values():
            vm.process.stop()
        for server in servers:
            server.shutdown()
            server.server_close()
        if prom is not None:
            prom.stop()
        alertmanager.stop()
        webhook.close()
    assert all(vm.sim.posts_from(USER_AGENT.split("/")[0]) == 0 for vm in vms.values())


def firing(webhook: Webhook, event_id: str) -> list[Notification]:
    return [n for n in webhook.received(event_id=event_id) if n.status == "firing"]


def resolved(webhook: Webhook, event_id: str) -> list[Notification]:
    return [n for n in webhook.received(event_id=event_id) if n.status == "resolved"]


def countdown(summary: str) -> int:
    """Seconds in the summary's 'in 14m 52s' (Prometheus' humanizeDuration)."""
    match = re.search(r" in (?:(\d+)h )?(\d+)m (\d+)s$", summary)
    assert match, summary
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def test_impactful_event_pages_once_and_a_cancellation_resolves_it(pipeline: Pipeline,
                                                                  reliability: Reliability) -> None:
    """A Reboot scheduled for this VM within 15 minutes pages the VM owners' receiver as exactly one notification
    with the rule's labels (the VM's name among them) and its summary (with the countdown to NotBefore), runbook and
    dashboard links; moving its NotBefore 20 minutes later turns the page into a warning; its cancellation resolves
    that."""
    vm, webhook = pipeline.vms["canceled"], pipeline.webhook
    page = wait_until(lambda: firing(webhook, CANCELED), timeout=60, what="the page")[0]

    assert page.receiver == PAGES
    assert page.payload["groupLabels"] == {"alertname": IMMINENT, "event_id": CANCELED}
    [alert] = page.alerts
    labels = {"alertname": IMMINENT, "event_id": CANCELED, "event_type": "Reboot", "event_status": "Scheduled",
              "event_source": "Platform", "instance": vm.instance, "job": "se-exporter", "severity": "critical",
              "vm_name": vm.sim.vm["name"], "location": vm.sim.vm["location"],
              "subscription_id": vm.sim.vm["subscriptionId"], "resource_group": vm.sim.vm["resourceGroupName"]}
    assert alert["labels"] == labels
    seconds = countdown(alert["annotations"]["summary"])
    assert 700 < seconds <= 900, alert["annotations"]["summary"]
    rule = rules_of(RULES)[IMMINENT]
    assert alert["annotations"] == {key: render(template, labels, seconds)
                                    for key, template in rule["annotations"].items()}
    assert alert["annotations"]["summary"].startswith(
        f"Reboot of {vm.sim.vm['name']} ({vm.sim.vm['location']}, {vm.instance}) in ")

    vm.advance_to(130)  # NotBefore moved 20 minutes later: no page any more, a warning
    wait_until(lambda: vm.process.total("azure_scheduled_events_transitions_total", event_type="Reboot",
                                        transition="rescheduled") == 1, what="the reschedule")
    warning = wait_until(lambda: [n for n in firing(webhook, CANCELED) if n.alerts[0]["labels"]["alertname"] ==
                                  SCHEDULED], timeout=60, what="the warning")[0]
    assert (warning.receiver, warning.alerts[0]["labels"]["severity"]) == (WARNINGS, "warning")
    vm.advance_to(310)  # removed without starting: cancelled
    wait_until(lambda: [n for n in resolved(webhook, CANCELED) if n.alerts[0]["labels"]["alertname"] == SCHEDULED],
               timeout=60, what="the warning to resolve")
    assert vm.process.total("azure_scheduled_events_transitions_total", event_type="Reboot",
                            transition="canceled") == 1
    assert [n.alerts[0]["labels"]["alertname"] for n in firing(webhook, CANCELED)] == [IMMINENT, SCHEDULED], \
        webhook.notifications
    reliability("Alerting", "a Reboot scheduled for the VM, rescheduled, then cancelled", "one page with the rule's "
                "labels, the VM's name, summary, countdown and links; a warning once rescheduled far; resolved on "
                "cancel")


def test_host_failure_pages_at_once_as_one_notification_and_completion_resolves_it(
        pipeline: Pipeline, reliability: Reliability) -> None:
    """An event Started at first sight by a sidecar that has been watching (its state directory continued) fires
    SeExporterHostFailure at the first evaluation that sees it (no `for` wait) and pages once, and nothing else for
    the event (SeExporterImpactfulEventImminent is for events seen Scheduled first); its completion resolves the
    page."""
    vm, webhook, prom = pipeline.vms["host-failure"], pipeline.webhook, pipeline.prometheus
    page = wait_until(lambda: firing(webhook, HOST_FAILURE), timeout=60, what="the page")[0]

    [alert] = page.alerts
    assert (page.receiver, alert["labels"]["alertname"], alert["labels"]["severity"]) == \
        (PAGES, "SeExporterHostFailure", "critical")
    assert alert["annotations"]["summary"] == (f"Reboot with no notice on {vm.sim.vm['name']} "
                                               f"({vm.sim.vm['location']}, {vm.instance}): host failure")
    assert [a["labels"]["alertname"] for a in pipeline.alertmanager.alerts(event_id=HOST_FAILURE)] == \
        ["SeExporterHostFailure"]

    # At once: active from the first evaluations after the first scrape that saw the event, no `for` wait.
    samples = prom.query(f'azure_scheduled_event_started_timestamp_seconds{{event_id="{HOST_FAILURE}"}}[10m]')
    first_seen = float(samples[0]["values"][0][0])  # type: ignore[index]
    active = [a for group in prom_rules(prom) for rule in group["rules"] if rule["name"] == "SeExporterHostFailure"
              for a in rule["alerts"] if a["labels"]["event_id"] == HOST_FAILURE]
    assert active and active[0]["state"] == "firing"
    active_at = _unix(active[0]["activeAt"])
    assert 0 <= active_at - first_seen <= 2 * INTERVAL, (first_seen, active_at)

    vm.advance_to(310)  # gone after 300 s Started: completed
    wait_until(lambda: resolved(webhook, HOST_FAILURE), timeout=60, what="the page to resolve")
    assert vm.process.total("azure_scheduled_events_transitions_total", event_type="Reboot",
                            transition="completed") == 1
    assert len(firing(webhook, HOST_FAILURE)) == 1, webhook.notifications
    assert not webhook.received(alertname=IMMINENT, event_id=HOST_FAILURE), webhook.notifications
    reliability("Alerting", "a host failure (Started at first sight by a sidecar whose state says it has watched)",
                "paged at the first evaluation, once, and nothing else for the event; resolved on completion")


def test_an_event_for_another_vm_of_the_availability_set_does_not_page_this_vm(pipeline: Pipeline,
                                                                              reliability: Reliability) -> None:
    """Two VMs of an availability set both see a Reboot that lists only WestNO_1: the page names WestNO_1's
    exporter and never WestNO_0's; WestNO_0 is paged when an event lists it."""
    this_vm, other_vm, webhook = pipeline.vms["WestNO_0"], pipeline.vms["WestNO_1"], pipeline.webhook
    page = wait_until(lambda: firing(webhook, NEIGHBOUR), timeout=60, what="the neighbour's page")[0]
    assert [a["labels"]["instance"] for a in page.alerts if a["labels"]["event_id"] == NEIGHBOUR] == \
        [other_vm.instance]
    assert this_vm.process.value("azure_scheduled_event_info", event_id=NEIGHBOUR, event_type="Reboot",
                                 event_status="Scheduled", event_source="Platform", resource_type="VirtualMachine",
                                 affects_this_vm="false") == 1  # this VM's exporter lists it too

    for vm in (this_vm, other_vm):
        vm.advance_to(1110)  # the Reboot that lists WestNO_0 appears
    own = wait_until(lambda: firing(webhook, OWN), timeout=60, what="this VM's page")[0]
    assert [a["labels"]["instance"] for a in own.alerts if a["labels"]["event_id"] == OWN] == [this_vm.instance]
    paged_for_neighbour = {a["labels"]["instance"] for n in firing(webhook, NEIGHBOUR) for a in n.alerts
                           if a["labels"]["event_id"] == NEIGHBOUR}
    assert paged_for_neighbour == {other_vm.instance}, webhook.notifications
    reliability("Alerting", "an availability set's event that lists only the neighbour", "the neighbour is paged, "
                "this VM is not")


def test_a_scale_in_wave_is_one_warning_never_a_page(pipeline: Pipeline, reliability: Reliability) -> None:
    """One scale-in Terminate (EventSource User) listing three scale-set instances, seen by each instance's exporter,
    is one notification (grouped by EventId) that names all three VMs: a warning to the owners' queue, never a
    page (they asked for it)."""
    wave = [pipeline.vms[name] for name in WAVE_VMS]
    for vm in wave:
        vm.advance_to(61)
    wait_until(lambda: firing(pipeline.webhook, WAVE), timeout=60, what="the page")
    wait_until(lambda: len(pipeline.alertmanager.alerts(event_id=WAVE)) == 3, timeout=30, what="three alerts")
    pages = firing(pipeline.webhook, WAVE)
    assert len(pages) == 1, pages
    assert sorted(a["labels"]["instance"] for a in pages[0].alerts) == sorted(vm.instance for vm in wave)
    assert pages[0].payload["groupLabels"] == {"alertname": SCHEDULED, "event_id": WAVE}
    assert pages[0].receiver == WARNINGS
    assert sorted(a["labels"]["vm_name"] for a in pages[0].alerts) == WAVE_VMS
    assert not pipeline.alertmanager.alerts(event_id=WAVE, severity="critical")
    reliability("Alerting", "a three-VM scale-in wave (EventSource User) through Prometheus and the shipped "
                "Alertmanager configuration", "one warning naming the three VMs; no page")


def test_shipped_alertmanager_configuration(tmp_path: Path) -> None:
    """amtool accepts the shipped configuration; maintenance pages group by EventId, exporter pages by VM, and
    every alert its routes and inhibitions name is one that dashboards/alerts.yaml defines."""
    result = subprocess.run([tool("amtool"), "check-config", str(ALERTMANAGER_CONFIG)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    route = config["route"]
    assert route["group_by"] == ["alertname", "job", "instance"]
    maintenance, operator_pages = route["routes"]
    assert maintenance["group_by"] == ["alertname", "event_id"] and maintenance["receiver"] == WARNINGS
    assert operator_pages == {"matchers": ['severity="critical"'], "receiver": OPERATOR_PAGES, "group_wait": "5s",
                              "group_interval": "1m", "repeat_interval": "1h"}
    defined = set(rules_of(RULES)) | set(rules_of(FLEET_RULES))
    named: set[str] = set()
    for inhibit in config["inhibit_rules"]:
        for matcher in inhibit["source_matchers"] + inhibit["target_matchers"]:
            name, _, value = matcher.partition("=")
            assert name == "alertname"
            pattern = value.lstrip("~").strip('"')
            matched = {alert for alert in defined if re.fullmatch(pattern, alert)}
            assert matched, f"{matcher} matches no alert of the rule files"
            named |= matched
    assert {"SeExporterLongFreezeOnLatencySensitiveVm", "SeExporterDown", "SeExporterFleetBlind"} <= named
    assert all(receiver["webhook_configs"][0]["send_resolved"] for receiver in config["receivers"])


def test_every_alert_of_both_rule_files_reaches_its_receiver_through_the_shipped_routes() -> None:
    """amtool routes each alert of alerts.yaml and fleet-alerts.yaml, with the labels its rule sets, in a scale set
    and outside one: maintenance (a VM's events, and the fleet's events a live sidecar missed) to the VMs' owners,
    the rest to the monitoring's operators, and in both a page (severity critical) to the pages receiver, a warning
    to the other; so does the same alert with its severity overridden either way. Every alertname a route matches
    on names an alert of the two files."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    defined = {**rules_of(RULES), **rules_of(FLEET_RULES)}
    for route in config["route"]["routes"]:
        for matcher in route["matchers"]:
            if not matcher.startswith("alertname"):
                continue
            pattern = matcher.partition("=")[2].lstrip("~").strip('"')
            assert {alert for alert in defined if re.fullmatch(pattern, alert)}, f"{matcher} matches no alert"
    routed = []
    for alert, rule in defined.items():
        for severity in {rule["labels"]["severity"], "critical", "warning"}:
            for place in ([], ["vmss_name=web"]):
                pages, warnings = ((PAGES, WARNINGS) if alert in MAINTENANCE | FLEET_MAINTENANCE
                                   else (OPERATOR_PAGES, OPERATORS))
                receiver = pages if severity == "critical" else warnings
                labels = [f"alertname={alert}", "event_id=E", f"severity={severity}", *place]
                result = subprocess.run([tool("amtool"), "config", "routes", "test",
                                         f"--config.file={ALERTMANAGER_CONFIG}", f"--verify.receivers={receiver}",
                                         *labels], capture_output=True, text=True, timeout=60, check=False)
                assert result.returncode == 0, f"{alert} {severity} {place}: {result.stdout}{result.stderr}"
                routed.append(severity == "critical")
    assert any(routed) and not all(routed)  # both kinds tried


def test_warnings_repeat_at_most_every_12_hours_and_pages_hourly() -> None:
    """Every route of the shipped configuration repeats a warning at most every 12 h (a Redeploy announced 7 days
    ahead is 14 notifications, not 168), a page every hour; no receiver takes both pages and warnings."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())

    def walk(route: dict[str, Any], inherited: dict[str, Any]) -> Iterator[dict[str, Any]]:
        merged = {**inherited, **{k: v for k, v in route.items() if k != "routes"}}
        yield merged
        for child in route.get("routes", []):
            yield from walk(child, merged)

    routes = list(walk(config["route"], {}))
    pages = [r for r in routes if 'severity="critical"' in r.get("matchers", [])]
    warnings = [r for r in routes if r not in pages]
    assert pages and warnings
    assert {r["repeat_interval"] for r in warnings} == {"12h"}
    assert {r["repeat_interval"] for r in pages} == {"1h"}
    assert {r["receiver"] for r in pages} == {PAGES, OPERATOR_PAGES}
    assert not {r["receiver"] for r in pages} & {r["receiver"] for r in warnings}


def prom_rules(prom: Prometheus) -> list[dict[str, Any]]:
    status, body = http_get(f"{prom.url}/api/v1/rules?type=alert")
    assert status == 200, body
    return json.loads(body)["data"]["groups"]  # type: ignore[no-any-return]


def _unix(rfc3339: str) -> float:
    text = re.sub(r"(\.\d{6})\d+", r"\1", rfc3339.replace("Z", "+00:00"))
    return datetime.fromisoformat(text).timestamp()


def test_a_wave_is_one_notification_per_scale_set_or_per_event(tmp_path: Path) -> None:
    """Through the shipped routing, a wave of pages is one notification per scale set (its VMs' events each have
    their own EventId) and one per EventId outside scale sets (an availability set's event lists all its VMs), each
    naming every VM it concerns; never one per VM."""
    webhook = Webhook()
    config = shortened(yaml.safe_load(ALERTMANAGER_CONFIG.read_text()), webhook, GROUP_WAIT, GROUP_INTERVAL)
    alertmanager = Alertmanager(config, tmp_path / "alertmanager")
    try:
        def page(vm: str, event_id: str, vmss: str) -> dict[str, Any]:
            return {"labels": {"alertname": IMMINENT, "severity": "critical", "job": "se-exporter",
                               "instance": f"{vm}:10169", "vm_name": vm, "event_id": event_id,
                               "event_type": "Reboot", **({"vmss_name": vmss} if vmss else {})}}

        alerts = [*(page(f"web_{n}", f"E-web-{n}", "web") for n in range(3)),
                  *(page(f"db_{n}", f"E-db-{n}", "db") for n in range(2)),
                  *(page(f"legacy_{n}", "E-avset", "") for n in range(4))]
        request = urllib.request.Request(f"{alertmanager.url}/api/v2/alerts", data=json.dumps(alerts).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200

        def grouped() -> dict[str, list[str]]:
            return {n.payload["groupKey"]: sorted(a["labels"]["vm_name"] for a in n.alerts)
                    for n in webhook.notifications if n.status == "firing"}

        wait_until(lambda: sum(len(vms) for vms in grouped().values()) == len(alerts), timeout=30,
                   what="every alert notified")
        assert sorted(grouped().values()) == [["db_0", "db_1"], [f"legacy_{n}" for n in range(4)],
                                              [f"web_{n}" for n in range(3)]]
        assert {n.receiver for n in webhook.notifications} == {PAGES}
    finally:
        alertmanager.stop()
        webhook.close()
