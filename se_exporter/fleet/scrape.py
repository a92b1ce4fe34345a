"""One /metrics of the fleet (``scrape``): the registry's families, written by prometheus-client, and the per-VM
families, written by ``FleetExposition``, the one hand-built writer kept (its docstring names the figure it guards).

As in the sidecar, nothing is ever removed by hand: a VM, an event or a partition that is gone from the state is
gone from the next scrape. Labels are bounded by what the owned partitions hold right now.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter as Tally
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain, count, product

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from se_exporter.core import pause
from se_exporter.core.model import EVENT_STATUSES, EVENT_TYPES
from se_exporter.fleet.collector import FLEET
from se_exporter.fleet.message import NO_IMDS, VmState
from se_exporter.fleet.vms import IMDS_STALE_AFTER, Fleet, PartitionState, imds_unreachable, latest
from se_exporter.infra.http_pages import Joined, Part


def scrape(registry: CollectorRegistry, exposition: FleetExposition, now: float,
           names: Collection[str] | None = None) -> list[Part]:
    """The fleet's /metrics: every family of ``registry`` and of ``exposition``, or only the series named in
    ``names`` (``/metrics?name[]=...``, prometheus-client's rule: a counter's ``_total``, a histogram's ``_bucket``)."""
    source = registry.restricted_registry(names) if names else registry
    return [generate_latest(source), *exposition.render(now, names)]


_HEADERS = {
    "vms": "VMs known in the partitions this replica owns and shows.",
    "pending_vms": "VMs with a listed event that concerns them, by type and status.",
    "event_vms": "VMs one event concerns: its blast radius.",
    "event_info": "1 per VM and event listed in its latest document.",
    "event_seconds_until_not_before": "NotBefore minus now, at scrape time, per VM and event; negative once passed.",
    "event_duration_seconds": "DurationInSeconds per VM and event (-1 = unknown, 0 = no impact).",
    "vm_last_seen_timestamp_seconds": "When Event Hubs enqueued the VM's latest document or heartbeat, as unix time.",
    "imds_unreachable_vms": "VMs whose sidecar is alive but cannot read IMDS (its latest poll failed, or its last "
                            f"successful read is over {IMDS_STALE_AFTER:.0f} s older than the document).",
    "vm_imds_unreachable_since_timestamp_seconds": "Per VM that cannot read IMDS: its last successful IMDS read, as "
                                                   "unix time (0: none reported).",
    "event_paused_vms": "VMs that felt a pause during the event (as their sidecars last reported it).",
    "event_longest_pause_seconds": "The longest pause a VM felt during the event.",
    "pause_seconds_bucket": "VMs whose longest pause during an event of this type was at most le seconds, per "
                            "event they last reported: the wave's cost now, not a counter (histogram_quantile, no "
                            "rate).",
}


class FleetExposition:
    """The per-VM families of a ``Fleet``'s shown VMs, each VM's lines kept from one scrape to the next: a scrape
    writes anew only the VMs changed since the last one (``Fleet.watch``: a heartbeat rewrites one line).

    The one hand-built writer kept, for the CPU of a /metrics scrape, which competes with the consumer for the
    interpreter. The figures it guards: its CPU against the library's writer over the same VMs,
    ``scripts/fleet_bench.py --scrape`` (above 0.5x, use the library), and the replicas' CPU in
    ``scripts/fleet_scale_bench.py``'s steady state (docs/performance.md, "One hand-built writer").

    The lines are kept as bytes and the body joined from them once, never built as text and then encoded (each whole
    copy of 100,000 VMs' lines is tens of MB at the peak of a scrape)."""

    def __init__(self, fleet: Fleet | list[Fleet]) -> None:
        self._fleets = fleet if isinstance(fleet, list) else [fleet]  # one per hub read
        self._lock = threading.Lock()
        self._followers = [_Follower(each) for each in self._fleets]
        self._parts: dict[tuple[int, str], _Part] = {}  # as the last scrape left them
        self._next: dict[tuple[int, str], _Part] = {}  # this scrape's, moved over from ``_parts`` one by one
        self._twice: set[str] = set()  # keys kept by more than one part
        self._events = _EventLines.of([])  # the event lines as the last scrape wrote them, and from which parts
        self._events_from: tuple[tuple[int, int], ...] = ()

    def describe(self) -> list[Metric]:
        """Every family ``render`` writes (without samples), as a collector's ``describe`` says it."""
        return [GaugeMetricFamily(f"{FLEET}_{name}", documentation) for name, documentation in _HEADERS.items()]

    def render(self, now: float, names: Collection[str] | None = None) -> list[Part]:
        """The per-VM families (those named in ``names``, when given), as parts sent in turn (``http_pages.pieces``)."""
        with self._lock:
            self._next = {}
            for index, (fleet, follower) in enumerate(zip(self._fleets, self._followers, strict=True)):
                for partition_id, whole, changed in fleet.read_shown(follower.take):
                    part = self._parts.pop((index, partition_id), None)
                    if whole is not None or part is None:
                        if part is not None:
                            self._drop(part)
                        part = _Part()
                        for vm in whole or ():
                            self._keep(part, vm.key, vm)
                    self._next[index, partition_id] = part
                    for key, current, beyond_heartbeat in changed:
                        if beyond_heartbeat or current is None:
                            self._keep(part, key, current)
                        else:
                            part.beat(key, current)
            while self._parts:  # partitions no longer shown
                self._drop(self._parts.popitem()[1])
            parts, self._parts, self._next = self._next, self._next, {}
            if self._twice:  # a VM in two partitions: each once, the one seen last, from the fleets themselves
                lines = [VmLines.of(vm) for vm in latest(fleet.vms() for fleet in self._fleets)]
                return _write([[vm.seen for vm in lines]], _EventLines.of([vm for vm in lines if vm.extra]), now, names)
            return _write([part.seen.values() for part in parts.values()], self._event_lines(parts), now, names)

    def _event_lines(self, parts: Mapping[tuple[int, str], _Part]) -> _EventLines:
        """The event lines of the kept parts, written again only when one of their VMs' event (or IMDS) lines
        changed since the last scrape: a heartbeat repeats its VM's events (docs/performance.md)."""
        source = tuple((part.serial, part.extra_changes) for part in parts.values())
        if source != self._events_from:
            self._events = _EventLines.of([vm for part in parts.values() for vm in part.extra.values()])
            self._events_from = source
        return self._events

    def _kept(self) -> Iterator[_Part]:
        return chain(self._next.values(), self._parts.values())

    def _keep(self, part: _Part, key: str, vm: VmState | None) -> None:
        """``part.keep``, noting a key that becomes (or stops being) held by another kept part too: a new key is
        looked up in the other parts (a heartbeat's key is not new), never every key at every scrape."""
        had = key in part.seen
        part.keep(key, vm)
        if vm is not None and not had and any(key in other.seen for other in self._kept() if other is not part):
            self._twice.add(key)
        elif vm is None and had and key in self._twice:
            self._recount(key)

    def _drop(self, part: _Part) -> None:
        """A part no longer kept (taken out of ``_parts`` and ``_next``): its shared keys are counted again."""
        for key in self._twice & part.seen.keys():
            self._recount(key)

    def _recount(self, key: str) -> None:
        if sum(key in other.seen for other in self._kept()) < 2:
            self._twice.discard(key)


Touched = tuple[str, VmState | None, bool]  # a key changed, its VM now (None: forgotten), changed beyond a heartbeat


class _Follower:
    """What one ``FleetExposition`` has not taken yet of one fleet's shown VMs: per shown partition, the state it took
    whole last and the keys changed in it since. ``changed`` (the watcher) and ``take`` run under the fleet's lock."""

    def __init__(self, fleet: Fleet) -> None:
        self.states: dict[str, PartitionState] = {}
        self.touched: dict[str, dict[str, bool]] = {}
        fleet.watch(self.changed)

    def changed(self, partition_id: str, key: str, beyond_heartbeat: bool) -> None:
        if partition_id in self.states:
            keys = self.touched.setdefault(partition_id, {})
            keys[key] = beyond_heartbeat or keys.get(key, False)

    def take(self, shown: dict[str, PartitionState]) -> list[tuple[str, list[VmState] | None, list[Touched]]]:
        """Each shown partition: its VMs whole when this follower did not take this state of it last time (claimed
        since, or shown again), else None and what changed since (``Touched``); the next call gives what follows."""
        taken: list[tuple[str, list[VmState] | None, list[Touched]]] = []
        for partition_id, state in shown.items():
            touched = self.touched.pop(partition_id, {})
            if self.states.get(partition_id) is state:
                taken.append((partition_id, None, [(key, state.vms.get(key), whole) for key, whole in touched.items()]))
            else:
                taken.append((partition_id, list(state.vms.values()), []))
        self.states, self.touched = shown, {}
        return taken


class _Part:
    """One shown partition's lines: every VM's last-seen line, and the other lines of the VMs that have any.
    ``extra_changes`` counts the changes of the latter (``serial`` tells one part from another)."""

    serials = count()

    def __init__(self) -> None:
        self.seen: dict[str, bytes] = {}
        self.extra: dict[str, VmLines] = {}
        self.serial = next(self.serials)
        self.extra_changes = 0

    def keep(self, key: str, vm: VmState | None) -> None:
        lines = None if vm is None else VmLines.of(vm)
        if lines is None:
            self.seen.pop(key, None)
        else:
            self.seen[key] = lines.seen
        if lines is not None and lines.extra:
            if self.extra.get(key) != lines:  # the last-seen line aside (not compared): a heartbeat's are equal
                self.extra[key] = lines
                self.extra_changes += 1
        elif self.extra.pop(key, None) is not None:
            self.extra_changes += 1

    def beat(self, key: str, vm: VmState) -> None:
        """``keep`` for a VM changed only in what a heartbeat moves: a lone last-seen line keeps its labels and takes
        the new time (writing labels again was most of a scrape's CPU, 5 % of a fleet heartbeating between scrapes)."""
        old = self.seen.get(key)
        if old is None or key in self.extra or (vm.imds is not NO_IMDS and imds_unreachable(vm)):
            self.keep(key, vm)
            return
        self.seen[key] = old[:old.rindex(b"} ") + 2] + repr(vm.seen_at).encode()


@dataclass(frozen=True, slots=True)
class VmLines:
    """One VM's sample lines, but for those that depend on the scrape's time (its events' NotBefore - now)."""

    seen: bytes = field(compare=False)  # the last-seen sample but its name (``_SEEN_NAME``): _write adds the name
    unreachable: str | None = None
    info: tuple[str, ...] = ()
    until: tuple[tuple[str, float], ...] = ()  # the sample's name and labels, and NotBefore
    duration: tuple[str, ...] = ()
    kinds: frozenset[tuple[str, str]] = frozenset()  # (type, status) of the events that concern the VM
    blast: tuple[tuple[str, str], ...] = ()  # (id, type) of each event that concerns the VM
    paused: tuple[tuple[str, str, float], ...] = ()  # (id, type, longest pause) of each event it felt a pause in

    @property
    def extra(self) -> bool:
        return bool(self.info) or self.unreachable is not None or bool(self.paused)

    @classmethod
    def of(cls, vm: VmState) -> VmLines:
        vm_id = escape(vm.vm_id or vm.key)
        identity = (f'vm_id="{vm_id}",vm_name="{escape(vm.vm_name)}",'
                    f'vmss_name="{escape(vm.vmss_name)}",location="{escape(vm.location)}"')
        seen = f"{{{identity}}} {vm.seen_at!r}".encode()
        unreachable = None
        if vm.imds is not NO_IMDS and imds_unreachable(vm):
            unreachable = (f"{FLEET}_vm_imds_unreachable_since_timestamp_seconds{{{identity}}} "
                           f"{float(vm.imds.last_success or 0.0)!r}")
        paused = _paused(vm)
        if not vm.events:
            return cls(seen, unreachable, paused=paused)
        info, until, duration, kinds, blast = [], [], [], set(), []
        for event in vm.events:
            info.append(f'{FLEET}_event_info{{{identity},event_id="{escape(event.event_id)}",'
                        f'event_type="{escape(event.event_type)}",event_status="{escape(event.event_status)}",'
                        f'event_source="{escape(event.event_source)}",affects_this_vm="{event.affects_this_vm}"}} 1.0')
            key = f'vm_id="{vm_id}",event_id="{escape(event.event_id)}"'
            if event.not_before is not None:
                until.append((f"{FLEET}_event_seconds_until_not_before{{{key}}} ", event.not_before))
            if event.duration_seconds is not None:
                duration.append(f"{FLEET}_event_duration_seconds{{{key}}} {event.duration_seconds!r}")
            if event.counts_for_vm:
                kinds.add((event.event_type, event.event_status))
                blast.append((event.event_id, event.event_type))
        return cls(seen, unreachable, tuple(info), tuple(until), tuple(duration), frozenset(kinds), tuple(blast),
                   paused)


def _paused(vm: VmState) -> tuple[tuple[str, str, float], ...]:
    """(EventId, type, longest pause) of each event the VM's sidecar last said it paused in (its kept ``pauses``)."""
    reported = vm.value("pauses")
    if reported is None:
        return ()
    return tuple((event_id, entry["type"], entry["longest"]) for event_id, entry in json.loads(str(reported)).items())


_SEEN_NAME = f"{FLEET}_vm_last_seen_timestamp_seconds".encode()
_SEEN_JOIN = b"\n" + _SEEN_NAME
SEEN_PIECE = 2048  # last-seen lines per piece (about 300 KB): joined as they are sent, never all at once


@dataclass(frozen=True)
class _EventLines:
    """The families of the VMs that list events or cannot read IMDS: those that do not depend on the scrape's time
    as text ready to send, by name, and each NotBefore with its sample's name and labels (written at each scrape)."""

    written: dict[str, bytes]
    until: list[tuple[str, float]]

    @classmethod
    def of(cls, extra: list[VmLines]) -> _EventLines:
        pending = Tally(dict.fromkeys(product(EVENT_TYPES, EVENT_STATUSES), 0))  # every type and status shown
        pending.update(chain.from_iterable(lines.kinds for lines in extra))
        unreachable = [lines.unreachable for lines in extra if lines.unreachable is not None]
        families = {
            "pending_vms": _per_event("pending_vms", pending, ("event_type", "event_status")),
            "event_vms": _per_event("event_vms", Tally(chain.from_iterable(lines.blast for lines in extra))),
            "event_info": list(chain.from_iterable(lines.info for lines in extra)),
            "event_duration_seconds": list(chain.from_iterable(lines.duration for lines in extra)),
            "imds_unreachable_vms": [f"{FLEET}_imds_unreachable_vms {float(len(unreachable))!r}"],
            "vm_imds_unreachable_since_timestamp_seconds": unreachable,
            **_pause_families(list(chain.from_iterable(lines.paused for lines in extra))),
        }
        return cls({name: _gauge(name, lines) for name, lines in families.items()},
                   list(chain.from_iterable(lines.until for lines in extra)))


_BOUNDS = (*pause.BUCKETS, math.inf)
_LE = {le: "+Inf" if le == math.inf else repr(float(le)) for le in _BOUNDS}  # as prometheus-client writes each bound


def _pause_families(paused: list[tuple[str, str, float]]) -> dict[str, list[str]]:
    """The pause families' lines from each VM's ``(id, type, longest pause)`` of the events it felt a pause in."""
    longest: dict[tuple[str, str], float] = {}
    for event_id, event_type, seconds in paused:
        longest[event_id, event_type] = max(seconds, longest.get((event_id, event_type), 0.0))
    buckets = Tally((t, le) for _, t, seconds in paused for le in _BOUNDS if seconds <= le)
    return {
        "event_paused_vms": _per_event("event_paused_vms", Tally((e, t) for e, t, _ in paused)),
        "event_longest_pause_seconds": _per_event("event_longest_pause_seconds", longest),
        "pause_seconds_bucket": [  # every bound of each type felt
            f'{FLEET}_pause_seconds_bucket{{event_type="{escape(t)}",le="{_LE[le]}"}} {float(buckets[t, le])!r}'
            for t in sorted({t for _, t, _ in paused}) for le in _BOUNDS],
    }


def _write(seen: list[Collection[bytes]], events: _EventLines, now: float, names: Collection[str] | None) -> list[Part]:
    """``render``'s parts: the count of VMs, every VM's last-seen line (``seen``: groups of them, in order, as one
    ``Joined`` over the kept lines), the countdowns, and ``events``' families."""
    count = sum(map(len, seen))
    seen_lines: list[Part] = [_SEEN_NAME, Joined(_SEEN_JOIN, list(chain.from_iterable(seen)), SEEN_PIECE), b"\n"]
    families: dict[str, list[Part]] = {
        "vms": [_gauge("vms", [f"{FLEET}_vms {float(count)!r}"])],
        "event_seconds_until_not_before": [_gauge("event_seconds_until_not_before", [
            f"{name}{not_before - now!r}" for name, not_before in events.until])],
        "vm_last_seen_timestamp_seconds": [_gauge("vm_last_seen_timestamp_seconds", []),
                                           *(seen_lines if count else [])],
        **{name: [text] for name, text in events.written.items()},
    }
    return [part for name, written in families.items() if names is None or f"{FLEET}_{name}" in names
            for part in written]


def _per_event(name: str, values: Mapping[tuple[str, str], float],
               labels: tuple[str, str] = ("event_id", "event_type")) -> list[str]:
    """The lines of a family of one value per event (by EventId and type), or per other pair of ``labels``."""
    first, second = labels
    return [f'{FLEET}_{name}{{{first}="{escape(a)}",{second}="{escape(b)}"}} {float(v)!r}'
            for (a, b), v in sorted(values.items())]


def _gauge(name: str, lines: list[str]) -> bytes:
    """A gauge family of the text format: its HELP and TYPE lines, then its sample lines."""
    samples = "\n".join(lines) + "\n" if lines else ""
    return f"# HELP {FLEET}_{name} {_HEADERS[name]}\n# TYPE {FLEET}_{name} gauge\n{samples}".encode()


def escape(value: str) -> str:
    """Label values as the text format wants them: backslash, double quote and newline escaped."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value
