"""The platform picture: every scheduled event Azure announced, per EventId, its statuses only moving forward.

No I/O and no clock reads. ``combine`` is commutative and associative, so any order of the same messages gives the
same record, and several partitions' pictures merge. Duplicates, retention and bounds: docs/platform-stream.md.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from se_exporter.fleet.platform.fields import STATUSES
from se_exporter.fleet.platform.reader import DEFAULT_PLATFORM_BOUNDS, PlatformEvent

RANK = {"Scheduled": 0, "Started": 1, "Completed": 2, "Canceled": 2}
ENDED = frozenset({"Completed", "Canceled"})
PICTURE_BOUND_NAMES = ("platform_events", "platform_ids", "platform_vms")


# No VM sits through eight days of one maintenance (the longest notice is 7 days): a platform clock that far off
# (Started dated 2000, Completed 2199) would otherwise add decades per VM to impact_seconds_total in one step.
MAX_IMPACT_PER_VM = 8 * 86400.0


@dataclass(frozen=True)
class PlatformLimits:
    """What one picture keeps at most, and for how long (seconds)."""

    retention: float = 3600.0  # an ended event stays listed this long (--platform-retention)
    open_expiry: float = MAX_IMPACT_PER_VM  # past the longest notice (7 days, degraded-hardware migrations)
    events: int = 10_000  # EventIds kept: 10,000 events x (1 info + 4 coverage) = 50,000 series at most
    ids: int = 100_000  # Event Grid ids remembered for dedupe (as ``message_id``), and forgotten EventIds (each)
    resources_per_event: int = DEFAULT_PLATFORM_BOUNDS.resources_per_event
    # VM names over all records' Resources, as many as the Reconciler's pairs: without it events x resources_per_event
    # (10 million names, gigabytes) could be held; a real event names a handful
    vms: int = 200_000


DEFAULT_LIMITS = PlatformLimits()


@dataclass(frozen=True, slots=True)
class PlatformRecord:
    """One EventId as the platform told it so far. ``event`` holds the fields of the furthest status's message
    (Resources: every VM any of its messages named); ``times`` the eventTime of each status heard, in order."""

    event: PlatformEvent
    times: tuple[tuple[str, float], ...]
    ended_at: float | None  # when its end was read (the consumer's clock), for retention (None while open)
    changed_at: float  # the consumer's clock when a status was last learnt, for open_expiry
    # Per message (``message_id``) folded in, how many deliveries of it: a partition's own, summed over partitions
    # when merged, so a copy Event Grid delivered to another partition is a duplicate too (at most MAX_COPIES ids).
    copies: tuple[tuple[str, int], ...] = ()

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
    def duplicates(self) -> int:
        """Deliveries of its messages beyond the first of each, over every partition merged into it."""
        return sum(copies - 1 for _seen, copies in self.copies)

    @property
    def impact_seconds(self) -> float | None:
        """The earliest Started to the latest Completed by the platform's times (at most ``MAX_IMPACT_PER_VM``),
        times the VMs any of its messages named; None until both are known. It only grows as messages are folded
        in, so a counter topped up to it ends at the same total whatever their order."""
        if len(self.times) < 2:  # the common case, each new EventId: no generator walked twice
            return None
        started, completed = self.time_of("Started"), self.time_of("Completed")
        if started is None or completed is None:
            return None
        return min(MAX_IMPACT_PER_VM, max(0.0, completed - started)) * len(self.event.resources)


@dataclass(frozen=True)
class PictureState:
    """A picture's content as values; ``ids`` and ``forgotten`` with when each was remembered, oldest first."""

    records: tuple[PlatformRecord, ...] = ()
    ids: tuple[tuple[str, float], ...] = ()
    forgotten: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ApplyResult:
    """What applying one event did: ``outcome`` (a status learnt: ``applied``; a known status again under another
    Event Grid id: ``repeat``; ``duplicate``; an EventId forgotten a moment ago: ``forgotten``; or the bound that
    refused a new EventId), and the EventId's record after it. The counters add what the merged record says."""

    outcome: str
    record: PlatformRecord | None = None


def message_id(event: PlatformEvent) -> str:
    """What a duplicate repeats: Event Grid's ``id``, EventId and status (the same ``id`` for another is news), as 32
    hex characters whatever the id's length, so the ids remembered cost the same however long a hostile one is."""
    text = "\n".join((event.grid_id, event.key, event.event_status))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _choice(record: PlatformRecord) -> tuple[int, float, bool, str]:
    """Which message's fields a record shows, as a total order (the largest wins, whatever the arrival order): the
    furthest status; of two ends, the one the platform dated first, Completed at the same eventTime; of one open
    status, the latest; then the Event Grid id."""
    event = record.event
    when = -event.event_time if event.event_status in ENDED else event.event_time
    return RANK[event.event_status], when, event.event_status == "Completed", event.grid_id


