"""The two streams on a real Prometheus and the shipped Alertmanager configuration: two fleet replicas whose
platform series the core writes as the fleet does (tests/support/fleet_two_streams.py), beside the sidecars' stream
(tests/support/fleet_overlap.py). Every platform panel of the fleet dashboard lights up, counts each EventId once and
adds up the VMs the replicas judged; the platform rules page the VM owners once per event, warn the operators of VMs
without a sidecar (at a hand-over, when one replica shows every partition), and resolve when the event ends."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Reliability
from tests.integration.test_dashboards import DASHBOARDS, StaticTarget, dashboard_expressions, substitute
from tests.integration.test_prometheus import Prometheus
from tests.support import fleet_overlap, fleet_two_streams
from tests.support.alerting import ALERTMANAGER_CONFIG, Alertmanager, Notification, Webhook, shortened
from tests.support.helpers import wait_until
from tests.support.promtool import render
from tests.support.promtool import rules as rules_of

pytestmark = pytest.mark.integration
RULES = DASHBOARDS / "fleet-alerts.yaml"
DASHBOARD = "se-exporter-fleet-events"
JOB = "se-exporter-fleet"
INTERVAL = 0.5  # Prometheus' scrape and evaluation interval here (production: 15-30 s)
# The series of the platform stream; every dashboard query and rule naming one is checked here.
PLATFORM = re.compile(r"azure_scheduled_fleet_(platform_event_info|platform_event_vms|platform_events_total|"
                      r"platform_duplicates_total|missed_events_total|unannounced_events_total|"
                      r"announcement_lag_seconds(?:_bucket|_sum|_count)?|impact_seconds_total)\b")
PLATFORM_RULES = ("SeExporterFleetSidecarMissedImpactfulEvent", "SeExporterFleetSidecarMissedFreeze",
                  "SeExporterFleetAnnouncedEventOnVmsWithoutSidecar")
SHORTENED_FOR = {"SeExporterFleetAnnouncedEventOnVmsWithoutSidecar": "1s"}  # shipped: 5m
COVERAGES = ("observed", "missed", "imds_unreachable", "no_sidecar")
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Counters' increase() over a range extrapolates past the first and last samples by up to half a scrape interval
# each side: the shown value is the counted one times at most this (the samples span well over 5 intervals here).
EXTRAPOLATION = 1.25


def show(a: StaticTarget, b: StaticTarget, counted: bool, informed: bool = True, handover: bool = False,
         ended: str | None = None) -> None:
    """Both replicas' /metrics: the sidecars' stream and the platform's in the steady split or at a hand-over, the
    counters at zero or counted, the info series left out (``informed``), and ``ended``'s status moved to Completed
    (on the replicas that show it)."""
    platform = (fleet_two_streams.handover if handover else fleet_two_streams.split)(counted)
    if ended:
        platform = (fleet_two_streams.ended(platform[0], ended), fleet_two_streams.ended(platform[1], ended))
    if not informed:
        platform = (without_info(platform[0]), without_info(platform[1]))
    sidecars = fleet_overlap.replicas()
    a.body, b.body = beside(sidecars[0], platform[0]), beside(sidecars[1], platform[1])


def beside(sidecars: str, platform: str) -> str:
    """One replica's /metrics: the sidecars' families, less those the platform's text writes (a fleet whose
    FleetMetrics creates the platform's counters at zero would write them twice), then the platform's."""
    names = {line.split()[2] for line in platform.split("\n") if line.startswith(("# HELP ", "# TYPE "))}
    names |= {METRIC_NAME.match(line).group(0) for line in platform.split("\n")  # type: ignore[union-attr]
              if line and not line.startswith("#")}

    def kept(line: str) -> bool:
        if line.startswith(("# HELP ", "# TYPE ")):
            return line.split()[2] not in names
        match = METRIC_NAME.match(line)
        return match is None or match.group(0) not in names

    return "\n".join(line for line in sidecars.split("\n") if kept(line)) + platform


def without_info(text: str) -> str:
    return "\n".join(line for line in text.split("\n")
                     if not line.startswith("azure_scheduled_fleet_platform_event_info{"))


@dataclass
class Streams:
    a: StaticTarget
    b: StaticTarget
    prometheus: Prometheus
    webhook: Webhook


def shortened_rules(path: Path) -> Path:
    """fleet-alerts.yaml with only the `for` of SHORTENED_FOR shortened: a test cannot wait five minutes."""
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            if rule["alert"] in SHORTENED_FOR:
                rule["for"] = SHORTENED_FOR[rule["alert"]]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Streams]:
    """Two replicas scraped in one job, their counters at zero and then counted (so a range's increase shows
    them), the shipped rules evaluated, the shipped Alertmanager configuration paging a webhook here. The info series
    come with the counters: the VM counts of both replicas are scraped by then, so an alert's first evaluation sees
    them all (each EventId's info is on one replica: its appearing is one scrape)."""
    tmp = tmp_path_factory.mktemp("two-streams")
    webhook = Webhook()
    alertmanager = Alertmanager(shortened(yaml.safe_load(ALERTMANAGER_CONFIG.read_text()), webhook, "2s", "1s"),
                                tmp / "alertmanager")
    a, b = StaticTarget(), StaticTarget()
    prom: Prometheus | None = None

    def samples() -> float:
        """The fewest samples Prometheus holds of one replica's series over the last minute."""
        return prom.value(f'min(count_over_time(azure_scheduled_fleet_platform_duplicates_total{{job="{JOB}"}}'
                          '[1m]))') or 0.0 if prom else 0.0

    try:
        show(a, b, counted=False, informed=False)
        prom = Prometheus(a.address, tmp / "prometheus", extra_targets=[b.address], job_name=JOB,
                          rule_file=shortened_rules(tmp / "fleet-alerts.yaml"), alertmanager=alertmanager.address,
                          interval=INTERVAL)
        wait_until(lambda: samples() >= 4, timeout=30, what="Prometheus to scrape both replicas, counters at 0")
        show(a, b, counted=True)
        total = float(len(fleet_two_streams.Fleet().missed))
        wait_until(lambda: prom.value(f'sum(azure_scheduled_fleet_missed_events_total{{job="{JOB}"}})') == total,
                   timeout=30, what="Prometheus to see the counters move")
        wait_until(lambda: samples() >= 12, timeout=30, what="samples after counting")
        yield Streams(a, b, prom, webhook)
    finally:
        if prom is not None:
            prom.stop()
        a.stop()
        b.stop()
        alertmanager.stop()
        webhook.close()


def platform_queries() -> dict[str, list[str]]:
    """Title -> expressions of every fleet dashboard panel that reads the platform stream."""
    found: dict[str, list[str]] = {}
    for name, expr in dashboard_expressions(fleet_consumer=True):
        dashboard, _, rest = name.partition(": ")
        if dashboard == DASHBOARD and PLATFORM.search(expr):
            found.setdefault(rest.rsplit(" [", 1)[0], []).append(expr)
    return found


def rows(result: list[dict[str, Any]], keys: tuple[str, ...]) -> list[tuple[tuple[str, ...], float]]:
    return [(tuple(row["metric"].get(key, "") for key in keys), float(row["value"][1])) for row in result]


def one_each(found: list[tuple[tuple[str, ...], float]]) -> dict[tuple[str, ...], float]:
    """The rows as a dict, each key at most once (a second row would be an EventId counted twice)."""
    repeated = [key for key, count in Counter(key for key, _ in found).items() if count > 1]
    assert not repeated, f"rows shown twice: {repeated}"
    return dict(found)


def counted(shown: dict[tuple[str, ...], float], expected: dict[tuple[str, ...], float]) -> bool:
    """A counter panel shows the counted values, up to increase()'s extrapolation, never twice them."""
    return shown.keys() == expected.keys() and all(
        expected[key] <= value <= expected[key] * EXTRAPOLATION for key, value in shown.items())


def missed_totals() -> dict[tuple[str, ...], float]:
    return {key: float(count) for key, count in Counter(fleet_two_streams.Fleet().missed).items()}


# Title -> per query, the labels its rows are keyed by and what they must show: the gauges' figures, exact.
ONE = ("event_id",)
GAUGES: dict[str, list[tuple[tuple[str, ...], dict[tuple[str, ...], float]]]] = {
    "Events announced by Azure, open": [((), {(): fleet_two_streams.OPEN_EVENTS})],
    "VMs a live sidecar missed": [((), {(): 5.0})],  # E-big's 2 missed and 1 imds_unreachable, E-fz's, E-done's
    "VMs without a sidecar": [((), {(): 0.0})],  # judged only by a replica that shows every partition: neither
    "Announced by Azure": [
        (("event_id", "event_status"), {(key[0], shown[1]): 1.0 for key, shown in fleet_two_streams.ANNOUNCED.items()}),
        *((ONE, {key: float(shown[2 + index]) for key, shown in fleet_two_streams.ANNOUNCED.items()})
          for index in range(len(COVERAGES)))],
    "Blind spots": [(("event_id", "coverage"), fleet_two_streams.BLIND_ROWS)],
}


def test_every_platform_panel_and_rule_is_checked() -> None:
    """A panel or rule added on the platform stream's series is added to the checks below."""
    assert set(platform_queries()) == set(GAUGES) | {
        "Impact this month", "Impact this month by scale set, region and type", "Missed events (range)",
        "Unannounced events (range)", "Announcement lag (range)", "Dropped messages"}
    assert {alert for alert, rule in rules_of(RULES).items() if PLATFORM.search(rule["expr"])} == set(PLATFORM_RULES)


def test_platform_panels_light_up_and_count_each_event_once(streams: Streams, reliability: Reliability) -> None:
    """On two replicas that split the VMs (E-big's on both), each platform panel returns data, every gauge figure is
    the fleet's (each EventId once, its VMs added up over the replicas that judged them), every per-event table
    lists each EventId once, and the counters show what was counted."""
    prom, queries, wrong = streams.prometheus, platform_queries(), []

    def query(expr: str) -> list[dict[str, Any]]:
        return prom.query(substitute(expr))

    for title, expected in GAUGES.items():
        for expr, (keys, want) in zip(queries[title], expected, strict=True):
            shown = one_each(rows(query(expr), keys))
            if shown != want:
                wrong.append(f"{title}: shows {shown}, the fleet has {want}")
    blind = query(queries["Blind spots"][0])
    assert {row["metric"]["event_id"]: row["metric"]["scope_name"] for row in blind} == {
        "E-big": "big", "E-fz": "ss", "E-done": "big"}

    impact = fleet_two_streams.IMPACT
    counters: list[tuple[str, tuple[str, ...], dict[tuple[str, ...], float]]] = [
        ("Impact this month", (), {(): sum(impact.values())}),
        ("Impact this month by scale set, region and type", ("event_type", "scope_name", "location"), impact),
        ("Missed events (range)", ("event_type", "reason"), missed_totals()),
        ("Unannounced events (range)", ("event_type",), fleet_two_streams.UNANNOUNCED)]
    for title, keys, total in counters:
        [expr] = queries[title]
        shown = one_each(rows(query(expr), keys))
        if not counted(shown, total):
            wrong.append(f"{title}: shows {shown}, counted {total}")
    lags = [value for expr in queries["Announcement lag (range)"] for _, value in rows(query(expr), ())]
    observed = fleet_two_streams.Fleet().lags  # the quantiles fall in the buckets that hold what was observed
    low = max((bound for bound in fleet_two_streams.LAG_BUCKETS if bound < min(observed)), default=-float("inf"))
    high = min(bound for bound in fleet_two_streams.LAG_BUCKETS if bound >= max(observed))
    if len(lags) != 2 or not all(low < lag <= high for lag in lags):
        wrong.append(f"Announcement lag (range): shows {lags}, observed {observed}")
    [duplicates] = queries["Dropped messages"]
    if rows(query(duplicates), ()) != [((), 0.0)]:
        wrong.append(f"Dropped messages: platform duplicates show {query(duplicates)}")
    assert not wrong, "\n".join(wrong)
    reliability("Fleet", "the platform stream's dashboard panels on a real Prometheus scraping two replicas that "
                "split an event's VMs", "every panel returned data; each EventId once, its VMs added up over the "
                "replicas; the counters showed what was counted")


def firing(webhook: Webhook, **labels: str) -> list[Notification]:
    return [n for n in webhook.received(**labels) if n.status == "firing"]


def expected_alert(alert: str, labels: dict[str, str], value: float,
                   vms: str) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations Alertmanager must carry for one alert of the shipped rules; ``vms``: the VMs its
    `vms` annotation names (the fleet's own list of them, tests/support/fleet_two_streams.py's VMs)."""
    rule = rules_of(RULES)[alert]
    labels = {"alertname": alert, "job": JOB, **labels, **rule["labels"]}
    annotations = {key: render(template, labels, value) for key, template in rule["annotations"].items()}
    return labels, annotations | {"vms": vms}


def test_platform_alerts_page_the_owners_once_per_event_warn_the_operators_and_resolve(
        streams: Streams, reliability: Reliability) -> None:
    """Through the shipped routing: E-big's Reboot, which three live sidecars on two replicas missed, is one
    critical notification to vm-owners-pages grouped by EventId, counting the 3 VMs; E-fz's missed Freeze a warning to
    them; at a hand-over, where one replica shows every partition, the VMs without a sidecar are one notification
    to se-exporter-operators; the ended E-done never pages; E-big's completion resolves its page."""
    webhook = streams.webhook
    scope = {"scope_type": "scale_set", "location": "westeurope"}
    page = wait_until(lambda: firing(webhook, alertname="SeExporterFleetSidecarMissedImpactfulEvent"), timeout=60,
                      what="the page")[0]
    assert (page.receiver, page.payload["groupLabels"]) == (
        "vm-owners-pages", {"alertname": "SeExporterFleetSidecarMissedImpactfulEvent", "event_id": "E-big"})
    [alert] = page.alerts
    assert (alert["labels"], alert["annotations"]) == expected_alert(
        "SeExporterFleetSidecarMissedImpactfulEvent", {"event_id": "E-big", "event_type": "Reboot", "scope_name": "big",
                                             **scope}, 3,
        "big_3 (missed) big_4 (imds_unreachable) big_8 (missed) ")

    freeze = wait_until(lambda: firing(webhook, alertname="SeExporterFleetSidecarMissedFreeze"), timeout=60,
                        what="the Freeze warning")[0]
    assert freeze.receiver == "vm-owners"
    assert [(a["labels"], a["annotations"]) for a in freeze.alerts] == [expected_alert(
        "SeExporterFleetSidecarMissedFreeze", {"event_id": "E-fz", "event_type": "Freeze", "scope_name": "ss",
                                               **scope}, 1, "ss_1 (missed) ")]

    show(streams.a, streams.b, counted=True, handover=True)

    def blind_spots() -> list[Notification]:
        found = firing(webhook, alertname="SeExporterFleetAnnouncedEventOnVmsWithoutSidecar")
        return [n for n in found if len(n.alerts) == 2]

    warning = wait_until(blind_spots, timeout=60, what="both events with VMs without a sidecar")[0]
    queries = platform_queries()  # at the hand-over, E-big and E-dark's info on both replicas: each EventId once
    [opened] = queries["Events announced by Azure, open"]
    assert rows(streams.prometheus.query(substitute(opened)), ()) == [((), fleet_two_streams.OPEN_EVENTS)]
    listed = one_each(rows(streams.prometheus.query(substitute(queries["Announced by Azure"][0])), ONE))
    assert listed == dict.fromkeys(fleet_two_streams.ANNOUNCED, 1.0)
    assert warning.receiver == "se-exporter-operators"
    assert {a["labels"]["event_id"]: (a["labels"], a["annotations"]) for a in warning.alerts} == {
        "E-big": expected_alert("SeExporterFleetAnnouncedEventOnVmsWithoutSidecar",
                                {"event_id": "E-big", "event_type": "Reboot", "scope_name": "big", **scope}, 1,
                                "big_5 (no_sidecar) "),
        "E-dark": expected_alert("SeExporterFleetAnnouncedEventOnVmsWithoutSidecar",
                                 {"event_id": "E-dark", "event_type": "Redeploy", "scope_name": "dark",
                                  "location": "westeurope", "scope_type": "availability_set"}, 2,
                                 "dark_0 (no_sidecar) dark_1 (no_sidecar) ")}

    show(streams.a, streams.b, counted=True, handover=True, ended="E-big")
    wait_until(lambda: [n for n in webhook.received(event_id="E-big",
                                                    alertname="SeExporterFleetSidecarMissedImpactfulEvent")
                        if n.status == "resolved"], timeout=60, what="the page to resolve")
    assert len(firing(webhook, alertname="SeExporterFleetSidecarMissedImpactfulEvent")) == 1, webhook.notifications
    assert not webhook.received(event_id="E-done"), webhook.notifications  # it ended: a miss to count, not a page
    reliability("Alerting", "Azure announced a Reboot three live sidecars on two fleet replicas missed, through a "
                "real Prometheus and the shipped Alertmanager configuration", "one critical notification to the VM "
                "owners counting 3 VMs; a missed Freeze a warning; VMs without a sidecar one warning to the "
                "operators; not paged again through a hand-over; resolved on Completed; an ended event never paged")
