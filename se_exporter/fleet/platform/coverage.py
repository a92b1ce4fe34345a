"""Reconciliation: for every EventId the platform announced and every VM it concerns, did that VM's sidecar see it?

No I/O and no clock reads. ``Reconciler.update`` returns the coverage of each (EventId, VM) pair (``COVERAGES``; what
each means: docs/fleet.md, "What the fleet tells you") and the unannounced EventIds listed: what a partition's owner
judges (``counting.COVERAGE``), not counted here. It remembers, bounded, what must outlive one look: when a VM first
listed an EventId (a finished event vanishes from IMDS, and from the VM's next document), and which scopes have
published a platform event.

The join is on (subscription, resource group, VM name), the name without case (the 2017 preview's leading underscore
ignored, as ``core.model.affects_vm`` does); a part one side does not know (an older sidecar says neither
subscription nor resource group) is not compared, and the scale set's name and the location narrow it where both
sides know them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from se_exporter.core.model import event_key
from se_exporter.fleet.message import VmState
from se_exporter.fleet.platform.records import PlatformRecord

COVERAGES = ("observed", "missed", "imds_unreachable", "no_sidecar")
MISSED_REASONS = ("missed", "imds_unreachable", "no_sidecar")
COVERAGE_BOUND_NAMES = ("platform_coverage_pairs", "platform_coverage_ids", "platform_scopes")
_K = TypeVar("_K", bound=Hashable)


@dataclass(frozen=True)
class ReconcileSettings:
    vm_expiry: float  # --vm-expiry: a sidecar heard from within it is alive
    grace: float = 60.0  # --reconcile-grace
    pairs: int = 200_000  # (EventId, VM) pairs remembered: 10,000 events of 20 VMs
    ids: int = 100_000  # EventIds remembered as announced
    scopes: int = 100_000  # scopes that have published a platform event


@dataclass(frozen=True, slots=True)
class Coverage:
    """One affected VM of one EventId, and whether its sidecar saw the event (COVERAGES)."""

    event_key: str
    event_id: str
    event_type: str
    vm_name: str
    coverage: str
    lag: float | None = None  # observed: when the VM first listed it minus when the platform announced it


@dataclass(frozen=True)
class Reconciliation:
    """One update's result: every pair's coverage now, and the bounds reached."""

    coverage: tuple[Coverage, ...]
    bounds: tuple[str, ...] = ()
    # Every EventId a live sidecar in a publishing scope listed for the grace and the platform never announced, as
    # (EventId key, event type, VM name key) of the first VM found listing it: unannounced (``counting.COVERAGE``).
    listed: tuple[tuple[str, str, str], ...] = ()


_Place = tuple[str, str, str, str]


@dataclass(slots=True)
class _Pair:
    first_listed: float | None = None  # when a VM of this name at ``place`` first listed it
    place: _Place | None = None  # where the VM that listed it is: it must match the event's
    # The first listing at each other place (a VM of the same name elsewhere, or a sidecar claiming the name): kept
    # apart, so none of them hides the listing of the VM the event concerns. Counted against the pairs' bound.
    elsewhere: tuple[tuple[_Place, float], ...] = ()

    def listed_at(self, matches: Callable[[_Place], bool]) -> float | None:
        """When a VM at a place ``matches`` accepts first listed it (None: none did)."""
        first = ((self.place, self.first_listed),) if self.place is not None and self.first_listed is not None else ()
        return min((when for place, when in first + self.elsewhere if matches(place)), default=None)


def name_key(name: str) -> str:
    """A VM name as the join compares it (and as a partition's judgement names VMs)."""
    return name.lstrip("_").casefold()


def _place(vm: VmState) -> _Place:
    """(subscription, resource group, location, scale set) of a VM, without case; '' where not known."""
    return vm.subscription_id.casefold(), vm.resource_group.casefold(), vm.location.casefold(), vm.vmss_name.casefold()


def _same_place(record: PlatformRecord, place: _Place) -> bool:
    """Where both sides know a part of the place, it is the same."""
    event = record.event
    theirs = (event.subscription_id, event.resource_group, event.location,
              event.scope_name if event.scope_type == "scale_set" else "")
    return all(not mine or not other or mine == other.casefold() for mine, other in zip(place, theirs, strict=True))


def imds_blind_since(vm: VmState, since: float) -> bool:
    """The sidecar said, at or after ``since``, that it had not read IMDS since before it (or is failing)."""
    imds = vm.imds
    if imds.observed_at is None or imds.observed_at < since:
        return bool(imds.failing) and vm.seen_at >= since
    return bool(imds.failing) or (imds.last_success is not None and imds.last_success < since)


@dataclass
class Reconciler:
    """The reconciliation's memory (see the module docstring); one per replica, changed by one thread."""

    settings: ReconcileSettings
    _pairs: dict[tuple[str, int], _Pair] = field(default_factory=dict)  # (EventId key, hash of the VM name)
    # OrderedDicts: taken from the front when full, where a dict's iteration would first skip every entry deleted
    _announced: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # These and the pairs hold hash() of names, not the names: a hostile stream's 256-character names cost up to
    # 1 KiB each, 200,000 times over. A collision (64 bits, keyed per process, so it cannot be aimed at) could make
    # one VM's listings remembered, or two VMs of one EventId share a pair: at the bounds, below one chance in a
    # billion per update.
    _scopes: OrderedDict[int, None] = field(default_factory=OrderedDict)  # (scope type, scope name) that published
    _hits: list[str] = field(default_factory=list)
    _named: frozenset[int] = frozenset()  # VM names in the Resources of the records of the last update
    _absent: bool = True
    _elsewhere: int = 0  # listings kept in the pairs' ``elsewhere``, counted against ``settings.pairs``

    def note(self, vm: VmState) -> None:
        """Remember the EventIds one applied document lists (so a first listing's time is the document's): only for an
        EventId announced or a VM in a scope that publishes, so a fleet that has not opted in costs nothing here."""
        if not vm.events:
            return
        name = name_key(vm.vm_name)
        published = self._published(vm, name)
        for event in vm.events:
            key = event_key(event.event_id)
            if not published and key not in self._announced:
                continue
            pair = self._pair((key, hash(name)))
            if pair is not None:
                self._listed(pair, _place(vm), vm.seen_at)

    def _listed(self, pair: _Pair, place: _Place, when: float) -> None:
        """Remember that a VM at ``place`` listed the pair's EventId at ``when``, the first time per place."""
        if pair.place is None or pair.place == place:
            if pair.first_listed is None or when < pair.first_listed:
                pair.first_listed, pair.place = when, place
            return
        known = dict(pair.elsewhere)
        if place in known:
            if when < known[place]:
                pair.elsewhere = tuple((at, min(first, when) if at == place else first) for at, first in pair.elsewhere)
            return
        if len(self._pairs) + self._elsewhere >= self.settings.pairs:
            self._hits.append("platform_coverage_pairs")
            return
        pair.elsewhere += ((place, when),)
        self._elsewhere += 1

    def _published(self, vm: VmState, name: str) -> bool:
        """The VM is in a scope that has published a platform event: its scale set, itself, or a Resources list (an
        availability set is known only that way)."""
        return hash(name) in self._named or hash(("virtual_machine", name)) in self._scopes \
            or bool(vm.vmss_name and hash(("scale_set", name_key(vm.vmss_name))) in self._scopes)

    def update(self, records: Iterable[PlatformRecord], vms: Iterable[VmState], now: float,
               absent: bool = True) -> Reconciliation:
        """Every pair's coverage now. ``absent=False``: the VMs given are not all the fleet's (the fleet's service
        says ``no_sidecar`` from every partition's judgement), so a VM not among them is left out."""
        records = list(records)
        self._absent = absent
        for record in records:
            self._remember(self._announced, record.key, self.settings.ids, "platform_coverage_ids")
            self._remember(self._scopes, hash((record.event.scope_type, name_key(record.event.scope_name))),
                           self.settings.scopes, "platform_scopes")
        self._named = frozenset(hash(name_key(resource)) for record in records for resource in record.event.resources)
        by_name: dict[str, list[VmState]] = {}
        listing: dict[str, list[tuple[VmState, str]]] = {}  # EventId key -> the VMs listing it now (and its type)
        for vm in vms:
            by_name.setdefault(name_key(vm.vm_name), []).append(vm)
            self.note(vm)
            for event in vm.events:
                listing.setdefault(event_key(event.event_id), []).append((vm, event.event_type))
        rows = self._rows(records, by_name, now)
        listed = self._unannounced(listing, now)
        keep = {record.key for record in records} | set(listing)
        for key in [key for key in self._pairs if key[0] not in keep]:  # neither announced nor listed now: forgotten
            self._elsewhere -= len(self._pairs.pop(key).elsewhere)
        hits, self._hits = tuple(dict.fromkeys(self._hits)), []
        return Reconciliation(tuple(rows), hits, listed)

    def _rows(self, records: list[PlatformRecord], by_name: dict[str, list[VmState]], now: float) -> list[Coverage]:
        """The coverage of every (EventId, named VM) pair decided now, with its lag when observed."""
        rows: list[Coverage] = []
        for record in records:
            announced = record.event
            for resource in announced.resources:
                decided = self._decide(record, resource, by_name.get(name_key(resource), ()), now)
                if decided is not None:
                    rows.append(Coverage(record.key, announced.event_id, announced.event_type, resource, *decided))
        return rows

    def sizes(self) -> dict[str, int]:
        """What it remembers now, each bounded by its setting."""
        return {"pairs": len(self._pairs) + self._elsewhere, "announced": len(self._announced),
                "scopes": len(self._scopes)}

    def _decide(self, record: PlatformRecord, resource: str, named: Iterable[VmState],
                now: float) -> tuple[str, float | None] | None:
        """The pair's coverage, and its lag when observed."""
        pair = self._pair((record.key, hash(name_key(resource)))) or _Pair()
        first_listed = pair.listed_at(lambda place: _same_place(record, place))
        if first_listed is not None:
            return "observed", first_listed - record.announced_at
        alive = [vm for vm in named if now - vm.seen_at <= self.settings.vm_expiry and _same_place(record, _place(vm))]
        if not alive:
            return ("no_sidecar", None) if self._absent else None
        return self._missed(record, alive, now)

    def _missed(self, record: PlatformRecord, alive: list[VmState], now: float) -> tuple[str, float | None] | None:
        """A named VM alive that never listed the event: missed (or IMDS unreachable) once the grace is past."""
        if record.ended or now < min(record.announced_at, record.changed_at) + self.settings.grace:
            return None  # ended, IMDS shows it no more; an announcement dated in the future counts from when learnt
        vm = max(alive, key=lambda vm: vm.seen_at)
        return "imds_unreachable" if imds_blind_since(vm, record.announced_at) else "missed", None

    def _unannounced(self, listing: dict[str, list[tuple[VmState, str]]],
                     now: float) -> tuple[tuple[str, str, str], ...]:
        """Every unannounced EventId listed (see ``Reconciliation.listed``)."""
        if not self._scopes:
            return ()
        listed_long: list[tuple[str, str, str]] = []
        for key, listed in listing.items():
            if key in self._announced:
                continue
            for vm, event_type in listed:
                name = name_key(vm.vm_name)
                pair = self._pairs.get((key, hash(name)))
                first_listed = pair.listed_at(_place(vm).__eq__) if pair is not None else None
                if first_listed is None or now < first_listed + self.settings.grace \
                        or now - vm.seen_at > self.settings.vm_expiry or not self._published(vm, name):
                    continue
                listed_long.append((key, event_type, name))
                break
        return tuple(listed_long)

    def announced(self, key: str) -> bool:
        """The platform announced this EventId (as far as this reconciler remembers: ``ReconcileSettings.ids``)."""
        return key in self._announced

    def _pair(self, key: tuple[str, int]) -> _Pair | None:
        """The pair, made when new (None: the pairs' bound refused it)."""
        pair = self._pairs.get(key)
        if pair is None:
            if len(self._pairs) + self._elsewhere >= self.settings.pairs:
                self._hits.append("platform_coverage_pairs")
                return None
            pair = self._pairs[key] = _Pair()
        return pair

    def _remember(self, seen: OrderedDict[_K, None], key: _K, bound: int, name: str) -> None:
        if key in seen:
            return
        if len(seen) >= bound:
            seen.popitem(last=False)
            self._hits.append(name)
        seen[key] = None
