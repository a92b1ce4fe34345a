"""The platform stream in ``se-exporter fleet``: one ``Platform`` per replica, the reconciliation loop (the other
parts, a module each: the package's docstring).

Reconciliation runs on the loop every ``RECONCILE_EVERY`` seconds, not in a scrape: a scrape renders the last result.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from se_exporter.fleet.collector import FleetMetrics
from se_exporter.fleet.message import VmState
from se_exporter.fleet.platform.counting import Verdict, judge, merged
from se_exporter.fleet.platform.coverage import (
    COVERAGE_BOUND_NAMES,
    Coverage,
    Reconciler,
    ReconcileSettings,
    Reconciliation,
    name_key,
)
from se_exporter.fleet.platform.homes import Homes
from se_exporter.fleet.platform.hubs import HubPlatform, OwnedPlatform
from se_exporter.fleet.platform.partitions import PlatformReader
from se_exporter.fleet.platform.reader import PLATFORM_BOUND_NAMES, PLATFORM_INVALID_REASONS
from se_exporter.fleet.platform.records import (
    PICTURE_BOUND_NAMES,
    PlatformLimits,
    PlatformPicture,
    PlatformRecord,
    merge,
)
from se_exporter.fleet.platform.saving import VmVerdicts
from se_exporter.fleet.report import Report
from se_exporter.fleet.statestore import StateStore
from se_exporter.fleet.vms import Fleet
from se_exporter.infra.azure.clients import describe

log = logging.getLogger("se_exporter.fleet")
RECONCILE_EVERY = 5.0  # seconds between reconciliations at most (the checkpoint interval when shorter)
BURST_DEFERS_UP_TO = 30.0  # while platform messages keep arriving, reconciliation waits up to this long (see run)
BURST_MESSAGES = 1_000  # platform messages applied since the last round that make a burst (see run)


# ``name_key``, remembered: a reconciliation looks at every shown VM's name (100,000 every few seconds).
_key_of = functools.lru_cache(maxsize=262_144)(name_key)


@dataclass
class LastReconciliation:
    """The last reconciliation, for scrapes: swapped whole, read without a lock."""

    records: tuple[PlatformRecord, ...] = ()
    coverage: tuple[Coverage, ...] = ()
    informed: frozenset[str] = frozenset()
    sizes: dict[str, int] = field(default_factory=dict)


@dataclass
class _Shown:
    """One shown partition in one reconciliation (``alive``: its named VMs heard from within the VM expiry)."""

    held: OwnedPlatform
    alive: set[str] = field(default_factory=set)
    verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)  # EventId -> VM name -> verdict
    listed: dict[str, str] = field(default_factory=dict)  # EventId its VMs listed unannounced -> its event type

    def judging(self, named: dict[str, frozenset[str]], naming: dict[str, list[str]]) -> set[str]:
        """The EventIds judged here: judged before and still known, spoken of by the reconciler, or naming a live VM."""
        return {*(key for key in self.held.judged.vms if key in named), *self.verdicts,
                *(key for name in self.alive for key in naming.get(name, ()))}


class Platform:
    """The replica's platform side: the hubs' pictures, the reconciler, what was counted; one loop changes it."""

    def __init__(self, metrics: FleetMetrics, report: Report, retention: float, grace: float, vm_expiry: float,
                 max_message_bytes: int, clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 limits: PlatformLimits | None = None) -> None:
        self.metrics, self.report, self.clock, self.sleep = metrics, report, clock, sleep
        self.limits = limits or PlatformLimits(retention=retention)
        self.max_bytes = max_message_bytes
        self.reconciler = Reconciler(ReconcileSettings(vm_expiry, grace))
        self.hubs: dict[str, HubPlatform] = {}
        self.homes = Homes(self.hubs, metrics, report, self.limits.open_expiry)
        self.applied_at = 0.0  # monotonic time of the last platform message applied
        self.applied_since = 0  # platform messages applied since the last reconciliation round
        self._left_out: set[str] = set()  # EventIds the listing left out last round (bound platform_events)
        self.view = LastReconciliation()
        for reason in PLATFORM_INVALID_REASONS:
            metrics.invalid.labels(reason)
        for bound in (*PLATFORM_BOUND_NAMES, *PICTURE_BOUND_NAMES, *COVERAGE_BOUND_NAMES):
            metrics.bound_hits.labels(bound)
        metrics.warnings.labels("platform_event")

    def note_applied(self) -> None:
        """A platform message was applied (``run`` puts a round off during a burst)."""
        self.applied_at = time.monotonic()
        self.applied_since += 1

    def reader(self, role: str, fleet: Fleet, store: StateStore, partitions: Callable[[], int | None],
               peer_store: StateStore | None = None,
               partition_vms: Callable[[], dict[str, list[VmState]]] = dict) -> PlatformReader:
        side = self.hubs[role] = HubPlatform(role, fleet, store, partitions, peer_store, partition_vms=partition_vms)
        return PlatformReader(self, side)

    async def read_peers(self) -> None:
        """Every hub's peers read (``HubPlatform.read_peers``), so an EventId's home counts it wherever its messages
        landed and whichever replica shows its VMs."""
        for side in self.hubs.values():
            try:
                await side.read_peers()
            except Exception as error:  # counted and logged; the records last read are kept meanwhile
                self.metrics.errors.labels("state_read").inc()
                self.report.once(f"platform-peer:{side.role}", logging.WARNING, "cannot read the other partitions' "
                                 "platform pictures (%s); trying again", describe(error))

    # ------------------------------------------------------------------ reconciliation

    def reconcile(self) -> LastReconciliation:
        """Expire, merge, judge, count what is new; the view scrapes render."""
        now = self.clock()
        pictures = self._expired(now)
        records = self._listed(self._merged(pictures, now))
        if not records and not self.homes.size and not self.view.records:
            return self.view  # a fleet that has not opted in costs nothing here
        coverage, unannounced = self._reconciled(records, now)
        informed = frozenset(record.key for record in records if self.homes.is_here(record.key))
        self.homes.forget({record.key for record in records} | unannounced, now)
        sizes = Counter({**self.reconciler.sizes(), "counted": self.homes.size})  # the memory gauges
        for picture in pictures:
            sizes.update(picture.sizes())
        self.view = LastReconciliation(tuple(records), coverage, informed, dict(sizes))
        return self.view

    def _expired(self, now: float) -> list[PlatformPicture]:
        """The held pictures, each with what ended past the retention expired (and the bounds that hit said)."""
        pictures = [held.picture for side in self.hubs.values() for held in side.held.values()
                    if held.picture is not None]
        for picture in pictures:
            before = dict(picture.bound_hits)
            picture.expire(now)
            self.report_bounds(picture, before)
        return pictures

    def _merged(self, pictures: list[PlatformPicture], now: float) -> list[PlatformRecord]:
        """One record per EventId over the held pictures and the peers' (their records within the retention)."""
        retention = self.limits.retention
        peers = [tuple(record for record in records if record.ended_at is None or record.ended_at + retention > now)
                 for side in self.hubs.values() for partition_id, records in side.peers.items()
                 if partition_id not in side.held]
        return merge([*(picture.records() for picture in pictures), *peers])

    def _listed(self, records: list[PlatformRecord]) -> list[PlatformRecord]:
        """Several partitions' pictures: the series stay within one picture's bound, the open and the latest ended
        kept; each EventId left out reported once, not again at every round."""
        if len(records) <= self.limits.events:
            self._left_out = set()
            return records
        records.sort(key=lambda record: (record.ended_at is None, record.ended_at or record.changed_at))
        left_out = {record.key for record in records[:-self.limits.events]}
        if left_out - self._left_out:
            self.report.bound_hit("platform_events", len(left_out - self._left_out))
        self._left_out = left_out
        return records[-self.limits.events:]

    def _reconciled(self, records: list[PlatformRecord], now: float) -> tuple[tuple[Coverage, ...], set[str]]:
        """The records against the VMs shown here, judged (``COVERAGE`` 1) and counted where homed here (2 and 3):
        the coverage this replica shows, and the unannounced EventIds homed here."""
        named = {record.key: frozenset(_key_of(resource) for resource in record.event.resources) for record in records}
        vms, shown, where = self._shown_vms(now, frozenset().union(*named.values()))
        result = self.reconciler.update(records, vms, now, absent=False)
        for bound in result.bounds:
            self.report.bound_hit(bound)
        self._judge(named, shown, where, result)
        judgements, complete = self._judgements()
        nowhere = self._count(records, judgements, complete)
        unannounced: set[str] = set()  # homed here, listed by live VMs for the grace, never announced (COVERAGE 2)
        for judged in judgements:
            for key, event_type in judged.listed.items():
                if key not in unannounced and self.homes.is_here(key) and not self.reconciler.announced(key):
                    unannounced.add(key)
                    self.homes.count_unannounced(key, event_type)
        return _shown_coverage(records, shown) + nowhere, unannounced

    def _shown_vms(self, now: float, named: frozenset[str]) -> tuple[list[VmState], list[_Shown], dict[str, _Shown]]:
        """The VMs shown here that matter (named by an event, or listing one: the rest of a fleet of 100,000 would
        only cost time), each shown partition held here, and each VM name's partition (whose judgement holds it)."""
        vms: list[VmState] = []
        shown: list[_Shown] = []
        where: dict[str, _Shown] = {}
        expiry = self.reconciler.settings.vm_expiry
        for side in self.hubs.values():
            for partition_id, listed in side.partition_vms().items():
                partition = _Shown(side.held[partition_id]) if partition_id in side.held else None
                if partition is not None:
                    shown.append(partition)
                for vm in listed:
                    name = _key_of(vm.vm_name)
                    if not vm.events and name not in named:
                        continue
                    vms.append(vm)
                    if partition is not None:
                        where.setdefault(name, partition)
                        if now - vm.seen_at <= expiry:
                            partition.alive.add(name)
        return vms, shown, where

    def _judge(self, named: dict[str, frozenset[str]], shown: list[_Shown], where: dict[str, _Shown],
               result: Reconciliation) -> None:
        """Each shown partition's judgement (``COVERAGE`` 1), bounded: ``ReconcileSettings.pairs`` verdicts, ``ids``
        unannounced EventIds per partition; a change is written with the partition's next save."""
        for row in result.coverage:
            name = _key_of(row.vm_name)
            if name in where:
                where[name].verdicts.setdefault(row.event_key, {})[name] = (row.coverage, row.lag)
        for key, event_type, name in result.listed:
            if name in where:
                where[name].listed[key] = event_type
        naming: dict[str, list[str]] = {}  # VM name -> the EventIds naming it
        for key, names in named.items():
            for name in names:
                naming.setdefault(name, []).append(key)
        bound = self.reconciler.settings
        room, over = bound.pairs, 0
        for partition in shown:
            judged, cut, room = _judgement(partition, named, naming, room, bound.ids)
            over += cut
            if judged != partition.held.judged:
                partition.held.judged = judged
                partition.held.changes += 1
        if over:
            self.report.bound_hit("platform_coverage_pairs", over)

    def _judgements(self) -> tuple[list[VmVerdicts], bool]:
        """Every partition's judgement known here (held, or a peer's blob's), and whether every hub's are current."""
        judgements: list[VmVerdicts] = []
        complete = True
        for side in self.hubs.values():
            judgements.extend(held.judged for held in side.held.values())
            judgements.extend(judged for partition_id, judged in side.peer_judged.items()
                              if partition_id not in side.held)
            count = side.partitions()  # a held partition hidden now (a hand-over) has not judged what is new
            complete = complete and count is not None and all(
                side.fleet.is_shown(partition_id) if partition_id in side.held else partition_id in side.peer_judged
                for partition_id in map(str, range(count)))
        return judgements, complete

    def _count(self, records: list[PlatformRecord], judgements: list[VmVerdicts],
               complete: bool) -> tuple[Coverage, ...]:
        """The EventIds homed here topped up (``COUNTING``, ``COVERAGE`` 2): their merged record, and their VMs'
        verdicts merged over every partition's judgement, ``no_sidecar`` for a named VM alive in none once every
        partition has judged the EventId; those ``no_sidecar`` rows, which only the home shows."""
        rows: list[Coverage] = []
        everywhere = frozenset.intersection(*(judged.keys for judged in judgements)) if complete and judgements \
            else frozenset()  # the EventIds every partition has judged
        for record in records:
            if not self.homes.is_here(record.key):
                continue
            verdicts = merged([judged.vms[record.key] for judged in judgements if record.key in judged.vms])
            if record.key in everywhere:
                rows.extend(_no_sidecar(record, verdicts))
            self.homes.count(record, verdicts)
        return tuple(rows)

    def report_bounds(self, picture: PlatformPicture, before: dict[str, int]) -> None:
        """The picture's bounds reached since ``before`` (its ``bound_hits`` then), reported."""
        for name, count in (Counter(picture.bound_hits) - Counter(before)).items():  # only those that grew
            self.report.bound_hit(name, count)

    async def peers(self, stop: asyncio.Event, every: float) -> None:
        """``read_peers`` every ``every`` seconds (the checkpoint interval: how often they are written)."""
        while not stop.is_set():
            await self.sleep(every)
            await self.read_peers()

    async def run(self, stop: asyncio.Event, every: float) -> None:
        """Reconcile every ``every`` seconds, and write the platform side of partitions without a position yet. A
        round is put off, for up to ``BURST_DEFERS_UP_TO`` seconds, during a burst (``BURST_MESSAGES`` applied since
        the last round, the latest within ``every``): a reconciliation holds the loop the burst's reading waits for
        (``scripts/fleet_bench.py --platform``). Azure's usual trickle is never one: put off, a short event could end
        unjudged, and a live sidecar's miss of it would never be said."""
        last = time.monotonic()
        while not stop.is_set():
            await self.sleep(every)
            at = time.monotonic()
            if self.applied_since >= BURST_MESSAGES and at - self.applied_at < every and at - last < BURST_DEFERS_UP_TO:
                continue
            last, self.applied_since = at, 0
            try:
                self.reconcile()
                await self._write_quiet_homes()
            except Exception as error:  # never out of the loop: counted and logged; the next round tries again
                self.metrics.errors.labels("other").inc()
                self.report.once("platform:reconcile", logging.ERROR, "platform reconciliation failed: %s",
                                  describe(error))

    async def _write_quiet_homes(self) -> None:
        """Partitions without a position (nothing handled yet: the PartitionPersistence writes nothing for them) whose
        platform side changed: written at position -1, which a later write at a real position replaces."""
        for side in self.hubs.values():
            reader = PlatformReader(self, side)
            for partition_id in sorted(side.held):
                write = reader.prepare(partition_id, -1) if side.fleet.position(partition_id) is None else None
                if write is not None:  # None: its platform side is written already
                    await write()


