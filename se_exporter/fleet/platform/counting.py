"""Counting each EventId once, whatever the order and lateness of its messages: the rule, and what it adds.

The rule (``COUNTING``; docs/platform-stream.md says it too):

1. An EventId's figures are a function of the set of its messages merged over every partition: each status heard
   (`platform_events_total`); the earliest Started to the latest Completed times every VM any message named
   (`impact_seconds_total`); deliveries of a message beyond its first (`platform_duplicates_total`).
2. Only the owner of its home partition counts it, topping each counter up to that figure; what was counted is kept
   in the home's blob, and an increment is applied once that blob is written.
3. An ended EventId stays `--platform-retention` from when its end was read (not from its eventTime), and what was
   counted of it eight days more: a message read later adds only what it adds to that.

Every figure of (1) only grows as messages are added (a status, an earlier Started, a later Completed, a VM, a
copy), so the counter ends at the figure of all its messages, whatever the order or the rounds they came in
(``tests/fleet/test_platform_counting.py`` proves it over every order of 400 sets). A counter is labelled with the
EventId's fields when it is topped up: the documented stream repeats them in every message of one EventId; if two
messages disagreed (a type said Reboot in one, Redeploy in another), the total over labels is still exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from se_exporter.fleet.platform.records import PlatformRecord

COUNTING = (
    "An EventId's figures are a function of the set of its messages merged over every partition: each status heard "
    '(`platform_events_total`); the earliest Started to the latest Completed times every VM any message named '
    '(`impact_seconds_total`); deliveries of a message beyond its first (`platform_duplicates_total`).',
    'Only the owner of its home partition counts it, topping each counter up to that figure; what was counted is '
    "kept in the home's blob, and an increment is applied once that blob is written.",
    'An ended EventId stays `--platform-retention` from when its end was read (not from its eventTime), and what '
    'was counted of it eight days more: a message read later adds only what it adds to that.',
)


@dataclass
class Counted:
    """What was counted of one EventId: its statuses, its impact seconds and duplicates so far, its VMs' misses and
    lags, as unannounced; and since when no picture holds it (rule 3)."""

    statuses: set[str] = field(default_factory=set)
    impact: float = 0.0
    missed: dict[str, str] = field(default_factory=dict)  # VM name -> reason (coverage.MISSED_REASONS)
    lag: set[str] = field(default_factory=set)
    unannounced: bool = False
    duplicates: int = 0
    gone_at: float | None = None

    def to_json(self, key: str) -> dict[str, Any]:
        return {"key": key, "statuses": sorted(self.statuses), "impact": self.impact, "missed": dict(self.missed),
                "lag": sorted(self.lag), "unannounced": self.unannounced, "duplicates": self.duplicates,
                "gone_at": self.gone_at}


@dataclass(frozen=True)
class Increment:
    """One counter's increment: ``platform_events`` (labels event_type, event_status), ``impact_seconds``
    (event_type, scope_name, location) or ``platform_duplicates`` (none)."""

    counter: str
    labels: tuple[str, ...]
    amount: float


def top_up(counted: Counted, record: PlatformRecord) -> list[Increment]:
    """What the counters add to reach ``record``'s figures from ``counted`` (rule 1); ``counted`` is moved on."""
    event = record.event
    added = [Increment("platform_events", (event.event_type, status), 1.0)
             for status, _when in record.times if status not in counted.statuses]
    counted.statuses.update(status for status, _when in record.times)
    impact = record.impact_seconds or 0.0
    if impact > counted.impact:
        added.append(Increment("impact_seconds", (event.event_type, event.scope_name, event.location),
                               impact - counted.impact))
        counted.impact = impact
    if record.duplicates > counted.duplicates:
        added.append(Increment("platform_duplicates", (), float(record.duplicates - counted.duplicates)))
        counted.duplicates = record.duplicates
    counted.gone_at = None
    return added
