"""How the fleet consumer reports what it meets: counters, and log lines throttled per kind.

One place for the rule "log a kind of trouble once a minute, count every occurrence", so that a hub full of bad
messages or a storage account down for an hour fills neither the log nor the disk.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from se_exporter.fleet.collector import FleetMetrics
from se_exporter.infra.logs import Throttle, fields

log = logging.getLogger("se_exporter.fleet")
LOG_EVERY = 60.0  # seconds between repeated log lines of one kind of invalid message or error
BOUND_HELP = {
    "vms_per_partition": "a partition holds the most VMs one replica keeps for it; documents of further VMs skipped",
    "vms_per_installation": "one sidecar installation id sent documents for more VMs than one sidecar has; "
                            "documents of further VMs skipped",
    "events_per_vm": "a document lists more events than the fleet shows per VM; the rest left out",
    "body_bytes": "a document larger than the fleet keeps per VM; what it shows of it kept instead",
    "label_length": "an event field longer than a label may be; that event left out",
    "platform_events_per_message": "a platform message holds more events than the fleet reads of one; the rest "
                                   "left out",
    "platform_resources_per_event": "a platform event names more VMs than the fleet keeps of one; the rest left out",
    "platform_events": "more EventIds than a platform picture (or one replica's listing) holds; an ended one "
                       "forgotten to make room, or with none ended the new EventId skipped",
    "platform_ids": "more Event Grid ids or forgotten EventIds than a picture remembers; the oldest forgotten",
    "platform_vms": "more VM names over a picture's events than it holds; the new EventId skipped, or its new VMs",
    "platform_coverage_pairs": "more (EventId, VM) pairs than the reconciliation remembers; further pairs get no "
                               "coverage until some go",
    "platform_coverage_ids": "more EventIds than the reconciliation remembers as announced or counted; the oldest "
                             "forgotten",
    "platform_scopes": "more scopes that published a platform event than remembered; the oldest forgotten",
}


class Report:
    """The consumer's counters, and its log lines at most once a ``LOG_EVERY`` per key."""

    def __init__(self, metrics: FleetMetrics) -> None:
        self.metrics = metrics
        self._logged = Throttle(LOG_EVERY)

    def once(self, key: str, level: int, message: str, *args: Any, extra: dict[str, Any] | None = None) -> None:
        if self._logged.due(key, time.monotonic()):
            log.log(level, message, *args, extra=extra)

    def bound_hit(self, bound: str, count: int = 1) -> None:
        self.metrics.bound_hits.labels(bound).inc(count)
        self.once(f"bound:{bound}", logging.WARNING, "bound %s reached (%d times): %s", bound, count,
                  BOUND_HELP.get(bound, ""), extra=fields(bound=bound))
