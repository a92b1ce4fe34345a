"""The lifecycle of each event, as a pure diff of consecutive documents.

IMDS never says "completed": a finished event simply disappears, so each transition (scheduled, started,
rescheduled, completed, canceled) is inferred by comparing what we saw before with what we see now. The rules,
an ended event listed again included, are docs/architecture.md's ("Lifecycle", "Incarnation going backwards");
documents of two api-versions diffing as one timeline, docs/events.md's.

No clock reads and no I/O here: the caller passes ``now`` (unix seconds, the wall clock: what timestamps show) and
``elapsed`` (the monotonic clock's reading at the same moment: what every duration is measured on), which is what
makes a table of documents a complete test. Durations are differences of monotonic readings only: a wall clock
stepped back (NTP after a VM's boot, an operator) between first sight and start would make a notice negative, and
unlink a Preempt from the SpotRebalanceRecommendation before it (``core/spot.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum

from se_exporter.core import model
from se_exporter.core.model import Document, ScheduledEvent


class TransitionKind(str, Enum):
    """What happened to an event between two documents: the ``transition`` label, log field and span attribute.

    Lower case, unlike ``EventStatus`` (``Scheduled``): a transition is ours, a status is IMDS'."""

    SCHEDULED = "scheduled"
    STARTED = "started"
    COMPLETED = "completed"
    CANCELED = "canceled"
    RESCHEDULED = "rescheduled"

    def __str__(self) -> str:  # the value in f-strings, labels and log fields, as on every Python version
        return self.value


SCHEDULED = TransitionKind.SCHEDULED
STARTED = TransitionKind.STARTED
COMPLETED = TransitionKind.COMPLETED
CANCELED = TransitionKind.CANCELED
RESCHEDULED = TransitionKind.RESCHEDULED
TRANSITIONS = tuple(TransitionKind)
# Ended events kept to recognise one listed again; a VM sees a handful of events a month.
ENDED_MEMORY = 1024


@dataclass(frozen=True)
class EventRecord:
    """What we know of one event across documents. ``first_seen``, ``started_at`` and ``gone_at`` are unix seconds
    as the wall clock read them (timestamps); the ``*_elapsed`` fields are the monotonic clock's readings at the same
    moments, which the durations are differences of (see the module docstring). A record made by hand without them
    has no durations."""

    event: ScheduledEvent
    first_seen: float
    started_at: float | None = None
    gone_at: float | None = None
    first_seen_elapsed: float | None = None
    started_elapsed: float | None = None
    gone_elapsed: float | None = None
    longest_pause: float = 0.0  # seconds: the longest pause the VM felt while the event was listed (core/pause.py)
    paused_seconds: float = 0.0  # seconds: every such pause summed

    @property
    def notice_seconds(self) -> float | None:
        """First seen -> started: the warning we really got (0 for a host failure)."""
        return _between(self.first_seen_elapsed, self.started_elapsed)

    @property
    def skipped_scheduled(self) -> bool:
        """First seen already Started: Azure gave no notice (a host failure, or an auto-approved user-initiated
        reboot or redeploy under a Scheduled Events Policy). Not a missed ``Scheduled``: there was none to see."""
        return self.started_at is not None and self.started_at == self.first_seen

    @property
    def impact_seconds(self) -> float | None:
        """Started -> gone."""
        return _between(self.started_elapsed, self.gone_elapsed)

    @property
    def lifetime_seconds(self) -> float | None:
        """First seen -> gone."""
        return _between(self.first_seen_elapsed, self.gone_elapsed)


def _between(earlier: float | None, later: float | None) -> float | None:
    """Seconds from one monotonic reading to a later one; None when either is unknown."""
    return None if earlier is None or later is None else later - earlier


@dataclass(frozen=True)
class Transition:
    kind: TransitionKind
    record: EventRecord
    previous_not_before: datetime | None = None

    @property
    def event(self) -> ScheduledEvent:
        return self.record.event


@dataclass(frozen=True)
class Step:
    """The result of one diff: the records still open (by ``event_key``), what happened, and the events that
    have ended (by key, newest last, at most ``ENDED_MEMORY``), to pass to the next diff."""

    records: Mapping[str, EventRecord]
    transitions: tuple[Transition, ...]
    ended: Mapping[str, EventRecord] = field(default_factory=dict)


