"""The platform stream in ``se-exporter fleet``: one ``Platform`` per replica, the reconciliation loop.

The parts, a module each: ``partitions.PlatformReader`` (one per hub read, ``consumer.Service.first_reader``: it
sees every message of that hub first, and writes each owned partition's picture to its blob beside the VM state),
``hubs`` (one hub's owned partitions, and the other partitions' pictures read from their blobs), ``homes`` (each
EventId's home partition and what was counted of it: ``counting.COUNTING`` is the rule) and this module (merging
every picture, reconciling it with the VMs shown here, counting each pair's coverage once, rendering).

Reconciliation runs on the loop every ``RECONCILE_EVERY`` seconds (not in a scrape): the records of every held and
read picture, merged, against the VMs this replica shows; a scrape renders the last result.

A pair's coverage, counted once over restarts and replicas: a VM's miss and lag are counted by the replica that
shows the VM, and kept in the blob of its partition (``OwnedPlatform.missed`` and ``OwnedPlatform.lags``) so
neither a restart nor a hand-over counts it again. A replica that does not show every partition of every hub says
``no_sidecar`` only for an EventId homed here, once every partition has judged it (``OwnedPlatform.judged``, in
each partition's blob: per EventId, the named VMs alive there): never wrongly, at worst late. The reverse likewise:
each partition's ``judged`` lists the unannounced EventIds its VMs listed, and an EventId's home counts it from the
blobs of the partitions it does not show. What this leaves with several replicas (docs/fleet.md says it): every
figure a few checkpoint intervals behind one replica's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from se_exporter.fleet.collector import FLEET, FleetMetrics, write_gauges
from se_exporter.fleet.message import VmState
from se_exporter.fleet.platform.coverage import (
    COVERAGE_BOUND_NAMES,
    Coverage,
    Reconciler,
    ReconcileSettings,
    Reconciliation,
    name_key,
)
from se_exporter.fleet.platform.exposition import render_platform
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


@functools.lru_cache(maxsize=262_144)
def _key_of(name: str) -> str:
    """``name_key``, remembered: a reconciliation looks at every shown VM's name (100,000 every few seconds)."""
    return name_key(name)


