"""The lifecycle of each event, as a pure diff of consecutive documents.

IMDS never says "completed": a finished event simply disappears from ``Events``. So the
lifecycle is inferred by comparing what we saw before with what we see now:

    first seen Scheduled ─────────────► scheduled
    first seen Started (host failure) ─► started   (notice 0: no warning at all)
    Scheduled ─► Started ──────────────► started   (notice = started_at - first_seen)
    NotBefore moved while not started ─► rescheduled
    gone after Started ────────────────► completed (impact = gone_at - started_at)
    gone while not started ────────────► canceled

No clock reads and no I/O here: the caller passes ``now`` (unix seconds), which is what makes a
table of documents a complete test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from se_exporter.model import Document, ScheduledEvent

SCHEDULED = "scheduled"
STARTED = "started"
COMPLETED = "completed"
CANCELED = "canceled"
RESCHEDULED = "rescheduled"
TRANSITIONS = (SCHEDULED, STARTED, COMPLETED, CANCELED, RESCHEDULED)


@dataclass(frozen=True)
class EventRecord:
    """What we know of one event across documents. Times are unix seconds as we observed them."""

    event: ScheduledEvent
    first_seen: float
    started_at: float | None = None
    gone_at: float | None = None

    @property
    def notice_seconds(self) -> float | None:
        """First seen -> started: the warning we really got (0 for a host failure)."""
        return None if self.started_at is None else self.started_at - self.first_seen

    @property
    def impact_seconds(self) -> float | None:
        """Started -> gone."""
        if self.started_at is None or self.gone_at is None:
            return None
        return self.gone_at - self.started_at


@dataclass(frozen=True)
class Transition:
    kind: str
    record: EventRecord
    previous_not_before: datetime | None = None

    @property
    def event(self) -> ScheduledEvent:
        return self.record.event


@dataclass(frozen=True)
class Step:
    """The result of one diff: the records still open, and what happened."""

    records: Mapping[str, EventRecord]
    transitions: tuple[Transition, ...]


def diff(previous: Mapping[str, EventRecord], document: Document, now: float) -> Step:
    """Compare the open records with a new document observed at ``now``."""
    records: dict[str, EventRecord] = {}
    transitions: list[Transition] = []
    for event in document.events:
        before = previous.get(event.event_id)
        if before is None:
            record = EventRecord(event=event, first_seen=now, started_at=now if event.started else None)
            transitions.append(Transition(STARTED if event.started else SCHEDULED, record))
        else:
            record = replace(before, event=event)
            if event.started and before.started_at is None:
                record = replace(record, started_at=now)
                transitions.append(Transition(STARTED, record))
            elif _rescheduled(before.event, event, record):
                transitions.append(Transition(RESCHEDULED, record, before.event.not_before))
        records[event.event_id] = record
    for event_id, before in previous.items():
        if event_id not in records:
            gone = replace(before, gone_at=now)
            transitions.append(Transition(COMPLETED if before.started_at is not None else CANCELED, gone))
    return Step(records=records, transitions=tuple(transitions))


def _rescheduled(before: ScheduledEvent, after: ScheduledEvent, record: EventRecord) -> bool:
    # Started events lose their NotBefore (it becomes ""); that is not a move.
    if record.started_at is not None or after.not_before is None:
        return False
    return after.not_before != before.not_before
