"""Each EventId's home, and what was counted of the EventIds homed at the partitions this replica shows.

An EventId's home is a partition of the platform's hub (the sidecars' hub when only that one is read), by a stable
hash of its key (``hubs.home``). Only the replica that shows the home counts the EventId (``counting.COUNTING``),
keeping what it counted (``Counted``) in the home's blob, and applying each increment once that blob is written
(``OwnedPlatform.pending``): a partition lost before its write is counted by its next owner instead, never twice.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Mapping

from se_exporter.fleet.collector import FleetMetrics
from se_exporter.fleet.platform.counting import Counted, top_up
from se_exporter.fleet.platform.hubs import HubPlatform, home
from se_exporter.fleet.platform.records import PlatformRecord
from se_exporter.fleet.report import Report

MAX_COUNTED = 100_000  # EventIds whose counting is remembered (ReconcileSettings.ids)


class Homes:
    """The homes shown here: what was counted of their EventIds, and which homes' blobs must be written again."""

    def __init__(self, hubs: Mapping[str, HubPlatform], metrics: FleetMetrics, report: Report,
                 open_expiry: float) -> None:
        self._hubs, self._metrics, self._report, self._expiry = hubs, metrics, report, open_expiry
        self.counted: OrderedDict[str, Counted] = OrderedDict()  # EventId key -> what was counted of it
        # The same keys by home partition, with the partition count they were placed under: a blob's write then
        # looks at its own EventIds only (100,000 remembered over 32 partitions cost 1.4 s a round otherwise).
        self._by_home: dict[str, set[str]] = {}
        self._placed_for: int | None = None
        self._dirty: set[str] = set()  # home partitions whose ``counted`` changed since written

    @property
    def role(self) -> str | None:
        """The hub whose partitions are the EventIds' homes: the platform's, else the sidecars'."""
        return "platform" if "platform" in self._hubs else next(iter(self._hubs), None)

    def home_of(self, key: str) -> str | None:
        side = self._hubs.get(self.role or "")
        count = side.partitions() if side is not None else None
        return home(key, count) if count else None

    def is_here(self, key: str) -> bool:
        side = self._hubs.get(self.role or "")
        partition_id = self.home_of(key)
        return side is not None and partition_id is not None and side.fleet.is_shown(partition_id) \
            and partition_id in side.held

    def count(self, record: PlatformRecord) -> None:
        """Tops the EventId's counters up to what its merged record says (``counting.COUNTING``)."""
        metrics = self._metrics
        counters = {"platform_events": metrics.platform_events, "impact_seconds": metrics.impact_seconds,
                    "platform_duplicates": metrics.platform_duplicates}
        for increment in top_up(self.remember(record.key), record):
            self.mark(record.key)
            counter = counters[increment.counter]
            child = counter.labels(*increment.labels) if increment.labels else counter
            self.pending(record.key, functools.partial(child.inc, increment.amount))

    def pending(self, key: str, apply: Callable[[], object]) -> None:
        """An EventId's count, applied once its home partition's blob remembers it (see ``OwnedPlatform.pending``)."""
        side = self._hubs.get(self.role or "")
        partition_id = self.home_of(key)
        held = side.held.get(partition_id) if side is not None and partition_id is not None else None
        if held is None:
            apply()  # not homed here after all: nowhere to remember it (callers ask ``is_here`` first)
        else:
            held.pending.append(apply)

    def remember(self, key: str) -> Counted:
        """What was counted of ``key`` (a new entry when none; the oldest dropped past ``MAX_COUNTED``)."""
        entry = self.counted.get(key)
        if entry is None:
            if len(self.counted) >= MAX_COUNTED:
                self._report.bound_hit("platform_coverage_ids")
                self._drop(next(iter(self.counted)))
            entry = self._add(key, Counted())
            self.mark(key)
        return entry

    def _add(self, key: str, entry: Counted) -> Counted:
        self.counted[key] = entry
        partition_id = self.home_of(key)
        if partition_id is not None:
            self._placed().setdefault(partition_id, set()).add(key)
        return entry

    def _drop(self, key: str) -> None:
        """``key`` forgotten: its home's blob is written without it."""
        del self.counted[key]
        partition_id = self.home_of(key)
        if partition_id is not None:
            self._placed().get(partition_id, set()).discard(key)
            self._dirty.add(partition_id)

    def _placed(self) -> dict[str, set[str]]:
        """``_by_home``, placed again when the partition count changed (a hub's partitions are added, rarely)."""
        side = self._hubs.get(self.role or "")
        count = side.partitions() if side is not None else None
        if count != self._placed_for:
            self._placed_for, self._by_home = count, {}
            for key in self.counted:
                partition_id = self.home_of(key)
                if partition_id is not None:
                    self._by_home.setdefault(partition_id, set()).add(key)
        return self._by_home

    def mark(self, key: str) -> None:
        partition_id = self.home_of(key)
        if partition_id is not None:
            self._dirty.add(partition_id)

    def forget(self, listed: set[str], now: float) -> None:
        """What was counted of an EventId no picture holds is kept as long as a forgotten EventId is (the open
        expiry, within ``MAX_COUNTED``): a copy read later on another partition then adds only what is new."""
        for key, entry in list(self.counted.items()):
            if key in listed:
                continue
            if entry.gone_at is None:
                entry.gone_at = now
                self.mark(key)
            elif entry.gone_at + self._expiry <= now:
                self._drop(key)

    # ------------------------------------------------------------------ a home partition's blob

    def of_partition(self, partition_id: str) -> dict[str, Counted]:
        """What its blob keeps: the counting of the EventIds homed there."""
        return {key: self.counted[key] for key in self._placed().get(partition_id, ())}

    def restore(self, counted: Mapping[str, Counted]) -> None:
        for key, entry in counted.items():
            if key not in self.counted:
                self._add(key, entry)

    def release(self, partition_id: str) -> None:
        """Its EventIds' counting is the next owner's, from the blob."""
        for key in self._placed().pop(partition_id, set()):
            del self.counted[key]
        self._dirty.discard(partition_id)

    def dirty(self, partition_id: str) -> bool:
        return partition_id in self._dirty

    def written(self, partition_id: str, wrote: bool) -> None:
        """A write of the partition's blob was prepared (``wrote`` False: then failed, so it is dirty again)."""
        if wrote:
            self._dirty.discard(partition_id)
        else:
            self._dirty.add(partition_id)
