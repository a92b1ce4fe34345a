"""The fleet's metrics: state families built from the owned partitions on every scrape, plus counters.

As in the sidecar, nothing is ever removed by hand: a VM, an event or a partition that is gone from the
state is gone from the next scrape. Labels are bounded by what the owned partitions hold right now.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain, count

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from se_exporter.core.model import EVENT_STATUSES, EVENT_TYPES
from se_exporter.fleet.message import BOUND_NAMES, INVALID_REASONS, NO_IMDS, VmState
from se_exporter.fleet.vms import IMDS_STALE_AFTER, Fleet, imds_unreachable
from se_exporter.infra.http_pages import Joined, Part, pieces

FLEET = "azure_scheduled_fleet"
VM_LABELS = ["vm_id", "vm_name", "vmss_name", "location"]
# What the forwarder's classify() says, plus a partition taken over by another replica and a state blob unread.
ERROR_REASONS = ("timeout", "auth", "connection", "service", "other", "ownership_lost", "state_read")
# Signs that another replica has taken an owned partition: its link stolen, as the SDK reports it
# (``consumer.Service``).
LOSS_SIGNS = ("link_stolen",)
# Why a state blob (or part of it) was not used: not gzip'd JSON, JSON of another shape, an older or unknown format,
# rows out of type or range, a position past the partition's newest event.
DAMAGE_REASONS = ("unreadable", "wrong_shape", "format", "row", "position")
PLATFORM_STATUSES = ("Scheduled", "Started", "Completed", "Canceled")  # the platform copy's; IMDS shows the first two
LAG_BUCKETS = (-300.0, -60.0, -10.0, 0.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, float("inf"))


@dataclass
class PartitionView:
    """What the consumer knows about one owned partition besides its VMs."""

    lag_events: float | None = None
    lag_seconds: float | None = None
    unsaved_since: float | None = None  # when the first event not yet covered by a checkpoint was handled
    newer_format: bool = False  # its state blob is a newer release's: neither state nor checkpoint written


class FleetMetrics:
    """Counters of the consumer itself; the state families come from ``FleetCollector``.

    What every batch counts (messages received, documents applied by kind, when) is queued (``batch``) and added
    to the counters when the registry is collected or ``flush`` is called (the consumer's watchdog, every second):
    one append per batch instead of three locked counter updates, at one heartbeat a batch a few per cent of a
    replica's CPU. A scrape reads them exact (the flush is the registry's first collector); the queue holds at
    most a second's batches."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._batches: deque[tuple[int, int, int, float | None]] = deque()  # thread-safe append and popleft
        self._flushing = threading.Lock()  # one flush at a time: the last-applied time never moves back
        registry.register(_Flush(self))  # before the counters it feeds: collected first
        self.consumed = Counter(f"{FLEET}_documents_consumed", "Messages received from Event Hubs.",
                                registry=registry)
        self.applied = Counter(f"{FLEET}_documents_applied", "Documents that became a VM's latest, by kind (retired: a "
                               "sidecar's message that retired the VM known by its name).",
                               ["kind"], registry=registry)
        self.duplicates = Counter(f"{FLEET}_duplicate_documents",
                                  "Documents dropped: a resend of the applied one, or older than it.",
                                  ["reason"], registry=registry)
        self.replayed = Counter(f"{FLEET}_replayed_documents",
                                "Documents read again after a restore that the restored state already held.",
                                registry=registry)
        self.invalid = Counter(f"{FLEET}_invalid_messages", "Messages that are not forwarded documents, by reason.",
                               ["reason"], registry=registry)
        self.warnings = Counter(f"{FLEET}_message_warnings",
                                "Tolerated oddities of applied messages (unknown properties, document fields).",
                                ["reason"], registry=registry)
        self.expirations = Counter(f"{FLEET}_vm_expirations", "VMs forgotten after --vm-expiry of silence.",
                                   registry=registry)
        self.errors = Counter(f"{FLEET}_consumer_errors", "Errors the Event Hubs client reported, by reason.",
                              ["reason"], registry=registry)
        self.checkpoints = Counter(f"{FLEET}_checkpoints", "Writes of a partition's state and checkpoint, by outcome.",
                                   ["outcome"], registry=registry)
        self.state_bytes = Counter(f"{FLEET}_state_bytes_written",
                                   "Bytes of partition states uploaded, by kind: a whole state (base) or a delta.",
                                   ["kind"], registry=registry)
        self.claims = Counter(f"{FLEET}_partition_claims", "Partitions this replica started reading.",
                              registry=registry)
        self.releases = Counter(f"{FLEET}_partition_releases", "Partitions this replica stopped reading, by reason.",
                                ["reason"], registry=registry)
        self.loss_signs = Counter(f"{FLEET}_partition_loss_signs",
                                  "Signs that an owned partition may have passed to another replica, each hiding its "
                                  "VMs until it is ours again or closed, by sign.", ["sign"], registry=registry)
        self.shown_partitions = Gauge(f"{FLEET}_shown_partitions",
                                      "Owned partitions whose VMs this replica shows: not one not read yet, nor one "
                                      "whose link was stolen.", registry=registry)
        self.state_damaged = Counter(f"{FLEET}_state_damaged",
                                     "State blobs, or rows of them, not used because they are damaged, by reason.",
                                     ["reason"], registry=registry)
        self.bound_hits = Counter(f"{FLEET}_bound_hits", "Times a bound on what the fleet keeps was reached, by bound.",
                                  ["bound"], registry=registry)
        self.last_applied = Gauge(f"{FLEET}_last_applied_timestamp_seconds",
                                  "When this replica last applied a document, as unix time (0: not yet).",
                                  registry=registry)
        for kind in ("change", "heartbeat", "retired"):
            self.applied.labels(kind)
        for reason in ("resend", "older"):
            self.duplicates.labels(reason)
        for reason in (*INVALID_REASONS, "internal_error"):
            self.invalid.labels(reason)
        for reason in DAMAGE_REASONS:
            self.state_damaged.labels(reason)
        for bound in BOUND_NAMES:
            self.bound_hits.labels(bound)
        for outcome in ("ok", "error", "superseded"):
            self.checkpoints.labels(outcome)
        for kind in ("base", "delta"):
            self.state_bytes.labels(kind)
        for reason in ERROR_REASONS:
            self.errors.labels(reason)
        for sign in LOSS_SIGNS:
            self.loss_signs.labels(sign)
        self._platform(registry)

    def batch(self, received: int, changes: int, heartbeats: int, applied_at: float | None) -> None:
        """A batch's counts (from the consumer's loop); ``applied_at`` when it applied a document."""
        self._batches.append((received, changes, heartbeats, applied_at))

    def flush(self) -> None:
        """Add the queued batches' counts to the counters (from any thread: each batch is taken once, in order)."""
        with self._flushing:
            received = changes = heartbeats = 0
            applied_at = None
            while True:
                try:
                    count, changed, beats, at = self._batches.popleft()
                except IndexError:
                    break
                received, changes, heartbeats = received + count, changes + changed, heartbeats + beats
                applied_at = at if at is not None else applied_at
            if received:
                self.consumed.inc(received)
            if changes:
                self.applied.labels("change").inc(changes)
            if heartbeats:
                self.applied.labels("heartbeat").inc(heartbeats)
            if applied_at is not None:
                self.last_applied.set(applied_at)

    def _platform(self, registry: CollectorRegistry) -> None:
        """The platform stream's counters (fed by ``fleet/platform/service.py``). Each counts on ONE
        replica per EventId, its home's, so a sum over replicas counts each once."""
        self.platform_events = Counter(f"{FLEET}_platform_events", "Status changes of scheduled events the platform "
                                       "announced (Event Grid), each EventId and status once.",
                                       ["event_type", "event_status"], registry=registry)
        self.platform_applied = Counter(f"{FLEET}_platform_messages_applied", "Platform messages (Event Grid's) "
                                        "folded into a platform picture.", registry=registry)
        self.platform_last_applied = Gauge(f"{FLEET}_platform_last_applied_timestamp_seconds", "When this replica "
                                           "last applied a platform message, as unix time (0: not yet).",
                                           registry=registry)
        self.platform_duplicates = Counter(f"{FLEET}_platform_duplicates", "Platform messages Event Grid delivered "
                                           "again (the same id, on any partition), beyond the first: counted by the "
                                           "EventId's home replica once it has read that partition's picture.",
                                           registry=registry)
        self.missed_events = Counter(f"{FLEET}_missed_events", "Affected VMs of platform events whose sidecar did not "
                                     "list them, each VM and EventId once, by why.", ["event_type", "reason"],
                                     registry=registry)
        self.unannounced_events = Counter(f"{FLEET}_unannounced_events", "EventIds sidecars listed that the platform "
                                          "never announced (only in scopes that publish), each once.", ["event_type"],
                                          registry=registry)
        self.announcement_lag = Histogram(f"{FLEET}_announcement_lag_seconds", "When a VM first listed a platform "
                                          "event minus the eventTime of its first status (negative: the VM knew "
                                          "first).",
                                          buckets=LAG_BUCKETS, registry=registry)
        self.impact_seconds = Counter(f"{FLEET}_impact_seconds", "Per affected VM, Started to Completed of platform "
                                      "events by the platform's times.", ["event_type", "scope_name", "location"],
                                      registry=registry)
        for event_type in EVENT_TYPES:
            for status in PLATFORM_STATUSES:
                self.platform_events.labels(event_type, status)


