"""The fleet dashboard's queries on a real Prometheus scraping two replicas caught in a partition hand-over (both
expose partition 1's VMs, tests/support/fleet_overlap.py): every fleet total is the distinct count, every per-VM list
shows each VM once."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_dashboards import StaticTarget, dashboard_expressions, substitute
from tests.integration.test_prometheus import Prometheus
from tests.support import fleet_overlap
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration
# Series a replica shows per VM, and the per-replica totals counted from them: a panel reading either shows the
# fleet's state and must count each VM once.
FLEET_STATE = re.compile(r"azure_scheduled_fleet_(event_info|event_seconds_until_not_before|event_duration_seconds|"
                         r"vm_last_seen_timestamp_seconds|vm_imds_unreachable_since_timestamp_seconds|vms|pending_vms|"
                         r"event_vms|imds_unreachable_vms)\b")
DASHBOARD = "se-exporter-fleet-events"
# Panel title -> the labels its rows are keyed by, and what each row must show: a number of distinct VMs.
TOTALS: dict[str, tuple[tuple[str, ...], dict[tuple[str, ...], float]]] = {
    "VMs known": ((), {(): fleet_overlap.VMS}),
    "VMs facing impactful maintenance": ((), {(): fleet_overlap.IMPACTFUL_VMS}),
    "VMs in maintenance now": ((), {(): fleet_overlap.STARTED_VMS}),
    "Blast radius: VMs per event": (("event_id", "event_type"), fleet_overlap.EVENT_VMS),
    "VMs with events by scale set": (("vmss_name", "event_type"), fleet_overlap.VMSS_VMS),
    "Pending VMs by type and status": (("event_type", "event_status"), fleet_overlap.PENDING_VMS),
    "VMs that cannot read IMDS": ((), {(): fleet_overlap.UNREACHABLE_VMS}),
}
# Panel title -> the labels that name one row, and the rows it must show, each once.
LISTS: dict[str, tuple[tuple[str, ...], Counter[tuple[str, ...]]]] = {
    "Upcoming maintenance by VM": (("vm_id", "event_id"), Counter(
        [(f"id-big_{i}", "E-big") for i in range(6)] + [(f"id-ss_{i}", "E-ss") for i in range(4)])),
    "Quietest VMs": (("vm_id",), Counter((vm_id,) for vm_id in fleet_overlap.VM_IDS)),
    "VMs that cannot read IMDS: time since their last successful read": (("vm_id",), Counter([("id-blind",)])),
}


@pytest.fixture
def overlapping_replicas(tmp_path: Path) -> Iterator[Prometheus]:
    """A real Prometheus scraping replica A and replica B in one job, as it would scrape two fleet pods."""
    a, b = StaticTarget(), StaticTarget()
    a.body, b.body = fleet_overlap.replicas()
    prom = Prometheus(a.address, tmp_path / "prometheus", extra_targets=[b.address], job_name="se-exporter-fleet")
    try:
        wait_until(lambda: prom.value('count(azure_scheduled_fleet_vms{job="se-exporter-fleet"})') == 2,
                   timeout=30, what="Prometheus to scrape both replicas")
        yield prom
    finally:
        prom.stop()
        a.stop()
        b.stop()


def fleet_state_panels() -> dict[str, str]:
    """Title -> expression of every fleet dashboard query that reads the fleet's per-VM state or its totals."""
    found = {}
    for name, expr in dashboard_expressions(fleet_consumer=True):
        dashboard, _, rest = name.partition(": ")
        if dashboard == DASHBOARD and not rest.startswith("variable ") and FLEET_STATE.search(expr):
            title = rest.rsplit(" [", 1)[0]
            assert title not in found, f"{title}: one query per fleet-state panel, or extend this test"
            found[title] = expr
    return found


def test_every_fleet_state_panel_is_checked_for_overlap() -> None:
    """A panel added on the fleet's per-VM series or its totals is added to the overlap test below."""
    assert set(fleet_state_panels()) == set(TOTALS) | set(LISTS)


def shown(result: list[dict[str, Any]], keys: tuple[str, ...]) -> list[tuple[tuple[str, ...], float]]:
    """An instant query's rows as (the values of ``keys``, the row's value)."""
    return [(tuple(row["metric"].get(key, "") for key in keys), float(row["value"][1])) for row in result]


def test_fleet_dashboard_counts_each_vm_once_across_overlapping_replicas(overlapping_replicas: Prometheus) -> None:
    """Through a hand-over's overlap, each fleet total on the dashboard is the number of distinct VMs (not the sum
    of the replicas' totals) and each per-VM table lists every VM once."""
    wrong = []
    for title, expr in fleet_state_panels().items():
        result: list[dict[str, Any]] = overlapping_replicas.query(substitute(expr))
        if title in TOTALS:
            keys, totals = TOTALS[title]
            counts = dict(shown(result, keys))
            if counts != totals:
                wrong.append(f"{title}: shows {counts}, the fleet has {totals}")
        else:
            keys, rows = LISTS[title]
            listed = Counter(key for key, _ in shown(result, keys))
            if listed != rows:
                wrong.append(f"{title}: lists {dict(listed)}, the fleet has {dict(rows)}")
    assert not wrong, "\n".join(wrong)
