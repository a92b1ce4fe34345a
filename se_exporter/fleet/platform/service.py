"""The platform stream in ``se-exporter fleet``: the per-partition pictures, their blobs, the reconciliation loop.

One ``Platform`` per replica; one ``PlatformReader`` per hub read (``consumer.Service.first_reader``), which sees
every message of that hub first: ``read_platform`` (a sidecar's document costs it one look at the bytes), None ->
the Service reads a sidecar's document as before. So Event Grid may deliver to the sidecars' own hub, or to its own
(``--platform-eventhub-*``), or both.

Per owned partition of either hub, a ``PlatformPicture``; stored in its own blob beside the VM state
(``saving.py``), written before it at the same position (``persistence.Keeper.beside``), so before the checkpoint;
restored on claim, before the partition is read: platform messages at or below its position are replayed ones.

Reconciliation runs on the loop every ``RECONCILE_EVERY`` seconds (not in a scrape): the records of every held
picture, merged, against the VMs this replica shows; a scrape renders the last result.

Counting once, over restarts and replicas. Each EventId has a home: a partition of the platform's hub (the sidecars'
hub when only that one is read), by a stable hash of its key (``home``). Only the replica that shows the home
partition writes the EventId's info series and counts its statuses, impact and unannounced count; a VM's miss and
lag are counted by the replica that shows the VM. What was counted is kept in the blob of the home partition (an
EventId's, ``Counted``) or of the VM's partition (a pair's, ``Held.missed`` and ``Held.lags``), so neither a restart
nor a hand-over counts it again. Every replica reads the pictures of the partitions it does not hold from their
blobs (``read_peers``), so it knows every EventId wherever its messages landed. A replica that does not show every
partition of every hub says ``no_sidecar`` only for an EventId homed here, once every partition has judged it
(``Held.judged``, in each partition's blob: per EventId, the named VMs alive there): never wrongly, at worst late.
The reverse likewise: each partition's ``judged`` lists the unannounced EventIds its VMs listed, and an EventId's
home counts it from the blobs of the partitions it does not show. What this leaves with several replicas (the README
says it): every figure a few checkpoint intervals behind one replica's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from azure.eventhub.aio import PartitionContext

from se_exporter.core.retry import backoff
from se_exporter.fleet.collector import FLEET, FleetMetrics, write_gauges
from se_exporter.fleet.message import InvalidMessage, VmState
from se_exporter.fleet.picture import Fleet
from se_exporter.fleet.platform.counting import Counted, top_up
from se_exporter.fleet.platform.coverage import (
    COVERAGE_BOUND_NAMES,
    Coverage,
    Reconciler,
    ReconcileSettings,
    Reconciliation,
    name_key,
)
from se_exporter.fleet.platform.exposition import render_platform
from se_exporter.fleet.platform.picture import (
    PICTURE_BOUND_NAMES,
    PictureState,
    PlatformLimits,
    PlatformPicture,
    PlatformRecord,
    merge,
)
from se_exporter.fleet.platform.reader import PLATFORM_BOUND_NAMES, PLATFORM_INVALID_REASONS, read_platform
from se_exporter.fleet.platform.saving import Judged, decode_platform, encode_platform, platform_blob_name
from se_exporter.fleet.report import Report
from se_exporter.fleet.statestore import StateStore
from se_exporter.infra.azure.clients import describe
from se_exporter.infra.logs import fields

log = logging.getLogger("se_exporter.fleet")
RECONCILE_EVERY = 5.0  # seconds between reconciliations at most (the checkpoint interval when shorter)
BURST_DEFERS_UP_TO = 30.0  # while platform messages keep arriving, reconciliation waits up to this long (see run)
BURST_MESSAGES = 1_000  # platform messages applied since the last round that make a burst (see run)
RESTORE_RETRY_MAX = 30.0
MAX_MEMORY = 100_000  # EventIds whose counting is remembered (ReconcileSettings.ids)
_EMPTY = PictureState((), (), ())


@functools.lru_cache(maxsize=262_144)
def _key_of(name: str) -> str:
    """``name_key``, remembered: a reconciliation looks at every shown VM's name (100,000 every few seconds)."""
    return name_key(name)