class PartitionCollector(Collector):
    """The consumer's per-partition gauges, from what the consumer knows right now; never raises into a scrape."""

    def __init__(self, partitions: Callable[[], Mapping[str, PartitionView]],
                 hub_partitions: Callable[[], int | None], clock: Callable[[], float] = time.time) -> None:
        self._partitions = partitions
        self._hub_partitions = hub_partitions
        self._clock = clock

    def describe(self) -> list[Metric]:
        """Every family ``collect`` can yield (without samples), so the registry maps each name to this collector."""
        return [GaugeMetricFamily(family.name, family.documentation)
                for family in PartitionCollector(lambda: {}, lambda: 0).collect()]

    def collect(self) -> Iterator[Metric]:
        yield from self._consumer(self._clock())

    def _consumer(self, now: float) -> Iterator[Metric]:
        partitions = self._partitions()
        yield GaugeMetricFamily(f"{FLEET}_owned_partitions", "Partitions this replica reads right now.",
                                value=len(partitions))
        yield GaugeMetricFamily(f"{FLEET}_state_newer_format_partitions",
                                "Owned partitions whose state blob is a newer release's: read, but neither state nor "
                                "checkpoint written by this replica.",
                                value=sum(view.newer_format for view in partitions.values()))
        total = self._hub_partitions()
        if total is not None:
            yield GaugeMetricFamily(f"{FLEET}_hub_partitions", "Partitions of the event hub.", value=total)
        lag = GaugeMetricFamily(f"{FLEET}_partition_lag_events",
                                "Events enqueued in the partition after the last one handled, as the SDK last said.",
                                labels=["partition_id"])
        lag_seconds = GaugeMetricFamily(f"{FLEET}_partition_lag_seconds",
                                        "Enqueue time of the partition's last event minus that of the last handled.",
                                        labels=["partition_id"])
        age = GaugeMetricFamily(f"{FLEET}_partition_checkpoint_age_seconds",
                                "How long handled events have waited for a checkpoint (0: all checkpointed).",
                                labels=["partition_id"])
        for partition_id, view in sorted(partitions.items()):
            if view.lag_events is not None:
                lag.add_metric([partition_id], view.lag_events)
            if view.lag_seconds is not None:
                lag_seconds.add_metric([partition_id], view.lag_seconds)
            age.add_metric([partition_id], max(0.0, now - view.unsaved_since) if view.unsaved_since else 0.0)
        yield from (lag, lag_seconds, age)


