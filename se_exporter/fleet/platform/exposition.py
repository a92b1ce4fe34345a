"""The platform gauges, a prometheus-client collector of the last reconciliation.

Rebuilt on every scrape, so an event forgotten is gone from the next scrape with its series and nothing is removed
by hand. The platform's counters are ``collector.FleetMetrics``' (counted once: docs/platform-stream.md).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from se_exporter.fleet.collector import FLEET
from se_exporter.fleet.platform.coverage import COVERAGES, MISSED_REASONS, Coverage
from se_exporter.fleet.platform.records import PlatformRecord

if TYPE_CHECKING:
    from se_exporter.fleet.platform.service import LastReconciliation

# The VMs the missed-event alerts name: of each open event, per coverage, the first NAMED_VMS by name (enough to act
# on by hand, an alert each; platform_event_vms counts them all), and at most NAMED_VMS_TOTAL a scrape, the VMs whose
# sidecar is alive first (they page). An event left unnamed by the total still alerts, by its count.
NAMED_VMS = 20
NAMED_VMS_TOTAL = 1_000
INFO_LABELS = ["event_id", "event_type", "event_status", "event_source", "scope_type", "scope_name", "resource_group",
               "subscription_id", "location"]
_INFO_VALUES = attrgetter(*INFO_LABELS)  # each label is the PlatformEvent attribute of its name


class PlatformCollector(Collector):
    """The platform gauges of ``view()`` (the platform side's last reconciliation) on every scrape."""

    def __init__(self, view: Callable[[], LastReconciliation]) -> None:
        self._view = view

    def describe(self) -> list[Metric]:
        return platform_families([], [])

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        yield from platform_families(view.records, view.coverage, view.informed, view.sizes)


def platform_families(records: Iterable[PlatformRecord], coverage: Iterable[Coverage],
                      informed: Container[str] | None = None, sizes: Mapping[str, int] | None = None) -> list[Metric]:
    """The platform gauges from one consistent list of records and the reconciliation's coverage. ``informed``: the
    EventId keys whose info series this replica writes (each EventId's from one replica, its home's; None: all);
    the VM counts are written for every record, of the VMs this replica judged. ``sizes``: what is kept, by what."""
    info = GaugeMetricFamily(f"{FLEET}_platform_event_info", "1 per scheduled event Azure announced on the platform "
                             "stream (Event Grid), ended ones for --platform-retention.", labels=INFO_LABELS)
    vms = GaugeMetricFamily(f"{FLEET}_platform_event_vms", "VMs of one platform event by coverage: whether their "
                            "sidecar listed it (observed), did not (missed), could not read IMDS (imds_unreachable) "
                            "or was not heard from (no_sidecar).", labels=["event_id", "event_type", "coverage"])
    named = GaugeMetricFamily(f"{FLEET}_platform_event_missed_vm_info", "1 per VM of an open platform event whose "
                              "sidecar did not see it, by coverage (missed, imds_unreachable, no_sidecar): the VMs the "
                              f"missed-event alerts name, the first {NAMED_VMS} by name per event and coverage, at "
                              f"most {NAMED_VMS_TOTAL:,} (missed and imds_unreachable first).",
                              labels=["event_id", "event_type", "coverage", "vm_name"])
    kept = GaugeMetricFamily(f"{FLEET}_platform_kept", "What the platform side holds now, each bounded: events and "
                             "Event Grid ids of the pictures, reconciliation pairs and EventIds, EventIds whose "
                             "counting is remembered.", labels=["what"])
    rows = list(coverage)
    counts = Tally((row.event_key, row.coverage) for row in rows)
    missed: dict[tuple[str, str], set[str]] = {}
    for row in rows:
        if row.coverage != "observed":
            missed.setdefault((row.event_key, row.coverage), set()).add(row.vm_name)
    ordered = sorted(records, key=lambda record: record.key)
    for record in ordered:
        if informed is None or record.key in informed:
            info.add_metric(list(_INFO_VALUES(record.event)), 1.0)
        for state in COVERAGES:
            vms.add_metric([record.event.event_id, record.event.event_type, state], counts[(record.key, state)])
    left = NAMED_VMS_TOTAL
    for state in MISSED_REASONS:  # the VMs whose sidecar is alive first
        for record in ordered:
            names = missed.get((record.key, state)) if not record.ended and left else None
            for name in sorted(names or ())[:min(NAMED_VMS, left)]:
                named.add_metric([record.event.event_id, record.event.event_type, state, name], 1.0)
                left -= 1
    for name, size in sorted((sizes or {}).items()):
        kept.add_metric([name], size)
    return [info, vms, named, kept]