def _shown_coverage(records: list[PlatformRecord], shown: list[_Shown]) -> tuple[Coverage, ...]:
    """The coverage rows of the shown partitions' judgements: each verdict that says something."""
    events = {record.key: record.event for record in records}
    return tuple(Coverage(key, events[key].event_id, events[key].event_type, name,
                          "observed" if lag is not None else str(reason), lag)
                 for partition in shown for key, verdicts in partition.held.judged.vms.items()
                 for name, (reason, lag) in verdicts.items() if reason is not None or lag is not None)


def _no_sidecar(record: PlatformRecord, verdicts: dict[str, Verdict]) -> list[Coverage]:
    """Each VM ``record`` names that no partition judged (alive in none): ``no_sidecar``, added to ``verdicts``."""
    rows = []
    for resource in record.event.resources:
        if _key_of(resource) not in verdicts:
            verdicts[_key_of(resource)] = ("no_sidecar", None)
            rows.append(Coverage(record.key, record.event.event_id, record.event.event_type, resource, "no_sidecar"))
    return rows


def _judgement(partition: _Shown, named: dict[str, frozenset[str]], naming: dict[str, list[str]], room: int,
               ids: int) -> tuple[VmVerdicts, int, int]:
    """One shown partition's judgement, its new verdicts within ``room`` (the verdicts still allowed over every
    partition) and its unannounced EventIds within ``ids``; with how many were cut and the room left."""
    old_vms = partition.held.judged.vms
    vms: dict[str, dict[str, Verdict]] = {}
    over = 0
    for key in partition.judging(named, naming):
        old = old_vms.get(key, {})
        verdicts = vms[key] = _judged_vms(old, partition.verdicts.get(key, {}), named[key], partition.alive)
        added = [name for name in verdicts if name not in old]
        cut = added[max(0, room - (len(verdicts) - len(added))):]  # new verdicts past the bound
        for name in cut:
            del verdicts[name]
        over, room = over + len(cut), room - len(verdicts)
    over += max(0, len(partition.listed) - ids)
    judged = VmVerdicts(frozenset(named), {key: verdicts for key, verdicts in vms.items() if verdicts},
                        dict(list(partition.listed.items())[:ids]))
    return judged, over, room


def _judged_vms(old: dict[str, Verdict], now: dict[str, tuple[str | None, float | None]], names: frozenset[str],
                alive: set[str]) -> dict[str, Verdict]:
    """One EventId's verdicts in one partition: each VM it names alive there, or judged there before, moved on by
    this round's coverage ``now``."""
    moved = {name: judge(old.get(name, (None, None)), *now.get(name, (None, None)))
             for name in (names & alive) | old.keys() | now.keys()}
    return {name: verdict for name, verdict in moved.items() if verdict != (None, None) or name in alive}