class _Flush(Collector):
    """The first collector of the registry: adds the queued batches' counts before the counters are read."""

    def __init__(self, metrics: FleetMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # no family of its own (and no collection at registration)

    def collect(self) -> Iterator[Metric]:
        self._metrics.flush()
        return iter(())


# ---------------------------------------------------------------- the per-VM families, written directly

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
}


def render_fleet(vms: Iterable[VmState], now: float) -> str:
    """The fleet families in the Prometheus text format, from one consistent list of VMs (each VM once).

    Written here rather than through prometheus-client's families (the one hand-built writer kept, on purpose):
    its generic writer validates and escapes label by label, which at fleet sizes costs several times the CPU of a
    scrape, and a scrape competes with the consumer for the interpreter. The figure it guards is the CPU of one
    /metrics scrape: ``scripts/fleet_bench.py --scrape`` writes the same VMs both ways, checks the samples are
    the same and prints the ratio (part of ``make bench``); should the ratio pass 0.5, use the library.
    /metrics itself writes through ``FleetExposition``, which keeps these lines between scrapes."""
    return b"".join(pieces(_chunks(vms, now))).decode()


def _chunks(vms: Iterable[VmState], now: float) -> list[Part]:
    lines = [VmLines.of(vm) for vm in vms]
    return _write([[vm.seen for vm in lines]], _EventLines.of([vm for vm in lines if vm.extra]), len(lines), now)


