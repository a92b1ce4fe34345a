"""The fleet's core: the latest document of every VM, per partition, and the bounds on what it keeps.

No I/O and no clock reads: the consumer hands in what the SDK received and the time. Every partition's state is a
fold over that partition's events in order, so it can be written beside the checkpoint and continued by whichever
replica owns the partition next (``stateformat.py``). Which document of a VM wins and when an entry known by name is
retired: docs/architecture.md, "What it keeps" and "Who can change a VM's picture".
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import TypeVar

from se_exporter.fleet.message import DEFAULT_BOUNDS, Bounds, Message, VmState, vm_facts

# A sidecar resends at most one batch (100 documents) after a timeout; ten batches of slack.
SEQUENCE_WINDOW = 1000
IMDS_STALE_AFTER = 120.0  # seconds between a VM's observed_at and its last IMDS read that make it unreachable


def imds_unreachable(vm: VmState) -> bool:
    """The VM's sidecar is alive (it sent this) but cannot read IMDS: its latest poll failed, or its last good read
    is IMDS_STALE_AFTER older than the document's observation (an older sidecar saying neither: unknown)."""
    imds = vm.imds
    return imds.failing is True or (imds.last_success is not None and imds.observed_at is not None
                                    and imds.observed_at - imds.last_success > IMDS_STALE_AFTER)


@dataclass
class Changes:
    """What changed in a partition since its state was last written, so a write (a delta) carries only that.

    Every change takes the next ``tick``; a stored write ``settle``s up to its snapshot's tick only, so a change made
    while the write was in flight, or a write that failed, loses nothing. ``changed`` maps a key to the ticks of its
    last change and of its last change beyond a heartbeat: a VM is written whole when the latter is past
    ``settled``, else touched. Past ``max_gone`` forgotten keys (many VMs come and go while writes fail) ``gone`` is
    dropped and ``rebase_at`` asks for a whole state instead."""

    tick: int = 0
    settled: int = 0  # every change up to this tick is in the stored state
    changed: dict[str, tuple[int, int]] = field(default_factory=dict)
    gone: dict[str, int] = field(default_factory=dict)
    rebase_at: int | None = None  # a whole state is due: the tick that asked for it
    beyond_heartbeat: int = 0  # the tick of the latest change beyond a heartbeat (a VM new or changed, or gone)

    def record(self, key: str, whole: bool) -> None:
        self.tick += 1
        _last, last_whole = self.changed.get(key, (0, 0))
        self.changed[key] = (self.tick, self.tick if whole else last_whole)
        self.gone.pop(key, None)
        if whole:
            self.beyond_heartbeat = self.tick

    def heartbeats_only(self) -> bool:
        """Whether all not yet stored is what heartbeats move (a write may wait: ``PartitionPersistence.due``)."""
        return self.beyond_heartbeat <= self.settled and self.rebase_at is None

    def forgotten(self, key: str, max_gone: int) -> None:
        self.tick += 1
        self.beyond_heartbeat = self.tick
        self.changed.pop(key, None)
        self.gone[key] = self.tick
        if len(self.gone) > max_gone:
            self.gone.clear()
            self.rebase_at = self.tick

    def settle(self, tick: int) -> None:
        """A state holding every change up to ``tick`` is stored: forget those changes, keep later ones."""
        self.settled = max(self.settled, tick)
        self.changed = {key: marks for key, marks in self.changed.items() if marks[0] > tick}
        self.gone = {key: mark for key, mark in self.gone.items() if mark > tick}
        if self.rebase_at is not None and self.rebase_at <= tick:
            self.rebase_at = None


@dataclass(frozen=True)
class StateWrite:
    """One partition at one instant, for a state write: everything, and what changed since the last write."""

    position: int
    tick: int
    vms: list[VmState]
    changed: list[VmState]  # new, or changed beyond a heartbeat
    touched: list[VmState]  # only a heartbeat's fields changed
    gone: list[str]
    rebase: bool  # the changes are incomplete: only a whole state is right


