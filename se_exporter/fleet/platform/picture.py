"""The platform picture: every scheduled event Azure announced, per EventId, its statuses only moving forward.

No I/O and no clock reads: the consumer hands in each ``PlatformEvent`` and the time, and reads back frozen
values. Event Grid may deliver a message twice (the same Event Grid ``id``: a duplicate, dropped and counted) and
in any order, so a record keeps the time of every status it has heard of, and its status is the furthest one:
Scheduled, then Started, then Completed or Canceled. A Scheduled arriving after Started adds its time and changes
nothing else, so the statuses and their times after any order of the same messages are the same (``combine``; the
other fields are the furthest status's message's): a partition's picture can be folded again from its messages,
and pictures of several partitions merged (``merge``) when one EventId's statuses land on different partitions.

An ended event stays for ``retention`` after its end (its end's eventTime, never later than when it was applied),
then is forgotten; an event that never ends (its end was lost) is forgotten ``open_expiry`` after its last change.
A forgotten EventId is remembered a while so a late copy does not bring it back. Everything is bounded
(``PlatformLimits``); each bound reached is reported as the name ``bound_hits_total{bound}`` counts it under.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from se_exporter.fleet.platform.reader import DEFAULT_PLATFORM_BOUNDS, STATUSES, PlatformEvent

RANK = {"Scheduled": 0, "Started": 1, "Completed": 2, "Canceled": 2}
ENDED = frozenset({"Completed", "Canceled"})
OPEN = frozenset({"Scheduled", "Started"})
PICTURE_BOUND_NAMES = ("platform_events", "platform_ids")
# What ``apply`` says of one event: a status learnt, a known status again under another Event Grid id, a
# duplicate, an EventId forgotten a moment ago, or the bound that refused a new EventId.
OUTCOMES = ("applied", "repeat", "duplicate", "forgotten", "platform_events")


@dataclass(frozen=True)
class PlatformLimits:
    """What one picture keeps at most, and for how long (seconds)."""

    retention: float = 3600.0  # an ended event stays listed this long (--platform-retention)
    open_expiry: float = 8 * 86400.0  # past the longest notice (7 days, degraded-hardware migrations)
    events: int = 10_000  # EventIds kept: 10,000 events x (1 info + 4 coverage) = 50,000 series at most
    ids: int = 100_000  # Event Grid ids remembered for dedupe, and forgotten EventIds (each)
    resources_per_event: int = DEFAULT_PLATFORM_BOUNDS.resources_per_event


DEFAULT_LIMITS = PlatformLimits()


@dataclass(frozen=True, slots=True)
class PlatformRecord:
    """One EventId as the platform told it so far. ``event`` holds the fields of the furthest status's message
    (Resources: every VM any of its messages named); ``times`` the eventTime of each status heard, in order."""

    event: PlatformEvent
    times: tuple[tuple[str, float], ...]
    ended_at: float | None  # when it ended, for retention (None while open)
    changed_at: float  # the consumer's clock when a status was last learnt, for open_expiry

    @property
    def key(self) -> str:
        return self.event.key

    @property
    def status(self) -> str:
        return self.event.event_status

    @property
    def ended(self) -> bool:
        return self.event.event_status in ENDED

    @property
    def announced_at(self) -> float:
        """The eventTime of its earliest status: when the platform announced it."""
        return min(when for _status, when in self.times)

    def time_of(self, status: str) -> float | None:
        return next((when for known, when in self.times if known == status), None)

    @property
    def impact_seconds(self) -> float | None:
        """Started to Completed by the platform's times, times the VMs it concerns; None until both are known."""
        if len(self.times) < 2:  # the common case, each new EventId: no generator walked twice
            return None
        started, completed = self.time_of("Started"), self.time_of("Completed")
        if started is None or completed is None:
            return None
        return max(0.0, completed - started) * len(self.event.resources)