def select_families(parts: Iterable[Part], names: Collection[str]) -> bytes:
    """The series of a text exposition named in ``names``, each after its family's HELP and TYPE lines:
    ``/metrics?name[]=...``, with prometheus-client's rule (a name is a series' name: a counter's ``_total``, a
    histogram's ``_bucket``; a family without such a series is left out). The fleet filters its whole exposition
    so, the registry's families and its two hand-written writers' alike, after a whole collection (the registry's
    first collector adds the queued batches' counts)."""
    kept: list[bytes] = []
    head: list[bytes] = []
    for line in b"".join(pieces(parts)).splitlines(keepends=True):
        if line.startswith(b"# HELP "):
            head = [line]
        elif line.startswith(b"#"):
            head.append(line)
        elif line.strip() and line.split(b"{", 1)[0].split(b" ", 1)[0].decode() in names:
            kept += head
            head = []
            kept.append(line)
    return b"".join(kept)


class FleetExposition:
    """``render_fleet`` of a ``Fleet``'s shown VMs, each VM's lines kept from one scrape to the next: a scrape
    writes anew only the VMs changed since the last one (``Fleet.take_changes``: a heartbeat rewrites one line)
    and joins the rest as they are. Between two scrapes 15 s apart a fleet heartbeating every 300 s changes 5 % of
    its VMs; writing every VM at every scrape was a third of the replicas' CPU over the bare SDK's in
    ``scripts/fleet_scale_bench.py``'s steady state (the figure this guards). One scrape writes at a time; what is
    kept is one line per shown VM (and the event lines of VMs that list events), as bytes: the scrape's body is
    joined from them once, never built as text first and then encoded (each whole copy of 100,000 VMs' lines is
    tens of MB of memory at the peak of a scrape). A VM held by two shown partitions (a hand-over, a hub whose
    partition count grew) is noticed as it is kept, not by a pass over every VM at each scrape."""

    def __init__(self, fleet: Fleet | list[Fleet]) -> None:
        self._fleets = fleet if isinstance(fleet, list) else [fleet]  # one per hub read
        self._lock = threading.Lock()
        self._followers = [each.follow() for each in self._fleets]
        self._parts: dict[tuple[int, str], _Part] = {}  # as the last scrape left them
        self._next: dict[tuple[int, str], _Part] = {}  # this scrape's, moved over from ``_parts`` one by one
        self._twice: set[str] = set()  # keys kept by more than one part
        self._events = _EventLines.of([])  # the event lines as the last scrape wrote them, and from which parts
        self._events_from: tuple[tuple[int, int], ...] = ()

    def render(self, now: float) -> list[Part]:
        """The fleet families, as parts of the text format to be sent one after another (``http_pages.pieces``)."""
        with self._lock:
            self._next = {}
            for index, (fleet, follower) in enumerate(zip(self._fleets, self._followers, strict=True)):
                for partition_id, whole, changed in fleet.take_changes(follower):
                    part = self._parts.pop((index, partition_id), None)
                    if whole is not None or part is None:
                        if part is not None:
                            self._drop(part)
                        part = self._next[index, partition_id] = _Part()
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
                return _chunks(_latest(fleet.vms() for fleet in self._fleets), now)
            return _write([part.seen.values() for part in parts.values()], self._event_lines(parts),
                          sum(len(part.seen) for part in parts.values()), now)

    def _event_lines(self, parts: Mapping[tuple[int, str], _Part]) -> _EventLines:
        """The event lines of the kept parts, written again only when one of their VMs' event (or IMDS) lines
        changed since the last scrape: a heartbeat repeats its VM's events. Rewriting them at every scrape was most
        of a scrape's CPU with one VM in ten listing an event (``scripts/fleet_scale_bench.py``, steady state)."""
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
        if vm is not None and not had:
            if any(key in other.seen for other in self._kept() if other is not part):
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