def diff(previous: Mapping[str, EventRecord], document: Document, now: float,
         ended: Mapping[str, EventRecord] | None = None, unlisted: frozenset[str] = frozenset(),
         elapsed: float | None = None) -> Step:
    """Compare the open records (keyed by ``event_key``) with a new document observed at ``now`` (the wall clock)
    and ``elapsed`` (the monotonic clock; None: ``now`` stands for both, for a caller with one clock such as a
    replay); ``ended`` is the previous step's ``ended``; ``unlisted``, the event types the document's api-version
    cannot list."""
    ended = {} if ended is None else ended
    at = _Moment(now, now if elapsed is None else elapsed)
    records: dict[str, EventRecord] = {}
    transitions: list[Transition] = []
    for event in document.events:
        key = event.key
        before = previous.get(key)
        if key in ended:  # listed again after it ended: a stale answer; shown, but its lifecycle stays ended
            records[key] = replace(before or ended[key], event=event, gone_at=None, gone_elapsed=None)
        elif before is None:
            records[key] = _first_seen(event, at, transitions)
        elif before.event is event and (before.started_at is not None or event.event_status != model.STATUS_STARTED):
            # The very event of the last document (parsing hands out the same object for an unchanged event): no
            # transition, and the record stays as it is. Inline: most events of most documents come this way.
            records[key] = before
        else:
            records[key] = _seen_again(before, event, at, transitions)
    if records.keys() != previous.keys():  # usually not: then no event has ended
        ended = _gone(previous, records, ended, at, unlisted, transitions)
    return Step(records=records, transitions=tuple(transitions), ended=ended)


@dataclass(frozen=True)
class _Moment:
    """One moment as both clocks read it: ``wall`` for timestamps, ``elapsed`` (monotonic) for durations."""

    wall: float
    elapsed: float


def _first_seen(event: ScheduledEvent, at: _Moment, transitions: list[Transition]) -> EventRecord:
    """A new event's record, and its transition: scheduled, or started at once (a host failure: no notice)."""
    started = event.event_status == model.STATUS_STARTED
    record = EventRecord(event=event, first_seen=at.wall, started_at=at.wall if started else None, gone_at=None,
                         first_seen_elapsed=at.elapsed, started_elapsed=at.elapsed if started else None,
                         gone_elapsed=None)
    transitions.append(Transition(kind=STARTED if started else SCHEDULED, record=record, previous_not_before=None))
    return record


def _seen_again(before: EventRecord, event: ScheduledEvent, at: _Moment, transitions: list[Transition]) -> EventRecord:
    """An open event listed again, changed: its record, and its transition when it started or was rescheduled."""
    started_at = before.started_at
    newly_started = started_at is None and event.event_status == model.STATUS_STARTED
    record = replace(before, event=event, started_at=at.wall if newly_started else started_at,
                     started_elapsed=at.elapsed if newly_started else before.started_elapsed)
    if newly_started:
        transitions.append(Transition(kind=STARTED, record=record, previous_not_before=None))
    # NotBefore moved while not started (a started event's becomes empty: that is no move). Parsing hands out one
    # datetime per NotBefore text, so an unchanged one is usually the very same object.
    elif (started_at is None and (moved := event.not_before) is not None
          and moved is not (was := before.event.not_before) and moved != was):
        transitions.append(Transition(kind=RESCHEDULED, record=record, previous_not_before=was))
    return record


def _gone(previous: Mapping[str, EventRecord], records: dict[str, EventRecord], ended: Mapping[str, EventRecord],
          at: _Moment, unlisted: frozenset[str], transitions: list[Transition]) -> Mapping[str, EventRecord]:
    """End the open records the document no longer lists (completed once started, else canceled), except those
    of a type its api-version cannot list (unknown: kept open in ``records``); the new ``ended``, newest last."""
    newly_ended: dict[str, EventRecord] = {}
    for key, before in previous.items():  # in their order: the transitions' and the memory's
        if key in records or key in ended:
            continue
        if before.event.event_type in unlisted:
            records[key] = before
            continue
        gone = replace(before, gone_at=at.wall, gone_elapsed=at.elapsed)
        transitions.append(Transition(COMPLETED if before.started_at is not None else CANCELED, gone))
        newly_ended[key] = gone
    if not newly_ended:
        return ended
    merged = {**ended, **newly_ended}
    return dict(list(merged.items())[-ENDED_MEMORY:]) if len(merged) > ENDED_MEMORY else merged