@dataclass(frozen=True)
class PictureState:
    """A picture's content as values: its records, and the Event Grid ids and forgotten EventIds it remembers
    with when (oldest first)."""

    records: tuple[PlatformRecord, ...]
    ids: tuple[tuple[str, float], ...]
    forgotten: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Applied:
    """What applying one event did: ``outcome`` (OUTCOMES), the statuses newly learnt (what
    ``platform_events_total{event_type, event_status}`` counts), and the impact seconds to add now (once per
    EventId, when Started and Completed are first both known)."""

    outcome: str
    statuses: tuple[str, ...] = ()
    impact_seconds: float = 0.0
    record: PlatformRecord | None = None


def record_of(event: PlatformEvent, now: float) -> PlatformRecord:
    ended = min(event.event_time, now) if event.event_status in ENDED else None
    return PlatformRecord(event, ((event.event_status, event.event_time),), ended, now)


def combine(old: PlatformRecord, new: PlatformRecord, max_resources: int = DEFAULT_LIMITS.resources_per_event,
            ) -> PlatformRecord:
    """Both records' knowledge of one EventId: every status's earliest time, the furthest status (of two ends, the
    earlier), its message's fields, Resources of both."""
    times = dict(old.times)
    for status, when in new.times:
        times[status] = min(when, times.get(status, when))
    ordered = tuple((status, times[status]) for status in STATUSES if status in times)
    newer = _rank(new) > _rank(old) or (_rank(new) == _rank(old) and (
        not new.ended or (new.time_of(new.status) or 0.0) < (old.time_of(old.status) or 0.0)))
    first, second = (new, old) if newer else (old, new)
    event = first.event
    resources = event.resources
    if second.event.resources != resources:  # names compare without case: the first spelling of each is kept
        union: dict[str, str] = {}
        for name in (*resources, *second.event.resources):
            union.setdefault(name.casefold(), name)
        if len(union) > len(resources):
            resources = tuple(union.values())[:max_resources]
    if resources is not event.resources or (event.not_before is None and second.event.not_before is not None) \
            or (event.duration_seconds is None and second.event.duration_seconds is not None):
        event = replace(event, resources=resources,
                        not_before=event.not_before if event.not_before is not None else second.event.not_before,
                        duration_seconds=event.duration_seconds if event.duration_seconds is not None
                        else second.event.duration_seconds)
    ends = [when for when in (old.ended_at, new.ended_at) if when is not None]
    return PlatformRecord(event, ordered, min(ends) if event.event_status in ENDED and ends else None,
                          max(old.changed_at, new.changed_at))


def _rank(record: PlatformRecord) -> int:
    return RANK[record.event.event_status]


def merge(pictures: Iterable[Iterable[PlatformRecord]]) -> list[PlatformRecord]:
    """One record per EventId from several partitions' pictures (a scrape's view over the owned partitions)."""
    merged: dict[str, PlatformRecord] = {}
    for records in pictures:
        for record in records:
            held = merged.get(record.key)
            merged[record.key] = record if held is None else combine(held, record)
    return list(merged.values())