@dataclass
class PartitionState:
    """The VMs of one partition and the sequence number of the last event folded into them."""

    vms: dict[str, VmState] = field(default_factory=dict)
    position: int | None = None  # Event Hubs sequence number of the last event handled
    restored_position: int | None = None  # events at or below it are already in ``vms`` (from the state blob)
    installations: Tally[str] = field(default_factory=Tally)  # VMs per installation id, for its bound
    changes: Changes = field(default_factory=Changes)  # what the next state write must carry

    def __post_init__(self) -> None:
        if self.vms and not self.installations:
            self.installations.update(vm.installation for vm in self.vms.values())

    def advance(self, sequence_number: int) -> None:
        if self.position is None or sequence_number > self.position:
            self.position = sequence_number

    def uncount(self, installation: str) -> None:
        self.installations[installation] -= 1
        if self.installations[installation] <= 0:
            del self.installations[installation]


def latest(groups: Iterable[Iterable[VmState]]) -> list[VmState]:
    """Each VM once, the one seen last: a VM held by two shown partitions (a hand-over, a hub grown) would otherwise
    be exposed twice with the same labels, invalidating the whole exposition."""
    shown: dict[str, VmState] = {}
    for vm in chain.from_iterable(groups):
        if (other := shown.get(vm.key)) is None or vm.seen_at > other.seen_at:
            shown[vm.key] = vm
    return list(shown.values())


T = TypeVar("T")
# A change of one VM of a held partition, told to a watcher (``Fleet.watch``): the partition, the key, and whether it
# changed beyond what a heartbeat moves (a new VM, a forgotten one, or any change of what its series say).
Watcher = Callable[[str, str, bool], None]