def home(key: str, partitions: int) -> str:
    """The partition id of an EventId's home: stable across processes and releases (CRC-32, not ``hash``)."""
    return str(zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions)


@dataclass
class Held:
    """One owned partition's platform side."""

    picture: PlatformPicture | None = None  # None until it holds a platform message (or a stored picture)
    restored: int | None = None  # platform messages at or below this sequence number are in the picture already
    changes: int = 0
    written: int = 0  # ``changes`` when last written
    # What was counted of the VMs of this partition (each (EventId key, VM name) once, by the replica that shows it):
    # a miss with its reason, a lag. Kept in this partition's blob, so the partition's next owner counts neither again.
    missed: dict[tuple[str, str], str] = field(default_factory=dict)
    lags: set[tuple[str, str]] = field(default_factory=set)
    # Per EventId known, the VMs it names that are alive in this partition (shown here): stored in the blob, so the
    # EventId's home replica knows which named VMs no replica shows (``no_sidecar``) without showing them all.
    judged: Judged = field(default_factory=lambda: Judged(frozenset(), {}))
    # Counter increments decided and remembered here, applied once the blob remembering them is written: a
    # partition lost before that is counted by its next owner instead, so nothing is counted twice.
    pending: list[Callable[[], object]] = field(default_factory=list)


@dataclass
class View:
    """The last reconciliation, for scrapes: swapped whole, read without a lock."""

    records: tuple[PlatformRecord, ...] = ()
    coverage: tuple[Coverage, ...] = ()
    informed: frozenset[str] = frozenset()
    sizes: dict[str, int] = field(default_factory=dict)


@dataclass
class HubSide:
    """What the platform side needs of one hub read: its role, its VMs, its partition count, its blob store."""

    role: str
    fleet: Fleet
    store: StateStore
    partitions: Callable[[], int | None]
    peer_store: StateStore | None = None  # reads the other partitions' pictures (another replica's, or nobody's)
    held: dict[str, Held] = field(default_factory=dict)
    prefix: tuple[str, str, str] | None = None  # (namespace, hub, consumer group), from the first claim
    peers: dict[str, tuple[PlatformRecord, ...]] = field(default_factory=dict)  # partitions not held: their records
    peer_tags: dict[str, str] = field(default_factory=dict)  # the ETag of each peer's blob when read
    peer_judged: dict[str, Judged] = field(default_factory=dict)  # their ``Held.judged``
    peer_missed: dict[str, frozenset[tuple[str, str]]] = field(default_factory=dict)  # the misses they counted
    # The VMs of each owned partition this replica shows (None: all of ``fleet.vms()``, partitions unknown).
    partition_vms: Callable[[], dict[str, list[VmState]]] | None = None

    def forget_peer(self, partition_id: str) -> None:
        """What was read of a partition's blob as a peer's: it is gone, or held here now."""
        self.peers.pop(partition_id, None)
        self.peer_tags.pop(partition_id, None)
        self.peer_judged.pop(partition_id, None)
        self.peer_missed.pop(partition_id, None)