def _latest(lists: Iterable[list[VmState]]) -> list[VmState]:
    """Each VM once, the one seen last (``Fleet.vms`` does so within a fleet; this across the fleets of two hubs)."""
    shown: dict[str, VmState] = {}
    for vms in lists:
        for vm in vms:
            other = shown.get(vm.key)
            if other is None or vm.seen_at > other.seen_at:
                shown[vm.key] = vm
    return list(shown.values())


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
        if vm is None:
            self.seen.pop(key, None)
            if self.extra.pop(key, None) is not None:
                self.extra_changes += 1
            return
        lines = VmLines.of(vm)
        self.seen[key] = lines.seen
        if lines.extra:
            if self.extra.get(key) != lines:  # the last-seen line aside (not compared): a heartbeat's are equal
                self.extra[key] = lines
                self.extra_changes += 1
        elif self.extra.pop(key, None) is not None:
            self.extra_changes += 1

    def beat(self, key: str, vm: VmState) -> None:
        """``keep`` for a VM changed only in what a heartbeat moves: when its only line is the last-seen one and
        stays so, the line keeps its labels and takes the new time (the labels are not written again: most of a
        scrape's CPU once the event lines are kept, with 5 % of a fleet heartbeating between scrapes)."""
        old = self.seen.get(key)
        if old is None or key in self.extra or (vm.imds is not NO_IMDS and imds_unreachable(vm)):
            self.keep(key, vm)
            return
        self.seen[key] = old[:old.rindex(b"} ") + 2] + repr(vm.seen_at).encode()


@dataclass(frozen=True, slots=True)
class VmLines:
    """One VM's sample lines, but for those that depend on the scrape's time (its events' NotBefore - now)."""

    seen: bytes = field(compare=False)  # the last-seen sample but its name (``_SEEN``): _write adds the name
    unreachable: str | None = None
    info: tuple[str, ...] = ()
    until: tuple[tuple[str, float], ...] = ()  # the sample's name and labels, and NotBefore
    duration: tuple[str, ...] = ()
    kinds: frozenset[tuple[str, str]] = frozenset()  # (type, status) of the events that concern the VM
    blast: tuple[tuple[str, str], ...] = ()  # (id, type) of each event that concerns the VM

    @property
    def extra(self) -> bool:
        return bool(self.info) or self.unreachable is not None

    @classmethod
    def of(cls, vm: VmState) -> VmLines:
        identity = (f'vm_id="{escape(vm.vm_id or vm.key)}",vm_name="{escape(vm.vm_name)}",'
                    f'vmss_name="{escape(vm.vmss_name)}",location="{escape(vm.location)}"')
        seen = f"{{{identity}}} {vm.seen_at!r}".encode()
        unreachable = None
        if vm.imds is not NO_IMDS and imds_unreachable(vm):
            unreachable = (f"{FLEET}_vm_imds_unreachable_since_timestamp_seconds{{{identity}}} "
                           f"{float(vm.imds.last_success or 0.0)!r}")
        if not vm.events:
            return cls(seen, unreachable)
        info, until, duration, kinds, blast = [], [], [], set(), []
        vm_id = escape(vm.vm_id or vm.key)
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
        return cls(seen, unreachable, tuple(info), tuple(until), tuple(duration), frozenset(kinds), tuple(blast))


