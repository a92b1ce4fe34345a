"""The platform gauges, a prometheus-client collector of the last reconciliation.

Rebuilt from the platform picture and the last reconciliation on every scrape, so an event forgotten is gone from
the next scrape with its series and nothing is removed by hand. The platform's counters and histogram are
``collector.FleetMetrics``', fed by ``service.py``; how each is counted once whatever the order and lateness of
its messages: docs/platform-stream.md ("Counting once", "Coverage counted once"); each family: docs/reference.md.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from se_exporter.fleet.collector import FLEET
from se_exporter.fleet.platform.coverage import COVERAGES, Coverage
from se_exporter.fleet.platform.records import PlatformRecord

if TYPE_CHECKING:
    from se_exporter.fleet.platform.service import LastReconciliation

INFO_LABELS = ["event_id", "event_type", "event_status", "event_source", "scope_type", "scope_name", "resource_group",
               "subscription_id", "location"]


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
                      informed: Container[str] | None = None, sizes: Mapping[str, int] | None = None,
                      ) -> list[Metric]:
    """The platform gauges from one consistent list of records and the reconciliation's coverage. ``informed``: the
    EventId keys whose info series this replica writes (each EventId's from one replica, its home's; None: all);
    the VM counts are written for every record, of the VMs this replica judged. ``sizes``: what is kept, by what."""
    info = GaugeMetricFamily(f"{FLEET}_platform_event_info", "1 per scheduled event Azure announced on the platform "
                             "stream (Event Grid), ended ones for --platform-retention.", labels=INFO_LABELS)
    vms = GaugeMetricFamily(f"{FLEET}_platform_event_vms", "VMs of one platform event by coverage: whether their "
                            "sidecar listed it (observed), did not (missed), could not read IMDS (imds_unreachable) "
                            "or was not heard from (no_sidecar).", labels=["event_id", "event_type", "coverage"])
    kept = GaugeMetricFamily(f"{FLEET}_platform_kept", "What the platform side holds now, each bounded: events and "
                             "Event Grid ids of the pictures, reconciliation pairs and EventIds, EventIds whose "
                             "counting is remembered.", labels=["what"])
    counts = Tally((row.event_key, row.coverage) for row in coverage)
    for record in sorted(records, key=lambda record: record.key):
        event = record.event
        if informed is None or record.key in informed:
            info.add_metric([event.event_id, event.event_type, event.event_status, event.event_source,
                             event.scope_type, event.scope_name, event.resource_group, event.subscription_id,
                             event.location], 1.0)
        for state in COVERAGES:
            vms.add_metric([event.event_id, event.event_type, state], counts[(record.key, state)])
    for name, size in sorted((sizes or {}).items()):
        kept.add_metric([name], size)
    return [info, vms, kept]
