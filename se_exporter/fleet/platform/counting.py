"""Counting each EventId once, whatever the order and lateness of its messages: the rules, and what they add.

The rule (``COUNTING``; docs/platform-stream.md says it too, and why each counter then ends exact in any order):

1. An EventId's figures are a function of the set of its messages merged over every partition: each status heard
   (`platform_events_total`); the earliest Started to the latest Completed times every VM any message named
   (`impact_seconds_total`); deliveries of a message beyond its first (`platform_duplicates_total`).
2. Only the owner of its home partition counts it, topping each counter up to that figure; what was counted is kept
   in the home's blob, and an increment is applied once that blob is written.
3. An ended EventId stays `--platform-retention` from when its end was read (not from its eventTime), and what was
   counted of it eight days more: a message read later adds only what it adds to that.

The coverage counters follow one rule too (``COVERAGE``; docs/platform-stream.md):

1. A partition's owner judges the named VMs it shows of each EventId (when each first listed it; a miss and its
   reason, once said while the event was open, kept) and the unannounced EventIds its live VMs listed, and keeps
   that judgement in the partition's blob beside its picture.
2. An EventId's coverage figures are a function of every partition's judgement merged: each VM missed once
   (`missed_events_total`; `no_sidecar`: alive in no partition once all have judged the EventId), each VM's lag once
   (`announcement_lag_seconds`), the EventId once if unannounced (`unannounced_events_total`).
3. They are counted as COUNTING's rules 2 and 3 count the rest: by the owner of the EventId's home partition alone,
   topping up to those figures, kept in the same record of what was counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from se_exporter.fleet.platform.coverage import MISSED_REASONS
from se_exporter.fleet.platform.records import PlatformRecord

# One VM's judgement of one EventId: the miss said while it was open (one of MISSED_REASONS, or None), and when the
# VM first listed it minus when the platform announced it (its lag; None: not listed).
Verdict = tuple[str | None, float | None]


@dataclass
class Counted:
    """What was counted of one EventId; and since when no picture holds it (rule 3)."""

    statuses: set[str] = field(default_factory=set)
    impact: float = 0.0
    missed: dict[str, str] = field(default_factory=dict)  # VM name -> reason (MISSED_REASONS)
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
    """One increment of the ``FleetMetrics`` attribute ``counter``, with its label values (``announcement_lag``, a
    histogram: ``amount`` is the value observed)."""

    counter: str
    labels: tuple[str, ...]
    amount: float


def top_up(counted: Counted, record: PlatformRecord, verdicts: dict[str, Verdict] | None = None) -> list[Increment]:
    """What the counters add to reach the figures of ``record`` (COUNTING 1) and of the merged ``verdicts`` of its
    VMs (COVERAGE 2) from ``counted``; ``counted`` is moved on."""
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
    for name, (reason, lag) in sorted((verdicts or {}).items()):
        if reason is not None and name not in counted.missed:
            added.append(Increment("missed_events", (event.event_type, reason), 1.0))
            counted.missed[name] = reason
        if lag is not None and name not in counted.lag:
            added.append(Increment("announcement_lag", (), lag))
            counted.lag.add(name)
    counted.gone_at = None
    return added


def top_up_unannounced(counted: Counted, event_type: str) -> list[Increment]:
    """An EventId listed and never announced (COVERAGE 2): counted once."""
    if counted.unannounced:
        return []
    counted.unannounced = True
    return [Increment("unannounced_events", (event_type,), 1.0)]


def judge(old: Verdict, coverage: str | None, lag: float | None) -> Verdict:
    """A VM's verdict moved on by one round's coverage (COVERAGE 1): the lag of its first listing kept, a miss's
    latest reason, neither ever taken back."""
    reason, first = old
    if coverage == "observed" and first is None:
        first = lag
    elif coverage in ("missed", "imds_unreachable"):
        reason = coverage
    return reason, first


def merged(judgements: list[dict[str, Verdict]]) -> dict[str, Verdict]:
    """One EventId's verdicts over the partitions' judgements: a VM missed where any says so (the first reason in
    ``MISSED_REASONS`` order, so the merge is the same in any order), its lag the earliest listing."""
    verdicts: dict[str, Verdict] = {}
    for judged in judgements:
        for name, (reason, lag) in judged.items():
            old_reason, old_lag = verdicts.get(name, (None, None))
            reasons = [each for each in (old_reason, reason) if each is not None]
            lags = [each for each in (old_lag, lag) if each is not None]
            verdicts[name] = (min(reasons, key=MISSED_REASONS.index) if reasons else None, min(lags) if lags else None)
    return verdicts