@dataclass
class LastReconciliation:
    """The last reconciliation, for scrapes: swapped whole, read without a lock."""

    records: tuple[PlatformRecord, ...] = ()
    coverage: tuple[Coverage, ...] = ()
    informed: frozenset[str] = frozenset()
    sizes: dict[str, int] = field(default_factory=dict)


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
        self._where: dict[str, OwnedPlatform] = {}  # VM name (name_key) -> its partition, as of the last reconciliation
        self._missed_anywhere: set[tuple[str, str]] = set()  # (key, VM) misses counted in any memory known here
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
               partition_vms: Callable[[], dict[str, list[VmState]]] | None = None) -> PlatformReader:
        side = self.hubs[role] = HubPlatform(role, fleet, store, partitions, peer_store, partition_vms=partition_vms)
        return PlatformReader(self, side)

    async def read_peers(self) -> None:
        """Every partition's picture this replica does not hold, from its blob (``HubPlatform.read_peers``): so each
        replica knows every EventId, and an EventId's home replica lists and counts it wherever its messages
        landed. A blob unreadable now is counted and tried again next time."""
        for side in self.hubs.values():
            try:
                await side.read_peers()
            except Exception as error:  # counted and logged; the records last read are kept meanwhile
                self.metrics.errors.labels("state_read").inc()
                self.report.once(f"platform-peer:{side.role}", logging.WARNING, "cannot read the other partitions' "
                                 "platform pictures (%s); trying again", describe(error))

    def is_home_here(self, key: str) -> bool:
        return self.homes.is_here(key)

    def whole(self) -> bool:
        """This replica shows every partition of every hub: a VM it does not show is nowhere."""
        for side in self.hubs.values():
            count = side.partitions()
            if count is None or len(side.fleet.shown()) < count:
                return False
        return True

    # ------------------------------------------------------------------ reconciliation

    def reconcile(self) -> LastReconciliation:
        """Expire, merge, reconcile, count what is new; the view scrapes render."""
        now = self.clock()
        pictures = [held.picture for side in self.hubs.values() for held in side.held.values()
                    if held.picture is not None]
        gone = self._expire(pictures, now)
        records = self._listed(self._merged(pictures, now))
        if not records and not self.homes.counted and not self.view.records:
            return self.view  # a fleet that has not opted in costs nothing here
        result = self._reconciled(records, now)
        informed = frozenset(record.key for record in records if self.is_home_here(record.key))
        for record in records:
            if record.key in informed:
                self.homes.count(record)
        held_keys = {record.key for record in records}
        self._forget(gone - held_keys)
        self.homes.forget(held_keys, now)
        sizes = {**self.reconciler.sizes(), "counted": len(self.homes.counted)}
        for picture in pictures:
            for name, size in picture.sizes().items():
                sizes[name] = sizes.get(name, 0) + size
        self.view = LastReconciliation(tuple(records), result.coverage, informed, sizes)
        return self.view

    def _expire(self, pictures: list[PlatformPicture], now: float) -> set[str]:
        """The EventIds the held pictures forgot now."""
        gone: set[str] = set()
        for picture in pictures:
            before = dict(picture.bound_hits)
            gone.update(record.key for record in picture.expire(now))
            self.report_bounds(picture, before)
        return gone

    def _merged(self, pictures: list[PlatformPicture], now: float) -> list[PlatformRecord]:
        """One record per EventId over the held pictures and the others read from their blobs (those within the
        retention)."""
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

    def _reconciled(self, records: list[PlatformRecord], now: float) -> Reconciliation:
        """The records against the VMs shown here: each pair's coverage, and its counts (``_counts``)."""
        named = frozenset(_key_of(resource) for record in records for resource in record.event.resources)
        vms, alive = self._shown_vms(now, named)
        self._missed_anywhere = self._all_missed()
        whole = self.whole()
        result = self.reconciler.update(records, vms, now, counts=self._counts, absent=whole)
        self._count_result(result)
        self._judge(records, alive, result.listed)
        self._count_listed_elsewhere()
        if not whole:
            result = self._nowhere(records, result)
        return self._decided(records, result)

    def _all_missed(self) -> set[tuple[str, str]]:
        """Every (EventId key, VM) miss counted that this replica knows of: in its partitions' memories, its homes',
        and the other partitions' blobs. A pair is counted once whatever its reason: a VM first without a sidecar
        (counted by the home) whose sidecar then appears elsewhere is not counted again as missed there (unless
        within the couple of checkpoint intervals before that replica reads the home's blob)."""
        known = {(key, name) for key, entry in self.homes.counted.items() for name in entry.missed}
        for side in self.hubs.values():
            for held in side.held.values():
                known.update(held.missed)
            for missed in side.peer_missed.values():
                known.update(missed)
        return known

    def _judge(self, records: list[PlatformRecord], shown: dict[int, tuple[OwnedPlatform, set[str]]],
               unannounced: tuple[tuple[str, str, str], ...]) -> None:
        """Each shown partition's ``judged``: the EventIds known, per EventId the VMs it names alive there, and the
        unannounced EventIds its VMs listed (at most ``ReconcileSettings.ids``; a change is written with the
        partition's next save)."""
        keys = frozenset(record.key for record in records)
        named = [(record.key, frozenset(name_key(resource) for resource in record.event.resources))
                 for record in records]
        listed: dict[int, dict[str, str]] = {}
        bound, over = self.reconciler.settings.ids, 0
        for key, event_type, name in unannounced:
            held = self._where.get(name)
            if held is not None:
                mine = listed.setdefault(id(held), {})
                if len(mine) < bound:
                    mine[key] = event_type
                else:
                    over += 1
        if over:
            self.report.bound_hit("platform_coverage_ids", over)
        for held, alive in shown.values():
            judged = VmVerdicts(keys, {key: names & alive for key, names in named if alive and not names.isdisjoint(
                alive)}, listed.get(id(held), {}))
            if judged != held.judged:
                held.judged = judged
                held.changes += 1

    def _count_listed_elsewhere(self) -> None:
        """The reverse across replicas: an EventId homed here that another partition's blob says its live VMs listed
        and the platform never announced is counted unannounced here, once (remembered as the home's own are)."""
        for side in self.hubs.values():
            for partition_id, judged in side.peer_judged.items():
                if partition_id in side.held:
                    continue
                for key, event_type in judged.listed.items():
                    if self.reconciler.announced(key) or not self._counts("unannounced", key, ""):
                        continue
                    self.homes.remember(key).unannounced = True
                    self.homes.mark(key)
                    self.homes.pending(key, self.metrics.unannounced_events.labels(event_type).inc)

    def _nowhere(self, records: list[PlatformRecord], result: Reconciliation) -> Reconciliation:
        """With several replicas: ``no_sidecar`` for a named VM of an EventId homed here when every partition of every
        hub either is shown here or has judged that EventId in its blob, and none has it alive; counted once, by the
        home. A partition that has not judged it yet (its owner has not learnt of it, or not written since) leaves
        the VM without coverage: never a wrong ``no_sidecar``."""
        judgments: list[VmVerdicts] = []
        for side in self.hubs.values():
            count = side.partitions()
            if count is None:
                return result
            for partition_id in map(str, range(count)):
                if side.fleet.is_shown(partition_id) and partition_id in side.held:
                    judgments.append(side.held[partition_id].judged)
                elif partition_id in side.peer_judged:
                    judgments.append(side.peer_judged[partition_id])
                else:
                    return result
        covered = {(row.event_key, name_key(row.vm_name)) for row in result.coverage}
        rows: list[Coverage] = []
        for record in records:
            if not self.is_home_here(record.key) or any(record.key not in judged.keys for judged in judgments):
                continue
            for resource in record.event.resources:
                name = name_key(resource)
                if (record.key, name) in covered \
                        or any(name in judged.alive.get(record.key, ()) for judged in judgments):
                    continue
                rows.append(Coverage(record.key, record.event.event_id, record.event.event_type, resource,
                                     "no_sidecar"))
                if self._counts("missed", record.key, name):
                    self.homes.remember(record.key).missed[name] = "no_sidecar"
                    self.homes.mark(record.key)
                    self.homes.pending(record.key, self.metrics.missed_events.labels(
                        record.event.event_type, "no_sidecar").inc)
        return replace(result, coverage=result.coverage + tuple(rows)) if rows else result

    def _shown_vms(self, now: float,
                   named: frozenset[str]) -> tuple[list[VmState], dict[int, tuple[OwnedPlatform, set[str]]]]:
        """The VMs this replica shows that matter to the reconciliation (named by an event, or listing one: the
        rest of a fleet of 100,000 would only cost it time), noting each one's partition (``_where``: whose memory
        counts its pairs), and per shown partition the names of its named VMs alive (heard from within the VM
        expiry)."""
        vms: list[VmState] = []
        alive: dict[int, tuple[OwnedPlatform, set[str]]] = {}  # by id(): partition ids repeat across hubs
        expiry = self.reconciler.settings.vm_expiry
        self._where = {}
        for side in self.hubs.values():
            if side.partition_vms is None:
                vms.extend(vm for vm in side.fleet.vms() if vm.events or _key_of(vm.vm_name) in named)
                continue
            for partition_id, listed in side.partition_vms().items():
                held = side.held.get(partition_id)
                names = alive.setdefault(id(held), (held, set()))[1] if held is not None else set()
                for vm in listed:
                    name = _key_of(vm.vm_name)
                    if not vm.events and name not in named:
                        continue
                    vms.append(vm)
                    if held is not None:
                        self._where.setdefault(name, held)
                        if now - vm.seen_at <= expiry:
                            names.add(name)
        return vms, alive

    def _forget(self, keys: set[str]) -> None:
        """Each partition's memory of its VMs' pairs of EventIds forgotten goes with them, and is bounded besides
        (past the bound, some dropped and the bound hit counted), as the reconciler's pairs are."""
        bound = self.reconciler.settings.pairs
        for side in self.hubs.values():
            for held in side.held.values():
                stale = [pair for pair in (*held.missed, *held.lags) if pair[0] in keys]
                over_missed, over_lags = max(0, len(held.missed) - bound), max(0, len(held.lags) - bound)
                if over_missed or over_lags:
                    self.report.bound_hit("platform_coverage_pairs", over_missed + over_lags)
                    stale.extend(list(held.missed)[:over_missed])
                    stale.extend(list(held.lags)[:over_lags])
                for pair in stale:
                    held.missed.pop(pair, None)
                    held.lags.discard(pair)
                if stale:
                    held.changes += 1

    def _count_result(self, result: Reconciliation) -> None:
        """The reconciliation's counts into the memory of what was counted, and (once that is written) into the
        counters."""
        missed, unannounced, lags = iter(result.missed), iter(result.unannounced), iter(result.lags)
        reasons = {(row.event_key, name_key(row.vm_name)): row.coverage for row in result.coverage}
        for kind, key, name in result.counted:
            apply: Callable[[], object]
            if kind == "missed":
                event_type, reason = next(missed)
                apply = self.metrics.missed_events.labels(event_type, reason).inc
            elif kind == "unannounced":
                apply = self.metrics.unannounced_events.labels(next(unannounced)).inc
            else:
                apply = functools.partial(self.metrics.announcement_lag.observe, next(lags))
            held = self._where.get(name) if kind != "unannounced" else None
            if held is not None:  # the VM's partition keeps it
                if kind == "missed":
                    held.missed[(key, name)] = reasons.get((key, name), "missed")
                else:
                    held.lags.add((key, name))
                held.changes += 1
                held.pending.append(apply)
                continue
            entry = self.homes.remember(key)  # its home keeps it: an EventId, or a VM no sidecar shows
            if kind == "unannounced":
                entry.unannounced = True
            elif kind == "missed":
                entry.missed[name] = reasons.get((key, name), "missed")
            else:
                entry.lag.add(name)
            self.homes.mark(key)
            self.homes.pending(key, apply)
        for bound in result.bounds:
            self.report.bound_hit(bound)

    def _decided(self, records: list[PlatformRecord], result: Reconciliation) -> Reconciliation:
        """An ended event keeps the misses decided while it was open, and the VMs that listed it stay observed (its
        VMs' IMDS no longer list it, and the reconciler's memory of both did not survive a restart or a hand-over;
        the blobs did: a lag is counted exactly when a VM is first seen listing the event, so a remembered lag is a
        remembered observation, and wins over a miss decided before the VM listed it)."""
        decided: dict[tuple[str, str], str] = {}
        observed: list[tuple[str, str]] = []
        for side in self.hubs.values():  # the partitions shown: a held one hidden shows nothing (as its VMs)
            for partition_id, held in side.held.items():
                if side.fleet.is_shown(partition_id):
                    decided.update(held.missed)
                    observed.extend(held.lags)
        for key, entry in self.homes.counted.items():
            if self.is_home_here(key):
                decided.update(((key, name), reason) for name, reason in entry.missed.items())
                observed.extend((key, name) for name in entry.lag)
        decided.update(dict.fromkeys(observed, "observed"))
        if not decided:
            return result
        covered = {(row.event_key, name_key(row.vm_name)) for row in result.coverage}
        kept = [Coverage(record.key, record.event.event_id, record.event.event_type, resource, reason)
                for record in records if record.ended for resource in record.event.resources
                if (pair := (record.key, name_key(resource))) not in covered and (reason := decided.get(pair))]
        return replace(result, coverage=result.coverage + tuple(kept)) if kept else result

    def _counts(self, kind: str, key: str, name: str) -> bool:
        """A VM's miss or lag is counted by the replica that shows the VM, once per its partition's memory; an
        EventId (its unannounced count, or a VM no sidecar shows) by its home's replica, once per the home's."""
        if kind == "missed" and (key, name) in self._missed_anywhere:
            return False  # counted already under another reason, where another memory keeps it
        held = self._where.get(name) if kind != "unannounced" else None
        if held is not None:
            return (key, name) not in (held.missed if kind == "missed" else held.lags)
        if not self.is_home_here(key):
            return False
        entry = self.homes.counted.get(key)
        if entry is None:
            return True
        if kind == "unannounced":
            return not entry.unannounced
        return name not in (entry.missed if kind == "missed" else entry.lag)

    def report_bounds(self, picture: PlatformPicture, before: dict[str, int]) -> None:
        """The picture's bounds reached since ``before`` (its ``bound_hits`` then), reported."""
        for name, count in picture.bound_hits.items():
            if count > before.get(name, 0):
                self.report.bound_hit(name, count - before.get(name, 0))

    async def peers(self, stop: asyncio.Event, every: float) -> None:
        """``read_peers`` every ``every`` seconds (the checkpoint interval: how often they are written)."""
        while not stop.is_set():
            await self.sleep(every)
            await self.read_peers()

    async def run(self, stop: asyncio.Event, every: float) -> None:
        """Reconcile every ``every`` seconds; write the memory of homes whose partition has no position yet (no
        event handled: the persistence writes nothing for it). A round is put off while platform messages arrived within
        the last ``every`` (a burst: a reconciliation over its events holds the loop, which the burst's reading would
        wait for; ``scripts/fleet_bench.py --platform`` measures the burst against the bare SDK's), for up to
        ``BURST_DEFERS_UP_TO`` seconds. Only a burst: at least ``BURST_MESSAGES``
        applied since the last round. Azure's usual trickle (a message every second or two) is never one: put off,
        a short event could end unjudged, and a live sidecar's miss of it would never be said."""
        last = time.monotonic()
        while not stop.is_set():
            await self.sleep(every)
            at = time.monotonic()
            if self.applied_since >= BURST_MESSAGES and at - self.applied_at < every \
                    and at - last < BURST_DEFERS_UP_TO:
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
        """Partitions without a position (nothing handled yet: the persistence writes nothing for them) whose platform
        side changed: written at position -1 (behind anything; a later write at a real position replaces it)."""
        for side in self.hubs.values():
            reader = PlatformReader(self, side)
            for partition_id in sorted(side.held):
                if side.fleet.position(partition_id) is None and reader.dirty(partition_id):
                    write = reader.prepare(partition_id, -1)
                    if write is not None:
                        await write()

    # ------------------------------------------------------------------ scrapes

    def render(self) -> str:
        """The platform gauges from the last reconciliation (empty families before any platform event)."""
        view = self.view
        text = render_platform(view.records, view.coverage, view.informed)
        kept = [f'{FLEET}_platform_kept{{what="{name}"}} {float(size)!r}' for name, size in sorted(view.sizes.items())]
        return text + write_gauges({"platform_kept": kept}, _KEPT_HELP)


_KEPT_HELP = {"platform_kept": "What the platform side holds now, each bounded: events and Event Grid ids of the "
                               "pictures, reconciliation pairs and EventIds, EventIds whose counting is remembered."}