class PlatformPicture:
    """The platform events of one partition (or one replica). The consumer's loop changes it; scrapes read it."""

    def __init__(self, limits: PlatformLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._records: dict[str, PlatformRecord] = {}
        # OrderedDicts, not dicts: taken from the front, a dict's iteration first skips every entry deleted before
        self._ids: OrderedDict[str, float] = OrderedDict()  # Event Grid id -> when applied, oldest first
        self._forgotten: OrderedDict[str, float] = OrderedDict()  # EventId key -> when forgotten, oldest first
        self._ended: OrderedDict[str, None] = OrderedDict()  # keys of ended records, in the order they ended here
        self.bound_hits: dict[str, int] = dict.fromkeys(PICTURE_BOUND_NAMES, 0)

    def state(self) -> PictureState:
        """Everything a restart needs to continue exactly (``saved.py`` writes it as JSON)."""
        with self._lock:
            return PictureState(tuple(self._records.values()), tuple(self._ids.items()),
                                tuple(self._forgotten.items()))

    @classmethod
    def restored(cls, state: PictureState, limits: PlatformLimits = DEFAULT_LIMITS) -> PlatformPicture:
        """A picture continuing from ``state`` (within ``limits``: what is past them is left out, oldest first)."""
        picture = cls(limits)
        records = sorted(state.records, key=lambda record: record.ended_at is None)[-limits.events:]
        picture._records = {record.key: record for record in records}
        picture._ended = OrderedDict((record.key, None) for record in sorted(
            (record for record in records if record.ended_at is not None), key=lambda record: record.ended_at or 0.0))
        picture._ids = OrderedDict(sorted(state.ids, key=lambda item: item[1])[-limits.ids:])
        picture._forgotten = OrderedDict(sorted(state.forgotten, key=lambda item: item[1])[-limits.ids:])
        return picture

    def apply(self, event: PlatformEvent, now: float) -> Applied:
        """Fold one platform event in (see the module docstring)."""
        with self._lock:
            if event.grid_id in self._ids:
                return Applied("duplicate")
            if event.key in self._forgotten:
                return Applied("forgotten")
            held = self._records.get(event.key)
            if held is None and len(self._records) >= self.limits.events and not self._drop_oldest_ended(now):
                self.bound_hits["platform_events"] += 1
                return Applied("platform_events")
            self._remember(self._ids, event.grid_id, now)
            new = record_of(event, now)
            if new.ended:
                self._ended[event.key] = None
            if held is None:
                self._records[event.key] = new
                return Applied("applied", (event.event_status,), new.impact_seconds or 0.0, new)
            if held.time_of(event.event_status) is not None:
                merged = combine(held, replace(new, changed_at=held.changed_at), self.limits.resources_per_event)
                self._records[event.key] = merged
                return Applied("repeat", (), 0.0, merged)
            merged = combine(held, new, self.limits.resources_per_event)
            self._records[event.key] = merged
            impact = merged.impact_seconds if held.impact_seconds is None else None
            return Applied("applied", (event.event_status,), impact or 0.0, merged)

    def expire(self, now: float) -> list[PlatformRecord]:
        """Forget what its time is up for (see the module docstring); the records forgotten."""
        limits = self.limits
        with self._lock:
            gone = [record for record in self._records.values()
                    if (record.ended_at is not None and record.ended_at + limits.retention <= now)
                    or (record.ended_at is None and record.changed_at + limits.open_expiry <= now)]
            for record in gone:
                del self._records[record.key]
                self._ended.pop(record.key, None)
                self._remember(self._forgotten, record.key, now)
            _drop_before(self._ids, now - limits.retention)
            _drop_before(self._forgotten, now - limits.open_expiry)
        return gone

    def records(self) -> list[PlatformRecord]:
        with self._lock:
            return list(self._records.values())

    def sizes(self) -> dict[str, int]:
        """What it holds now: records, Event Grid ids remembered, forgotten EventIds remembered (each bounded)."""
        with self._lock:
            return {"events": len(self._records), "ids": len(self._ids), "forgotten": len(self._forgotten)}

    def _remember(self, seen: OrderedDict[str, float], key: str, now: float) -> None:
        if len(seen) >= self.limits.ids:
            seen.popitem(last=False)
            self.bound_hits["platform_ids"] += 1
        seen[key] = now

    def _drop_oldest_ended(self, now: float) -> bool:
        """Make room for a new EventId by forgetting the event that ended here first, if there is one."""
        if not self._ended:
            return False
        key, _ = self._ended.popitem(last=False)
        del self._records[key]
        self._remember(self._forgotten, key, now)
        return True


def _drop_before(seen: OrderedDict[str, float], cutoff: float) -> None:
    """Drop entries older than ``cutoff`` from the front (insertion order is time order, the clock allowing)."""
    while seen:
        key, when = seen.popitem(last=False)
        if when >= cutoff:
            seen[key] = when
            seen.move_to_end(key, last=False)
            return