class Fleet:
    """Every owned partition's state. The consumer's loop changes it; scrapes read it from other threads."""

    def __init__(self, bounds: Bounds = DEFAULT_BOUNDS) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[str, PartitionState] = {}
        self._hidden: set[str] = set()  # held partitions whose VMs no scrape shows (see ``show``)
        self._watchers: list[Watcher] = []
        self._named: dict[str, set[str]] = {}  # key -> partitions holding it as a VM known by name only (no vm_id)
        self.bounds = bounds

    def claim(self, partition_id: str, state: PartitionState | None = None, *, shown: bool = True) -> PartitionState:
        """Own a partition from ``state`` (a restored one) or from nothing; the state now held for it. With
        ``shown=False`` it is held (kept, written, folded into) but not shown until ``show``."""
        with self._lock:
            self._unname_partition(partition_id)
            held = self._partitions[partition_id] = state or PartitionState()
            self._hidden.discard(partition_id)
            if not shown:
                self._hidden.add(partition_id)
            for key, vm in list(held.vms.items()):  # a restored state meets what the other partitions hold
                if not vm.vm_id and self._known_by_id(vm):
                    self._forget(partition_id, held, key)
                else:
                    self._track_name(partition_id, vm)
        return held

    def release(self, partition_id: str) -> int:
        """Forget a partition (its VMs leave /metrics with it); how many VMs it held."""
        with self._lock:
            self._unname_partition(partition_id)
            state = self._partitions.pop(partition_id, None)
            self._hidden.discard(partition_id)
        return len(state.vms) if state else 0

    def show(self, partition_id: str, shown: bool = True) -> bool:
        """Show a held partition's VMs in ``vms`` (or hide them, keeping them), only while no other replica can
        (``consumer.Service``); whether anything changed."""
        with self._lock:
            if partition_id not in self._partitions or (partition_id not in self._hidden) == shown:
                return False
            self._hidden ^= {partition_id}  # not as asked (checked above): toggled
            return True

    def is_shown(self, partition_id: str) -> bool:
        """Whether ``vms`` shows the partition's VMs: two atomic lookups, no lock (the consumer asks every batch)."""
        return partition_id in self._partitions and partition_id not in self._hidden

    def shown(self) -> list[str]:
        """The held partitions whose VMs ``vms`` shows."""
        with self._lock:
            return sorted(set(self._partitions) - self._hidden)

    def owned(self) -> list[str]:
        with self._lock:
            return sorted(self._partitions)

    def already_applied(self, partition_id: str, sequence_number: int) -> bool:
        """An event replayed from the checkpoint that the restored state already holds."""
        state = self._partitions.get(partition_id)
        restored = state.restored_position if state else None
        return restored is not None and sequence_number <= restored

    def check_restored(self, partition_id: str, newest: int) -> int | None:
        """Forget a restored position past ``newest`` (the partition's last enqueued event): damage, which would
        count every new event as replayed. Returns the position forgotten, or None."""
        with self._lock:
            state = self._partitions.get(partition_id)
            if state is None or state.restored_position is None or state.restored_position <= newest:
                return None
            bogus, state.restored_position = state.restored_position, None
            if state.position is not None and state.position > newest:
                state.position = None
            return bogus

    def handled(self, partition_id: str, sequence_number: int) -> None:
        """Record that an event was dealt with (applied, dropped or invalid): the next checkpoint may pass it."""
        with self._lock:
            if (state := self._partitions.get(partition_id)) is not None:
                state.advance(sequence_number)

    def apply(self, partition_id: str, message: Message, sequence_number: int | None = None) -> str:
        """Fold one document in: 'applied', 'resend' or 'older' (docs/architecture.md, "What it keeps"); 'retired' or
        'older' for a message retiring a name (``_retire_name``); 'unowned' if the partition was released meanwhile;
        the name of the bound that refused a new VM ('vms_per_partition', 'vms_per_installation'). With
        ``sequence_number``, also what ``handled`` records."""
        new = message.vm
        with self._lock:
            state = self._partitions.get(partition_id)
            if state is None:
                return "unowned"
            if sequence_number is not None:
                state.advance(sequence_number)
            if message.retires_name:
                return self._retire_name(partition_id, state, new)
            current = state.vms.get(new.key)
            if current is None:
                if (refused := self._refused(state, new)) is not None:
                    return refused
                state.installations[new.installation] += 1
            elif current.installation != new.installation:
                state.uncount(current.installation)
                state.installations[new.installation] += 1
            elif 0 <= current.sequence - new.sequence <= SEQUENCE_WINDOW:
                return "resend" if new.sequence == current.sequence else "older"
            state.vms[new.key] = new
            whole = current is None or vm_facts(current) != vm_facts(new)  # beyond what a heartbeat moves
            state.changes.record(new.key, whole)
            self._tell(partition_id, new.key, whole)
            self._track_name(partition_id, new)
            return "applied"

    def _track_name(self, partition_id: str, vm: VmState) -> None:
        """A VM now held: noted if known by name only, else it retires those known by its name (under the lock)."""
        if not vm.vm_id:
            self._named.setdefault(vm.key, set()).add(partition_id)
        elif vm.vm_name in self._named:  # a dict lookup: most fleets hold no VM known by name only
            self._retire(vm)

    def _refused(self, state: PartitionState, new: VmState) -> str | None:
        """Why a VM new to the partition is not applied (a bound, or its vm_id known already), or None."""
        if len(state.vms) >= self.bounds.vms_per_partition:
            return "vms_per_partition"
        if state.installations.get(new.installation, 0) >= self.bounds.vms_per_installation:
            return "vms_per_installation"
        if not new.vm_id and self._known_by_id(new):  # by name, once its vm_id is known: the VM is that one
            return "older"
        return None

    def _retire_name(self, partition_id: str, state: PartitionState, retiring: VmState) -> str:
        """Forget the entry known by name only that ``retiring`` (a message with ``retires_name``, its key the name)
        says is its installation's VM, sent before it: 'retired'; else nothing changes ('older': already retired
        here, or never held). Never creates or changes a VM (under the lock)."""
        named = state.vms.get(retiring.key)
        if named is None or named.vm_id or named.vm_name != retiring.vm_name \
                or named.installation != retiring.installation or named.sequence >= retiring.sequence:
            return "older"
        self._forget(partition_id, state, retiring.key)
        return "retired"

    def _known_by_id(self, named: VmState) -> bool:
        """Whether a VM of ``named``'s installation and name, with a vm_id and seen no earlier, is held (under the
        lock). Asked only of a VM known by name new here (rare); partitions without the installation skipped."""
        return any(vm.vm_id and vm.installation == named.installation and vm.vm_name == named.vm_name
                   and vm.seen_at >= named.seen_at
                   for state in self._partitions.values() if state.installations.get(named.installation)
                   for vm in state.vms.values())

    def _retire(self, identified: VmState) -> None:
        """Forget the entries known by name only that ``identified`` (a document with a vm_id) is: the same name
        and installation, seen no later (under the lock)."""
        for partition_id in list(self._named.get(identified.vm_name, ())):
            state = self._partitions.get(partition_id)
            if state is not None and (named := state.vms.get(identified.vm_name)) is not None and not named.vm_id \
                    and named.installation == identified.installation and named.seen_at <= identified.seen_at:
                self._forget(partition_id, state, identified.vm_name)

    def _forget(self, partition_id: str, state: PartitionState, key: str) -> VmState:
        """Forget one VM of a held partition, for the state writes and the watchers too (under the lock)."""
        vm = state.vms.pop(key)
        state.uncount(vm.installation)
        state.changes.forgotten(key, self.bounds.vms_per_partition)
        self._tell(partition_id, key, True)
        if not vm.vm_id:
            self._unname(partition_id, key)
        return vm

    def _unname(self, partition_id: str, key: str) -> None:
        if (partitions := self._named.get(key)) is not None:
            partitions.discard(partition_id)
            if not partitions:
                del self._named[key]

    def _unname_partition(self, partition_id: str) -> None:
        if (state := self._partitions.get(partition_id)) is not None and self._named:
            for key in [key for key, vm in state.vms.items() if not vm.vm_id]:
                self._unname(partition_id, key)

    def expire(self, cutoffs: Mapping[str, float]) -> list[VmState]:
        """Forget the VMs of each partition last seen before its cutoff; return them."""
        gone: list[VmState] = []
        with self._lock:
            for partition_id, oldest in cutoffs.items():
                if (state := self._partitions.get(partition_id)) is not None:
                    stale = [key for key, vm in state.vms.items() if vm.seen_at < oldest]
                    gone.extend(self._forget(partition_id, state, key) for key in stale)
        return gone

    def silent(self, partition_id: str, since: float) -> bool:
        """Whether the partition holds a VM last seen before ``since`` (one the clock would expire)."""
        with self._lock:
            state = self._partitions.get(partition_id)
            return state is not None and any(vm.seen_at < since for vm in state.vms.values())

    def vms(self) -> list[VmState]:
        """A consistent list for one scrape, each VM once (``latest``)."""
        return self.read_shown(lambda states: latest(state.vms.values() for state in states.values()))

    def watch(self, watcher: Watcher) -> None:
        """Tell ``watcher`` of every change of a VM from now on, under ``read_shown``'s lock (for
        ``scrape.FleetExposition``, which rewrites only what changed)."""
        with self._lock:
            self._watchers.append(watcher)

    def read_shown(self, reader: Callable[[dict[str, PartitionState]], T]) -> T:
        """``reader`` of the shown partitions' states, in ``vms``'s order, under the lock: no change lands (and no
        watcher is told of one) while it reads."""
        with self._lock:
            return reader({partition_id: state for partition_id, state in self._partitions.items()
                           if partition_id not in self._hidden})

    def _tell(self, partition_id: str, key: str, beyond_heartbeat: bool) -> None:
        for watcher in self._watchers:  # under the lock
            watcher(partition_id, key, beyond_heartbeat)

    def position(self, partition_id: str) -> int | None:
        with self._lock:
            state = self._partitions.get(partition_id)
            return state.position if state else None

    def snapshot(self, partition_id: str) -> StateWrite | None:
        """The partition as a state write needs it (see ``Changes``), or None before any event."""
        with self._lock:
            state = self._partitions.get(partition_id)
            if state is None or state.position is None:
                return None
            changes, vms = state.changes, state.vms
            changed: list[VmState] = []
            touched: list[VmState] = []
            settled = changes.settled
            for key, (_last, last_whole) in changes.changed.items():  # one pass: a partition's minute of heartbeats
                if (vm := vms.get(key)) is not None:
                    (changed if last_whole > settled else touched).append(vm)  # whole: changed beyond a heartbeat since
            return StateWrite(state.position, changes.tick, list(vms.values()), changed, touched, list(changes.gone),
                            changes.rebase_at is not None)

    def heartbeats_only(self, partition_id: str) -> bool:
        """Whether all the partition's changes not yet stored are heartbeats' (see ``Changes.heartbeats_only``)."""
        with self._lock:
            state = self._partitions.get(partition_id)
            return state is not None and state.changes.heartbeats_only()

    def settle(self, partition_id: str, tick: int) -> None:
        """A state holding the partition's changes up to ``tick`` is stored (see ``Changes``)."""
        with self._lock:
            if (state := self._partitions.get(partition_id)) is not None:
                state.changes.settle(tick)