_SEEN = f"{FLEET}_vm_last_seen_timestamp_seconds"
_SEEN_NAME = _SEEN.encode()
_SEEN_JOIN = b"\n" + _SEEN_NAME
SEEN_PIECE = 2048  # last-seen lines per piece (about 300 KB): joined as they are sent, never all at once


@dataclass(frozen=True)
class _EventLines:
    """The families of the VMs that list events or cannot read IMDS, as far as they do not depend on the scrape's
    time: text ready to send, and each NotBefore with its sample's name and labels (written at each scrape)."""

    pending: list[str]
    blast: list[str]
    info: bytes
    until: list[tuple[str, float]]
    duration: bytes  # and the last-seen family's header, which follows
    after: bytes  # the IMDS families

    @classmethod
    def of(cls, extra: list[VmLines]) -> _EventLines:
        pending: Tally[tuple[str, str]] = Tally({(t, s): 0 for t in EVENT_TYPES for s in EVENT_STATUSES})
        info: list[str] = []
        until: list[tuple[str, float]] = []
        duration: list[str] = []
        unreachable: list[str] = []
        kinds: list[tuple[str, str]] = []
        events: list[tuple[str, str]] = []
        for lines in extra:
            if lines.unreachable is not None:
                unreachable.append(lines.unreachable)
            info.extend(lines.info)
            until.extend(lines.until)
            duration.extend(lines.duration)
            kinds.extend(lines.kinds)
            events.extend(lines.blast)
        pending.update(kinds)
        blast = Tally(events)
        return cls(
            [f'{FLEET}_pending_vms{{event_type="{escape(t)}",event_status="{escape(s)}"}} {float(n)!r}'
             for (t, s), n in sorted(pending.items())],
            [f'{FLEET}_event_vms{{event_id="{escape(e)}",event_type="{escape(t)}"}} {float(n)!r}'
             for (e, t), n in sorted(blast.items())],
            write_gauges({"event_info": info}, _HEADERS).encode(), until,
            write_gauges({"event_duration_seconds": duration,
                          "vm_last_seen_timestamp_seconds": []},  # its samples follow, as one chunk of bytes
                         _HEADERS).encode(),
            write_gauges({"imds_unreachable_vms": [f"{FLEET}_imds_unreachable_vms {float(len(unreachable))!r}"],
                          "vm_imds_unreachable_since_timestamp_seconds": unreachable}, _HEADERS).encode())


def _write(seen: list[Iterable[bytes]], events: _EventLines, count: int, now: float) -> list[Part]:
    """The families, in the order ``render_fleet`` has always written them: the counts and the event lines of the
    VMs that have any, every VM's last-seen line (``seen``: groups of them, in order, as one ``Joined`` over the
    kept lines), and the IMDS lines. Parts of the text format, to be sent one after the other."""
    counts = write_gauges({"vms": [f"{FLEET}_vms {float(count)!r}"], "pending_vms": events.pending,
                           "event_vms": events.blast}, _HEADERS)
    until = write_gauges({"event_seconds_until_not_before": [f"{name}{not_before - now!r}"
                                                              for name, not_before in events.until]}, _HEADERS)
    before = [counts.encode(), events.info, until.encode(), events.duration]
    if not count:
        return [*before, events.after]
    return [*before, _SEEN_NAME, Joined(_SEEN_JOIN, list(chain.from_iterable(seen)), SEEN_PIECE), b"\n",
            events.after]


def write_gauges(families: Mapping[str, list[str]], headers: Mapping[str, str]) -> str:
    """Gauge families in the text format: each family's HELP and TYPE lines, then its samples (``families``: the
    name after ``azure_scheduled_fleet_`` and its sample lines, as ``render_fleet`` writes them)."""
    parts = []
    for name, lines in families.items():
        parts.append(f"# HELP {FLEET}_{name} {headers[name]}\n# TYPE {FLEET}_{name} gauge\n")
        if lines:
            parts.append("\n".join(lines))
            parts.append("\n")
    return "".join(parts)


def escape(value: str) -> str:
    """Label values as the text format wants them: backslash, double quote and newline escaped."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value