class Platform:
    """The replica's platform side: the hubs' pictures, the reconciler, what was counted; one loop changes it."""

    def __init__(self, metrics: FleetMetrics, report: Report, retention: float, grace: float, vm_expiry: float,
                 max_message_bytes: int, clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 limits: PlatformLimits | None = None) -> None:
        self._metrics, self._report, self._clock, self._sleep = metrics, report, clock, sleep
        self.limits = limits or PlatformLimits(retention=retention)
        self._max_bytes = max_message_bytes
        self.reconciler = Reconciler(ReconcileSettings(vm_expiry, grace))
        self.hubs: dict[str, HubSide] = {}
        self.memory: OrderedDict[str, Counted] = OrderedDict()  # EventId key -> counted, for the homes shown here
        self._dirty_homes: set[str] = set()  # home partitions whose memory changed since written
        self.applied_at = 0.0  # monotonic time of the last platform message applied
        self.applied_since = 0  # platform messages applied since the last reconciliation round
        self._where: dict[str, Held] = {}  # VM name (name_key) -> its partition, as of the last reconciliation
        self._missed_anywhere: set[tuple[str, str]] = set()  # (key, VM) misses counted in any memory known here
        self._left_out: set[str] = set()  # EventIds the listing left out last round (bound platform_events)
        self.view = View()
        for reason in PLATFORM_INVALID_REASONS:
            metrics.invalid.labels(reason)
        for bound in (*PLATFORM_BOUND_NAMES, *PICTURE_BOUND_NAMES, *COVERAGE_BOUND_NAMES):
            metrics.bound_hits.labels(bound)
        metrics.warnings.labels("platform_event")

    def reader(self, role: str, fleet: Fleet, store: StateStore, partitions: Callable[[], int | None],
               peer_store: StateStore | None = None,
               partition_vms: Callable[[], dict[str, list[VmState]]] | None = None) -> PlatformReader:
        side = self.hubs[role] = HubSide(role, fleet, store, partitions, peer_store, partition_vms=partition_vms)
        return PlatformReader(self, side)

    async def read_peers(self) -> None:
        """Every partition's picture this replica does not hold, from its blob (another replica's, written every
        checkpoint interval; or nobody's): so each replica knows every EventId, and an EventId's home replica
        lists and counts it wherever its messages landed. One listing per hub, then a download of each blob that
        changed; a blob unreadable now is tried again next time."""
        for side in self.hubs.values():
            if side.prefix is None or side.peer_store is None:
                continue
            store, folder = side.peer_store, platform_blob_name(*side.prefix, "")
            try:
                listed = await store.listing(folder)
                for name, tag in listed.items():
                    partition_id = name.removeprefix(folder)
                    if partition_id in side.held or side.peer_tags.get(partition_id) == tag:
                        continue
                    store.name(partition_id, name)
                    data = await store.fetch(partition_id)
                    loaded = decode_platform(data, partition_id) if data is not None else None
                    if partition_id not in side.held and loaded is not None and loaded.state is not None:
                        side.peers[partition_id], side.peer_tags[partition_id] = loaded.state.records, tag
                        side.peer_judged[partition_id] = loaded.judged
                        side.peer_missed[partition_id] = frozenset(loaded.missed) | frozenset(
                            (key, name) for key, entry in loaded.memory.items() for name in entry.missed)
            except Exception as error:  # counted and logged; the records last read are kept meanwhile
                self._metrics.errors.labels("state_read").inc()
                self._report.once(f"platform-peer:{side.role}", logging.WARNING, "cannot read the other partitions' "
                                  "platform pictures (%s); trying again", describe(error))
                continue
            for partition_id in [known for known in side.peers if platform_blob_name(*side.prefix, known)
                                 not in listed or known in side.held]:
                side.forget_peer(partition_id)

    @property
    def home_role(self) -> str | None:
        """The hub whose partitions are the EventIds' homes: the platform's, else the sidecars'."""
        return "platform" if "platform" in self.hubs else next(iter(self.hubs), None)

    def home_of(self, key: str) -> str | None:
        side = self.hubs.get(self.home_role or "")
        count = side.partitions() if side is not None else None
        return home(key, count) if count else None

    def is_home_here(self, key: str) -> bool:
        side = self.hubs.get(self.home_role or "")
        partition_id = self.home_of(key)
        return side is not None and partition_id is not None and side.fleet.is_shown(partition_id) \
            and partition_id in side.held

    def whole(self) -> bool:
        """This replica shows every partition of every hub: a VM it does not show is nowhere."""
        for side in self.hubs.values():
            count = side.partitions()
            if count is None or len(side.fleet.shown()) < count:
                return False
        return True

    # ------------------------------------------------------------------ reconciliation

    def reconcile(self) -> View:
        """Expire, merge, reconcile, count what is new; the view scrapes render."""
        now = self._clock()
        pictures = [held.picture for side in self.hubs.values() for held in side.held.values()
                    if held.picture is not None]
        gone: set[str] = set()
        for picture in pictures:
            before = dict(picture.bound_hits)
            gone.update(record.key for record in picture.expire(now))
            self._bounds(picture, before)
        retention = self.limits.retention
        peers = [tuple(record for record in records if record.ended_at is None or record.ended_at + retention > now)
                 for side in self.hubs.values() for partition_id, records in side.peers.items()
                 if partition_id not in side.held]
        records = merge([*(picture.records() for picture in pictures), *peers])
        if len(records) > self.limits.events:  # several partitions' pictures: the series stay within one's bound
            records.sort(key=lambda record: (record.ended_at is None, record.ended_at or record.changed_at))
            left_out = {record.key for record in records[:-self.limits.events]}
            if left_out - self._left_out:  # each EventId left out counted once, not again at every round
                self._report.bound_hit("platform_events", len(left_out - self._left_out))
            self._left_out = left_out
            records = records[-self.limits.events:]
        else:
            self._left_out = set()
        if not records and not self.memory and not self.view.records:
            return self.view  # a fleet that has not opted in costs nothing here
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
        result = self._decided(records, result)
        informed = frozenset(record.key for record in records if self.is_home_here(record.key))
        for record in records:
            if record.key in informed:
                self._count_record(record)
        held_keys = {record.key for record in records}
        self._forget(gone - held_keys)
        self._forget_counted(held_keys, now)
        sizes = {**self.reconciler.sizes(), "counted": len(self.memory)}
        for picture in pictures:
            for name, size in picture.sizes().items():
                sizes[name] = sizes.get(name, 0) + size
        self.view = View(tuple(records), result.coverage, informed, sizes)
        return self.view

    def _all_missed(self) -> set[tuple[str, str]]:
        """Every (EventId key, VM) miss counted that this replica knows of: in its partitions' memories, its homes',
        and the other partitions' blobs. A pair is counted once whatever its reason: a VM first without a sidecar
        (counted by the home) whose sidecar then appears elsewhere is not counted again as missed there (unless
        within the couple of checkpoint intervals before that replica reads the home's blob)."""
        known: set[tuple[str, str]] = {(key, name) for key, entry in self.memory.items() for name in entry.missed}
        for side in self.hubs.values():
            for held in side.held.values():
                known.update(held.missed)
            for missed in side.peer_missed.values():
                known.update(missed)
        return known

    def _judge(self, records: list[PlatformRecord], shown: dict[int, tuple[Held, set[str]]],
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
            self._report.bound_hit("platform_coverage_ids", over)
        for held, alive in shown.values():
            judged = Judged(keys, {key: names & alive for key, names in named if alive and not names.isdisjoint(
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
                    self._remember(key).unannounced = True
                    self._mark(key)
                    self._home_pending(key, self._metrics.unannounced_events.labels(event_type).inc)

    def _nowhere(self, records: list[PlatformRecord], result: Reconciliation) -> Reconciliation:
        """With several replicas: ``no_sidecar`` for a named VM of an EventId homed here when every partition of every
        hub either is shown here or has judged that EventId in its blob, and none has it alive; counted once, by the
        home. A partition that has not judged it yet (its owner has not learnt of it, or not written since) leaves
        the VM without coverage: never a wrong ``no_sidecar``."""
        judgments: list[Judged] = []
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
                    self._remember(record.key).missed[name] = "no_sidecar"
                    self._mark(record.key)
                    self._home_pending(record.key, self._metrics.missed_events.labels(
                        record.event.event_type, "no_sidecar").inc)
        return replace(result, coverage=result.coverage + tuple(rows)) if rows else result

    def _shown_vms(self, now: float, named: frozenset[str]) -> tuple[list[VmState], dict[int, tuple[Held, set[str]]]]:
        """The VMs this replica shows that matter to the reconciliation (named by an event, or listing one: the
        rest of a fleet of 100,000 would only cost it time), noting each one's partition (``_where``: whose memory
        counts its pairs), and per shown partition the names of its named VMs alive (heard from within the VM
        expiry)."""
        vms: list[VmState] = []
        alive: dict[int, tuple[Held, set[str]]] = {}  # by id() of the Held: partition ids repeat across hubs
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

    def _forget_counted(self, listed: set[str], now: float) -> None:
        """What was counted of an EventId no picture holds is kept as long as a forgotten EventId is (the open
        expiry, within ``MAX_MEMORY``): a copy read later on another partition then adds only what is new."""
        expiry = self.limits.open_expiry
        for key, entry in list(self.memory.items()):
            if key in listed:
                continue
            if entry.gone_at is None:
                entry.gone_at = now
                self._mark(key)
            elif entry.gone_at + expiry <= now:
                del self.memory[key]
                self._mark(key)

    def _forget(self, keys: set[str]) -> None:
        """Each partition's memory of its VMs' pairs of EventIds forgotten goes with them, and is bounded besides
        (past the bound, some dropped and the bound hit counted), as the reconciler's pairs are."""
        bound = self.reconciler.settings.pairs
        for side in self.hubs.values():
            for held in side.held.values():
                stale = [pair for pair in (*held.missed, *held.lags) if pair[0] in keys]
                over_missed, over_lags = max(0, len(held.missed) - bound), max(0, len(held.lags) - bound)
                if over_missed or over_lags:
                    self._report.bound_hit("platform_coverage_pairs", over_missed + over_lags)
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
                apply = self._metrics.missed_events.labels(event_type, reason).inc
            elif kind == "unannounced":
                apply = self._metrics.unannounced_events.labels(next(unannounced)).inc
            else:
                apply = functools.partial(self._metrics.announcement_lag.observe, next(lags))
            held = self._where.get(name) if kind != "unannounced" else None
            if held is not None:  # the VM's partition keeps it
                if kind == "missed":
                    held.missed[(key, name)] = reasons.get((key, name), "missed")
                else:
                    held.lags.add((key, name))
                held.changes += 1
                held.pending.append(apply)
                continue
            entry = self._remember(key)  # its home keeps it: an EventId, or a VM no sidecar shows
            if kind == "unannounced":
                entry.unannounced = True
            elif kind == "missed":
                entry.missed[name] = reasons.get((key, name), "missed")
            else:
                entry.lag.add(name)
            self._mark(key)
            self._home_pending(key, apply)
        for bound in result.bounds:
            self._report.bound_hit(bound)

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
        for key, entry in self.memory.items():
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
        entry = self.memory.get(key)
        if entry is None:
            return True
        if kind == "unannounced":
            return not entry.unannounced
        return name not in (entry.missed if kind == "missed" else entry.lag)

    def _count_record(self, record: PlatformRecord) -> None:
        """Tops the EventId's counters up to what its merged record says (``counting.COUNTING``)."""
        entry = self._remember(record.key)
        for increment in top_up(entry, record):
            self._mark(record.key)
            counter = {"platform_events": self._metrics.platform_events, "impact_seconds": self._metrics.impact_seconds,
                       "platform_duplicates": self._metrics.platform_duplicates}[increment.counter]
            child = counter.labels(*increment.labels) if increment.labels else counter
            self._home_pending(record.key, functools.partial(child.inc, increment.amount))

    def _home_pending(self, key: str, apply: Callable[[], object]) -> None:
        """An EventId's count, applied once its home partition's blob remembers it (see ``Held.pending``)."""
        side = self.hubs.get(self.home_role or "")
        partition_id = self.home_of(key)
        held = side.held.get(partition_id) if side is not None and partition_id is not None else None
        if held is None:
            apply()  # not homed here after all: nowhere to remember it (``_counts`` keeps this from happening)
        else:
            held.pending.append(apply)

    def _remember(self, key: str) -> Counted:
        entry = self.memory.get(key)
        if entry is None:
            if len(self.memory) >= MAX_MEMORY:
                self._report.bound_hit("platform_coverage_ids")
                dropped, _ = self.memory.popitem(last=False)
                self._mark(dropped)
            entry = self.memory[key] = Counted()
            self._mark(key)
        return entry

    def _mark(self, key: str) -> None:
        partition_id = self.home_of(key)
        if partition_id is not None:
            self._dirty_homes.add(partition_id)

    def _bounds(self, picture: PlatformPicture, before: dict[str, int]) -> None:
        for name, count in picture.bound_hits.items():
            if count > before.get(name, 0):
                self._report.bound_hit(name, count - before.get(name, 0))

    async def peers(self, stop: asyncio.Event, every: float) -> None:
        """``read_peers`` every ``every`` seconds (the checkpoint interval: how often they are written)."""
        while not stop.is_set():
            await self._sleep(every)
            await self.read_peers()

    async def run(self, stop: asyncio.Event, every: float) -> None:
        """Reconcile every ``every`` seconds; write the memory of homes whose partition has no position yet (no
        event handled: the Keeper writes nothing for it). A round is put off while platform messages arrived within
        the last ``every`` (a burst: a reconciliation over its events holds the loop, which the burst's reading would
        wait for; ``scripts/fleet_bench.py --platform`` measures the burst against the bare SDK's), for up to
        ``BURST_DEFERS_UP_TO`` seconds. Only a burst: at least ``BURST_MESSAGES``
        applied since the last round. Azure's usual trickle (a message every second or two) is never one: put off,
        a short event could end unjudged, and a live sidecar's miss of it would never be said."""
        last = time.monotonic()
        while not stop.is_set():
            await self._sleep(every)
            at = time.monotonic()
            if self.applied_since >= BURST_MESSAGES and at - self.applied_at < every \
                    and at - last < BURST_DEFERS_UP_TO:
                continue
            last, self.applied_since = at, 0
            try:
                self.reconcile()
                await self._write_quiet_homes()
            except Exception as error:  # never out of the loop: counted and logged; the next round tries again
                self._metrics.errors.labels("other").inc()
                self._report.once("platform:reconcile", logging.ERROR, "platform reconciliation failed: %s",
                                  describe(error))

    async def _write_quiet_homes(self) -> None:
        """Partitions without a position (nothing handled yet: the Keeper writes nothing for them) whose platform
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


class PlatformReader:
    """One hub's platform side, as ``consumer.Service.first_reader`` and ``persistence.Keeper.beside``."""

    def __init__(self, platform: Platform, side: HubSide) -> None:
        self._platform = platform
        self._side = side

    # ------------------------------------------------------------------ consumer.FirstReader

    async def claim(self, context: PartitionContext) -> None:
        """Restore the partition's picture (and, for a home, what was counted) before it is read; retried while
        the storage refuses, as the VM state is."""
        partition_id, side, platform = context.partition_id, self._side, self._platform
        side.prefix = (context.fully_qualified_namespace, context.eventhub_name, context.consumer_group)
        side.store.name(partition_id, platform_blob_name(*side.prefix, partition_id))
        side.forget_peer(partition_id)
        failures = 0
        while True:
            try:
                data = await side.store.fetch(partition_id)
                break
            except Exception as error:
                platform._metrics.errors.labels("state_read").inc()
                platform._report.once(f"platform-restore:{side.role}:{partition_id}", logging.WARNING,
                                      "partition %s: cannot read its platform picture (%s); retrying before reading "
                                      "it", partition_id, describe(error))
                failures += 1
                await platform._sleep(backoff(failures, 1.0, RESTORE_RETRY_MAX))
        held = side.held[partition_id] = Held()
        if data is None:
            return
        loaded = decode_platform(data, partition_id)
        if loaded.damaged is not None:
            platform._metrics.state_damaged.labels(loaded.damaged).inc()
            platform._report.once(f"platform-damaged:{partition_id}", logging.ERROR,
                                  "partition %s: the stored platform picture is damaged (%s); starting it from the "
                                  "partition's checkpoint alone", partition_id, loaded.problem,
                                  extra=fields(partition_id=partition_id, reason=loaded.damaged))
            return
        if loaded.rows:
            platform._metrics.state_damaged.labels("row").inc(loaded.rows)
        held.restored = loaded.position
        held.missed, held.lags, held.judged = loaded.missed, loaded.lags, loaded.judged
        if loaded.state is not None and (loaded.state.records or loaded.state.ids or loaded.state.forgotten):
            held.picture = PlatformPicture.restored(loaded.state, platform.limits)
        if side.role == platform.home_role:
            for key, entry in loaded.memory.items():
                platform.memory.setdefault(key, entry)
        log.info("partition %s: platform picture restored: %d events", partition_id,
                 len(loaded.state.records) if loaded.state else 0, extra=fields(partition_id=partition_id))

    def handle(self, partition_id: str, sequence_number: int, body: bytes, enqueued: float) -> str | None:
        platform = self._platform
        read = read_platform(body, platform._max_bytes, enqueued)  # InvalidMessage: counted by the Service
        if read is None:
            return None
        if self._side.role == "sidecar" and "platform" in platform.hubs:
            # Every VM may send to the sidecars' hub: Azure's copy is believed only from the hub Event Grid
            # delivers to, or a compromised VM could end a real event early or announce one naming every VM.
            raise InvalidMessage("platform_on_sidecars_hub", "an Event Grid event on the sidecars' hub, while "
                                 "--platform-eventhub-* names the platform's own: not applied")
        held = self._side.held.get(partition_id) or self._side.held.setdefault(partition_id, Held())
        if held.restored is not None and sequence_number <= held.restored:
            return "replayed"
        metrics, report = platform._metrics, platform._report
        for reason, line in read.skipped:
            metrics.invalid.labels(reason).inc()
            report.once(f"invalid:{reason}", logging.WARNING, "platform message partly skipped (partition %s, "
                        "sequence number %d): %s", partition_id, sequence_number, line,
                        extra=fields(reason=reason, partition_id=partition_id))
        for bound in read.bounds:
            report.bound_hit(bound)
        if read.warnings:
            metrics.warnings.labels("platform_event").inc(len(read.warnings))
        if held.picture is None:
            held.picture = PlatformPicture(platform.limits)
        picture, now = held.picture, platform._clock()
        before = picture.bound_hits.copy()
        for event in read.events:
            picture.apply(event, now)  # a duplicate is counted by its EventId's home, from the merged record
        if picture.bound_hits != before:  # rarely: one comparison in C per message, not a loop over the bounds
            platform._bounds(picture, before)
        held.changes += 1
        platform.applied_at = time.monotonic()
        platform.applied_since += 1
        return "platform"

    def release(self, partition_id: str) -> None:
        side, platform = self._side, self._platform
        side.held.pop(partition_id, None)
        side.store.forget(partition_id)
        if side.role == platform.home_role:  # its EventIds' counting is the next owner's, from the blob
            for key in [key for key in platform.memory if platform.home_of(key) == partition_id]:
                del platform.memory[key]
            platform._dirty_homes.discard(partition_id)

    # ------------------------------------------------------------------ persistence.Beside

    def dirty(self, partition_id: str) -> bool:
        held = self._side.held.get(partition_id)
        return (held is not None and held.changes != held.written) or (
            self._side.role == self._platform.home_role and partition_id in self._platform._dirty_homes)

    def prepare(self, partition_id: str, position: int) -> Callable[[], Awaitable[bool]] | None:
        side, platform = self._side, self._platform
        held = side.held.get(partition_id)
        if held is None or not self.dirty(partition_id):
            return None
        memory = {key: entry for key, entry in platform.memory.items() if platform.home_of(key) == partition_id} \
            if side.role == platform.home_role else {}
        state = held.picture.state() if held.picture is not None else _EMPTY
        data = encode_platform(partition_id, position, state, memory, held.missed, held.lags, held.judged)
        changes, pending = held.changes, held.pending
        held.pending = []
        platform._dirty_homes.discard(partition_id)

        async def write() -> bool:
            written = False
            try:
                written = await side.store.save(partition_id, data, position)
            finally:
                if written:
                    held.written = changes
                    for apply in pending:  # remembered in the blob now: counted here, and never by a next owner
                        apply()
                else:  # written by a later round (or dropped with the partition, for its next owner to count)
                    held.pending[:0] = pending
                    if side.role == platform.home_role and memory:
                        platform._dirty_homes.add(partition_id)
            return written

        return write
