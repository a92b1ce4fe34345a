"""Each EventId's home, and what was counted of the EventIds homed at the partitions this replica shows.

An EventId's home is a partition of the platform's hub (the sidecars' hub when only that one is read), by a stable
hash of its key (``hubs.home``); only the replica that shows it counts the EventId, by ``counting``'s rules.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from se_exporter.fleet.collector import FleetMetrics
from se_exporter.fleet.platform.counting import Counted, Increment, Verdict, top_up, top_up_unannounced
from se_exporter.fleet.platform.hubs import HubPlatform, OwnedPlatform, home
from se_exporter.fleet.platform.records import PlatformRecord
from se_exporter.fleet.report import Report

MAX_COUNTED = 100_000  # EventIds whose counting is remembered (ReconcileSettings.ids)


class Homes:
    """The homes shown here, and what was counted of their EventIds (on each home's ``OwnedPlatform.counted``)."""

    def __init__(self, hubs: Mapping[str, HubPlatform], metrics: FleetMetrics, report: Report,
                 open_expiry: float) -> None:
        self._hubs, self._metrics, self._report, self._expiry = hubs, metrics, report, open_expiry

    @property
    def role(self) -> str | None:
        """The hub whose partitions are the EventIds' homes: the platform's, else the sidecars'."""
        return "platform" if "platform" in self._hubs else next(iter(self._hubs), None)

    def _held(self) -> Mapping[str, OwnedPlatform]:
        side = self._hubs.get(self.role or "")
        return side.held if side is not None else {}

    def home_of(self, key: str) -> str | None:
        side = self._hubs.get(self.role or "")
        count = side.partitions() if side is not None else None
        return home(key, count) if count else None

    def is_here(self, key: str) -> bool:
        side, partition_id = self._hubs.get(self.role or ""), self.home_of(key)
        return side is not None and partition_id is not None and side.fleet.is_shown(partition_id) \
            and partition_id in side.held

    @property
    def size(self) -> int:
        """EventIds whose counting is remembered here."""
        return sum(len(held.counted) for held in self._held().values())

    def count(self, record: PlatformRecord, verdicts: dict[str, Verdict]) -> None:
        """Tops the EventId's counters up to what its merged record and its VMs' merged verdicts say."""
        self._apply(record.key, top_up(self.remember(record.key), record, verdicts))

    def count_unannounced(self, key: str, event_type: str) -> None:
        self._apply(key, top_up_unannounced(self.remember(key), event_type))

    def _apply(self, key: str, increments: list[Increment]) -> None:
        """Each increment applied once the home's blob remembers it (callers ask ``is_here`` first)."""
        held = self._held()[self.home_of(key) or ""]
        for increment in increments:
            held.changes += 1
            metric = getattr(self._metrics, increment.counter)
            if increment.labels:
                metric = metric.labels(*increment.labels)
            add = metric.observe if increment.counter == "announcement_lag" else metric.inc
            held.pending.append(functools.partial(add, increment.amount))

    def remember(self, key: str) -> Counted:
        """What was counted of ``key``, on its home's ``OwnedPlatform`` (moved there if another held partition kept it:
        the hub's partitions were added; a new entry when none, the home's oldest dropped past ``MAX_COUNTED``)."""
        helds = self._held()
        held = helds[self.home_of(key) or ""]
        entry = held.counted.get(key)
        if entry is None:
            moved = next((other for other in helds.values() if key in other.counted), None)
            entry = moved.counted.pop(key) if moved is not None else Counted()
            if moved is not None:
                moved.changes += 1
            if self.size >= MAX_COUNTED and held.counted:
                self._report.bound_hit("platform_coverage_ids")
                del held.counted[next(iter(held.counted))]
            held.counted[key] = entry
            held.changes += 1
        return entry

    def forget(self, listed: set[str], now: float) -> None:
        """What was counted of an EventId no picture holds is kept as long as a forgotten EventId is (the open
        expiry, within ``MAX_COUNTED``): a copy read later on another partition then adds only what is new."""
        for held in self._held().values():
            for key, entry in [item for item in held.counted.items() if item[0] not in listed]:
                if entry.gone_at is None:
                    entry.gone_at = now
                    held.changes += 1
                elif entry.gone_at + self._expiry <= now:
                    del held.counted[key]
                    held.changes += 1