def combine(old: PlatformRecord, new: PlatformRecord, max_resources: int = DEFAULT_LIMITS.resources_per_event,
            ) -> PlatformRecord:
    """Both records' knowledge of one EventId, the same whichever is old or new: the earliest time of an open status
    and the latest of an end, the fields of the message ``_choice`` picks, Resources of both, their copies."""
    times = dict(old.times)
    for status, when in new.times:
        known = times.get(status, when)
        times[status] = max(when, known) if status in ENDED else min(when, known)
    ordered = tuple((status, times[status]) for status in STATUSES if status in times)
    first, second = (new, old) if _choice(new) > _choice(old) else (old, new)
    event = _completed(first.event, second.event, _union(first.event.resources, second.event.resources, max_resources))
    ends = [when for when in (old.ended_at, new.ended_at) if when is not None]
    return PlatformRecord(event, ordered, min(ends) if event.event_status in ENDED and ends else None,
                          max(old.changed_at, new.changed_at), _copies(old.copies, new.copies))


def _union(resources: tuple[str, ...], others: tuple[str, ...], max_resources: int) -> tuple[str, ...]:
    """Resources of both (names compare without case: the first spelling of each is kept), at most
    ``max_resources``; ``resources`` itself when that adds nothing."""
    if others == resources and len(resources) <= max_resources:
        return resources
    union: dict[str, str] = {}
    for name in (*resources, *others):
        union.setdefault(name.casefold(), name)
    if len(union) > len(resources) or len(resources) > max_resources:
        return tuple(union.values())[:max_resources]
    return resources


def _completed(event: PlatformEvent, other: PlatformEvent, resources: tuple[str, ...]) -> PlatformEvent:
    """``event`` with ``resources``, and NotBefore and DurationInSeconds from ``other`` where it has none."""
    not_before = event.not_before if event.not_before is not None else other.not_before
    duration = event.duration_seconds if event.duration_seconds is not None else other.duration_seconds
    if resources is event.resources and not_before is event.not_before and duration is event.duration_seconds:
        return event
    return replace(event, resources=resources, not_before=not_before, duration_seconds=duration)


MAX_COPIES = 16  # messages per EventId whose deliveries are counted (a real event has one per status: four at most)


