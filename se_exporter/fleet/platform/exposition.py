"""The platform families in the Prometheus text format, written as ``collector.render_fleet`` writes the fleet's.

Gauges, rebuilt from the platform picture and the last reconciliation on every scrape (an event forgotten is gone
from the next scrape, with its series; nothing is removed by hand):

* ``azure_scheduled_fleet_platform_event_info{event_id, event_type, event_status, event_source, scope_type,
  scope_name, resource_group, subscription_id, location}`` = 1 per EventId the platform announced;
* ``azure_scheduled_fleet_platform_event_vms{event_id, event_type, coverage}``: the VMs of each coverage
  (``coverage.COVERAGES``), all four per EventId (0 included), so a panel's series never come and go.

Counters and the histogram are ``collector.FleetMetrics``' (every label value created at zero where the values are a
closed set), fed by ``service.py`` from what this package returns:

* ``azure_scheduled_fleet_platform_events_total{event_type, event_status}``,
  ``azure_scheduled_fleet_impact_seconds_total{event_type, scope_name, location}`` and
  ``azure_scheduled_fleet_platform_duplicates_total``: ``counting.top_up`` of each EventId's merged record, by its
  home's replica (``counting.COUNTING``: the same totals whatever the order and lateness of its messages);
* ``azure_scheduled_fleet_missed_events_total{event_type, reason}`` (reason in ``MISSED_REASONS``),
  ``azure_scheduled_fleet_unannounced_events_total{event_type}`` and the histogram
  ``azure_scheduled_fleet_announcement_lag_seconds`` (negative when the VM knew first: buckets cover both signs):
  ``counting.top_up`` of each EventId's VMs' verdicts merged over every partition's judgement, by its home's
  replica (``counting.COVERAGE``: each VM and EventId once);
* ``azure_scheduled_fleet_invalid_messages_total{reason}``: gains ``PLATFORM_INVALID_REASONS`` (created at zero)
  and counts ``PlatformMessage.skipped`` reasons; ``bound_hits_total{bound}`` gains ``PLATFORM_BOUND_NAMES``,
  ``PICTURE_BOUND_NAMES`` and ``COVERAGE_BOUND_NAMES``.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Container, Iterable

from se_exporter.fleet.collector import FLEET, escape, write_gauges
from se_exporter.fleet.platform.coverage import COVERAGES, Coverage
from se_exporter.fleet.platform.records import PlatformRecord

_HEADERS = {
    "platform_event_info": "1 per scheduled event Azure announced on the platform stream (Event Grid), ended ones "
                           "for --platform-retention.",
    "platform_event_vms": "VMs of one platform event by coverage: whether their sidecar listed it (observed), did "
                          "not (missed), could not read IMDS (imds_unreachable) or was not heard from (no_sidecar).",
}


def render_platform(records: Iterable[PlatformRecord], coverage: Iterable[Coverage],
                    informed: Container[str] | None = None) -> str:
    """The platform gauges as text, from one consistent list of records and the reconciliation's coverage.

    Written directly, as ``render_fleet`` is and for its reason (the figure it guards is the CPU of one /metrics
    scrape: up to 50,000 series here at the default bound); the text is appended to the fleet's. Its samples are
    proven equal to prometheus-client's for the same values (``tests/fleet/test_platform_coverage.py``).
    ``informed``: the EventId keys whose info series this replica writes (each EventId's from one replica, its
    home's; None: all); the VM counts are written for every record, of the VMs this replica judged."""
    info: list[str] = []
    vms: list[str] = []
    counts = Tally((row.event_key, row.coverage) for row in coverage)
    for record in sorted(records, key=lambda record: record.key):
        event = record.event
        ident = f'event_id="{escape(event.event_id)}",event_type="{escape(event.event_type)}"'
        if informed is None or record.key in informed:
            info.append(f"{FLEET}_platform_event_info{{{ident},event_status=\"{event.event_status}\","
                        f'event_source="{escape(event.event_source)}",scope_type="{event.scope_type}",'
                        f'scope_name="{escape(event.scope_name)}",resource_group="{escape(event.resource_group)}",'
                        f'subscription_id="{escape(event.subscription_id)}",location="{escape(event.location)}"}} 1.0')
        vms.extend(f'{FLEET}_platform_event_vms{{{ident},coverage="{state}"}} {float(counts[(record.key, state)])!r}'
                   for state in COVERAGES)
    return write_gauges({"platform_event_info": info, "platform_event_vms": vms}, _HEADERS)