def _copies(old: tuple[tuple[str, int], ...], new: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    if not new:
        return old
    summed = dict(old)
    for seen, copies in new:
        summed[seen] = summed.get(seen, 0) + copies
    return tuple(sorted(summed.items())[:MAX_COPIES])


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
        self._vms = 0  # VM names held over all records (limits.vms)
        self.bound_hits: dict[str, int] = dict.fromkeys(PICTURE_BOUND_NAMES, 0)

    def state(self) -> PictureState:
        """Everything a restart needs to continue exactly."""
        with self._lock:
            return PictureState(tuple(self._records.values()), tuple(self._ids.items()), tuple(self._forgotten.items()))

    @classmethod
    def restored(cls, state: PictureState, limits: PlatformLimits = DEFAULT_LIMITS) -> PlatformPicture:
        """A picture continuing from ``state``, held to ``limits`` as if its records had been applied (a state blob
        is outside input too: ``_within``); of the ids and forgotten EventIds, the latest."""
        picture = cls(limits)
        records, picture._vms = _within(state.records, limits)
        picture._records = {record.key: record for record in records}
        picture._ended = OrderedDict((record.key, None) for record in sorted(
            (record for record in records if record.ended_at is not None), key=lambda record: record.ended_at or 0.0))
        picture._ids = OrderedDict(sorted(state.ids, key=lambda item: item[1])[-limits.ids:])
        picture._forgotten = OrderedDict(sorted(state.forgotten, key=lambda item: item[1])[-limits.ids:])
        return picture

    def apply(self, event: PlatformEvent, now: float) -> ApplyResult:
        with self._lock:
            seen = message_id(event)
            if event.key in self._forgotten:
                return ApplyResult("forgotten")
            held = self._records.get(event.key)
            if self._duplicate(held, seen):
                return ApplyResult("duplicate", record=self._records.get(event.key))
            if held is None:
                refused = self._make_room(len(event.resources), now)
                if refused:
                    self.bound_hits[refused] += 1
                    return ApplyResult(refused)
            self._remember(self._ids, seen, now)
            # An end's retention runs from now, not its eventTime: read late, it is still listed, counted and joined.
            new = PlatformRecord(event, ((event.event_status, event.event_time),),
                                 now if event.event_status in ENDED else None, now, ((seen, 1),))
            if new.ended:
                self._ended[event.key] = None
            if held is None:  # one status known: no impact yet
                self._records[event.key] = new
                self._vms += len(event.resources)
                return ApplyResult("applied", new)
            new = self._within_room(held, new)
            repeat = held.time_of(event.event_status) is not None
            merged = combine(held, replace(new, changed_at=held.changed_at) if repeat else new,
                             self.limits.resources_per_event)
            self._records[event.key] = merged
            self._vms += len(merged.event.resources) - len(held.event.resources)
            return ApplyResult("repeat" if repeat else "applied", merged)

    def _duplicate(self, held: PlatformRecord | None, seen: str) -> bool:
        """A message folded in already: one more copy of it on its record (one past MAX_COPIES is not counted)."""
        if held is not None and seen in dict(held.copies):
            self._records[held.key] = replace(held, copies=_copies(held.copies, ((seen, 1),)))
            return True
        return seen in self._ids

    def expire(self, now: float) -> list[PlatformRecord]:
        """Forget the records ended ``retention`` ago and the open ones unchanged for ``open_expiry``, remembering their
        EventIds a while so a late copy does not bring them back; the records forgotten."""
        limits = self.limits
        with self._lock:
            gone = [record for record in self._records.values()
                    if (record.ended_at is not None and record.ended_at + limits.retention <= now)
                    or (record.ended_at is None and record.changed_at + limits.open_expiry <= now)]
            for record in gone:
                self._forget(record.key, now)
            _drop_before(self._ids, now - limits.retention)
            _drop_before(self._forgotten, now - limits.open_expiry)
        return gone

    def records(self) -> list[PlatformRecord]:
        with self._lock:
            return list(self._records.values())

    def sizes(self) -> dict[str, int]:
        """What it holds now: records, Event Grid ids remembered, forgotten EventIds remembered (each bounded)."""
        with self._lock:
            return {"events": len(self._records), "ids": len(self._ids), "forgotten": len(self._forgotten),
                    "vms": self._vms}

    def _remember(self, seen: OrderedDict[str, float], key: str, now: float) -> None:
        if len(seen) >= self.limits.ids:
            seen.popitem(last=False)
            self.bound_hits["platform_ids"] += 1
        seen[key] = now

    def _make_room(self, vms: int, now: float) -> str | None:
        """Room for a new EventId naming ``vms`` VMs, forgetting ended events first; else the bound that refuses it."""
        limits = self.limits
        while len(self._records) >= limits.events or self._vms + vms > limits.vms:
            if not self._ended:
                return "platform_events" if len(self._records) >= limits.events else "platform_vms"
            self._forget(next(iter(self._ended)), now)
        return None

    def _within_room(self, held: PlatformRecord, new: PlatformRecord) -> PlatformRecord:
        """``new`` naming no more VMs that ``held`` lacks than there is room for (the bound hit when it did)."""
        room = max(0, self.limits.vms - self._vms)
        if len(new.event.resources) <= room:
            return new
        known = {name.casefold() for name in held.event.resources}
        extra = [name for name in new.event.resources if name.casefold() not in known]
        if len(extra) <= room:
            return new
        self.bound_hits["platform_vms"] += 1
        allowed = {name.casefold() for name in extra[:room]} | known
        names = tuple(name for name in new.event.resources if name.casefold() in allowed)
        return replace(new, event=replace(new.event, resources=names))

    def _forget(self, key: str, now: float) -> None:
        record = self._records.pop(key, None)
        self._vms -= len(record.event.resources) if record else 0
        self._ended.pop(key, None)
        self._remember(self._forgotten, key, now)


def _drop_before(seen: OrderedDict[str, float], cutoff: float) -> None:
    """Drop entries older than ``cutoff`` from the front (insertion order is time order, the clock allowing)."""
    while seen and next(iter(seen.values())) < cutoff:
        seen.popitem(last=False)


def _within(records: Iterable[PlatformRecord], limits: PlatformLimits) -> tuple[list[PlatformRecord], int]:
    """Saved records held to ``limits``, in their order, and the VM names they keep: each cut to
    ``resources_per_event`` names, then kept while the events and VM names fit, open ones first, later ones first."""
    kept: dict[str, PlatformRecord] = {}
    vms = 0
    for record in sorted(records, key=lambda record: record.ended_at is None)[::-1]:  # open ones first
        resources = record.event.resources[: limits.resources_per_event]
        if len(kept) >= limits.events or record.key in kept or vms + len(resources) > limits.vms:
            continue
        cut = len(resources) < len(record.event.resources)
        kept[record.key] = replace(record, event=replace(record.event, resources=resources)) if cut else record
        vms += len(resources)
    return list(kept.values())[::-1], vms
