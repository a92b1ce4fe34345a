"""Prometheus metrics: current state from a custom collector, history from counters and histograms.

The per-event families are yielded fresh from the latest ``Snapshot`` on every scrape, so an event
that leaves the document leaves ``/metrics`` with it: there is no ``labels().remove()``
bookkeeping to forget, and the number of series is bounded by the events listed right now.
NotBefore, Description and Resources are never labels (unbounded values); they are gauges or
left to spans and forwarded documents.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from se_exporter import __version__
from se_exporter.core import pause
from se_exporter.core.lifecycle import EventRecord
from se_exporter.core.model import VmIdentity, affects_label, affects_vm, vm_name
from se_exporter.infra.held import HeldFamilies
from se_exporter.sidecar.snapshot import Snapshot

NAMESPACE = "azure_scheduled_events"
EVENT = "azure_scheduled_event"

NOTICE_BUCKETS = (0, 1, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400, 259200, 604800)
REBALANCE_BUCKETS = (5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
IMPACT_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600)
# affects_this_vm (true, false, unknown) on the per-type families: this VM's events apart from its neighbours' (an
# availability set lists each VM's events on every VM of the set), so a query can count this VM's maintenance without
# counting a neighbour's. "false" is a neighbour's.
NEIGHBOURS = "false"
# Bounds on what IMDS puts in labels (nothing a VM is told is trusted): a label value is cut at MAX_LABEL characters,
# ending in LABEL_MARK so the cut shows; a document's first MAX_EVENT_SERIES events get per-event series: this VM's
# (affects_this_vm true or unknown) before its neighbours', each by EventId, so no neighbour takes this VM's alert.
# Each hit is counted once per document (bound_hits_total). A 1 MB EventId made /metrics 5 MB; 3,000 events, 2 MB.
MAX_LABEL = 256
LABEL_MARK = "...[truncated]"
MAX_EVENT_SERIES = 64
POLL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)


# Families a user may turn off (``--disable-metrics``), each with what it costs and what is lost without it: the
# histograms, which say most and cost most (20 series each once used), and the platform's process_* gauges. Nothing
# an alert rule of the mixin reads is here.
METRIC_GROUPS: dict[str, str] = {
    "notice": "the notice_seconds histogram (per event type seen; the notice and host-failure panels)",
    "impact": "the impact_seconds histogram (per event type seen; the impact panels)",
    "spot_rebalance": "the spot_rebalance_to_preempt_seconds histogram (once a Preempt followed a recommendation)",
    "poll_duration": "the poll_duration_seconds histogram (18 series from the first poll; the poll latency panel)",
    "process": "the process_* gauges (the sidecar's CPU, memory and file descriptors, on Linux)",
}


class Recorder(Protocol):
    """A counter or histogram as the sidecar counts into it: a held family (``infra/held.py``), or one turned off."""

    def labels(self, *values: str) -> Any: ...

    def inc(self, amount: float = 1.0) -> None: ...

    def observe(self, value: float) -> None: ...


class _Off:
    """A family turned off with ``--disable-metrics``: every count and observation goes nowhere."""

    def labels(self, *values: str) -> _Off:
        return self

    def inc(self, amount: float = 1.0) -> None:
        """Counted nowhere."""

    def observe(self, value: float) -> None:
        """Observed nowhere."""


class Metrics:
    """Every metric the sidecar exposes, registered in the registry it is given.

    The labelled counters and the histograms are held families (``infra/held.py``): a label set appears once it
    is first counted, shown at 0 for ``held.hold`` seconds first, so an idle VM exports none of the series of
    event types, transitions and outcomes it never saw, and ``increase()`` still sees the first of each."""

    def __init__(self, registry: CollectorRegistry, snapshot: Callable[[], Snapshot],
                 clock: Callable[[], float] = time.time, held: HeldFamilies | None = None,
                 disabled: Collection[str] = ()) -> None:
        held = HeldFamilies(0.0) if held is None else held

        def histogram(group: str, name: str, documentation: str, buckets: Sequence[float],
                      labels: Sequence[str] = ()) -> Recorder:
            return _Off() if group in disabled else held.histogram(name, documentation, buckets, labels)

        self.transitions: Recorder = held.counter(
            f"{NAMESPACE}_transitions",
            "Lifecycle transitions seen, by event type and whether the event lists this VM.",
            ["event_type", "transition", "affects_this_vm"])
        self.notice = histogram(
            "notice", f"{NAMESPACE}_notice_seconds", "First seen -> Started: the warning we really got.",
            NOTICE_BUCKETS, ["event_type", "affects_this_vm"])
        self.impact = histogram(
            "impact", f"{NAMESPACE}_impact_seconds", "Started -> gone from the document.",
            IMPACT_BUCKETS, ["event_type", "affects_this_vm"])
        self.rebalance_to_preempt = histogram(
            "spot_rebalance", f"{NAMESPACE}_spot_rebalance_to_preempt_seconds",
            "SpotRebalanceRecommendation first seen -> the Preempt that followed it on this VM first seen: the warning "
            "the recommendation gave.", REBALANCE_BUCKETS)
        self.polls: Recorder = held.counter(
            f"{NAMESPACE}_polls", "Polls of the Scheduled Events endpoint, by outcome.", ["outcome"])
        self.poll_duration = histogram(
            "poll_duration", f"{NAMESPACE}_poll_duration_seconds", "Time of one poll of IMDS, failures included.",
            POLL_BUCKETS)
        self.document_changes = Counter(
            f"{NAMESPACE}_document_changes", "Valid documents whose bytes differed from the previous one.",
            registry=registry)
        self.document_warnings = Counter(
            f"{NAMESPACE}_document_warnings", "Fields tolerated while parsing (wrong type, unparseable).",
            registry=registry)
        self.incarnation_regressions = Counter(
            f"{NAMESPACE}_incarnation_regressions",
            "Valid documents whose DocumentIncarnation was lower than the previous document's.", registry=registry)
        self.identity_errors = Counter(
            f"{NAMESPACE}_identity_errors", "Failed reads of the VM's compute metadata.", registry=registry)
        self.sink_errors: Recorder = held.counter(
            f"{NAMESPACE}_sink_errors", "Exceptions raised by an output sink.", ["sink"])
        self.bound_hits: Recorder = held.counter(
            f"{NAMESPACE}_bound_hits", "Values from IMDS cut to the sidecar's bounds, once per document: label_length "
            f"(a label value cut at {MAX_LABEL} characters), events_per_document (events past the first "
            f"{MAX_EVENT_SERIES}, this VM's first, without per-event series).", ["bound"])
        self.pauses: Recorder = held.histogram(
            f"{NAMESPACE}_pause_seconds", "Pauses this VM (or this process) lived through, by the type of this VM's "
            "event listed when each began (none: unannounced); from 0.25 s while one is listed, from 1 s otherwise.",
            pause.BUCKETS, ["event_type"])
        self.throttled_pauses: Recorder = held.counter(
            f"{NAMESPACE}_throttled_pauses", "Pauses explained by CPU throttling of this sidecar's cgroup (not counted "
            "as pauses of the VM).")
        registry.register(held)  # once every family is made: the registry reads their names from describe() now
        registry.register(StateCollector(snapshot, clock, lambda bound, n: self.bound_hits.labels(bound).inc(n)))


class StateCollector(Collector):
    """Yields the state families from the latest snapshot; never raises into a scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot], clock: Callable[[], float],
                 bound_hit: Callable[[str, int], None] = lambda bound, count: None) -> None:
        self._snapshot = snapshot
        self._clock = clock
        self._cached: _EventFamilies | None = None
        self._bound_hit = bound_hit
        self._vm: tuple[VmIdentity, str | None, Metric] | None = None  # identity, VM name, vm_info built from them

    def _hit(self, hits: Tally[str]) -> None:
        for bound, count in hits.items():
            if count:
                self._bound_hit(bound, count)

    def _event_families(self, snap: Snapshot) -> _EventFamilies:
        """Built once per document (and VM name): the poll loop replaces ``records`` only when the bytes changed,
        so between changes every scrape reuses these families and computes only the scrape-time countdown."""
        cached = self._cached
        if cached is not None and cached.records is snap.records and cached.vm_name == snap.vm_name:
            return cached
        hits: Tally[str] = Tally()
        built = self._cached = _EventFamilies.build(snap, hits)
        if cached is None or cached.records is not snap.records:  # a new VM name alone: this document, counted
            self._hit(hits)
        return built

    def _vm_info(self, identity: VmIdentity, configured: str | None) -> Metric:
        """Built once per identity read (and VM name), as the event families are per document; its cut labels are
        counted once per identity read."""
        cached = self._vm
        if cached is not None and cached[0] is identity and cached[1] == configured:
            return cached[2]
        hits: Tally[str] = Tally()
        family = GaugeMetricFamily(f"{NAMESPACE}_vm_info", "The VM this exporter runs on, from IMDS compute metadata.",
                                   labels=["vm_name", "vm_id", "vmss_name", "location", "resource_group",
                                           "subscription_id", "vm_size", "zone"])
        family.add_metric([_label(value, hits) for value in (
            vm_name(configured, identity) or "", identity.vm_id, identity.vmss_name, identity.location,
            identity.resource_group, identity.subscription_id, identity.vm_size, identity.zone)], 1.0)
        if cached is None or cached[0] is not identity:
            self._hit(hits)
        self._vm = (identity, configured, family)
        return family

    def describe(self) -> list[Metric]:
        """Every family ``collect`` can yield, without samples: the registry maps names to collectors with it, so
        ``/metrics?name[]=...`` finds each family. Taken from a collector of its own over a snapshot that has every
        family (the snapshot of this one may not exist yet at registration, and its bounds must not be counted)."""
        every = StateCollector(lambda: EVERY_FAMILY, lambda: 0.0)
        return [GaugeMetricFamily(family.name, family.documentation) for family in every.families()]

    def collect(self) -> Iterator[Metric]:
        """The families with a series: an empty family's HELP and TYPE lines are bytes on every scrape too."""
        return (family for family in self.families() if family.samples)

    def families(self) -> Iterator[Metric]:
        snap = self._snapshot()
        now = self._clock()
        yield _gauge(f"{NAMESPACE}_up", "1 when the last poll returned a valid document, else 0.",
                     1.0 if snap.up else 0.0)
        yield _gauge(f"{NAMESPACE}_last_success_timestamp_seconds",
                     "Unix time of the last poll that returned a valid document (0: never).",
                     snap.last_success or 0.0)
        if snap.watching_since is not None:
            yield _gauge(f"{NAMESPACE}_watching_since_timestamp_seconds",
                         "Unix time since which this sidecar has read IMDS with no long gap, continued from its state "
                         "directory after a short restart (see docs/alerting.md); absent before the first read.",
                         snap.watching_since)
        if snap.incarnation is not None:
            yield _gauge(f"{NAMESPACE}_document_incarnation",
                         "DocumentIncarnation of the last valid document.", float(snap.incarnation))
        build = GaugeMetricFamily(f"{NAMESPACE}_build_info", "Version of se-exporter and the api-version it polls.",
                                  labels=["version", "api_version"])
        build.add_metric([__version__, snap.api_version], 1.0)
        yield build
        if snap.identity is not None:
            yield self._vm_info(snap.identity, snap.vm_name)
        families = self._event_families(snap)
        yield from families.static
        yield families.until(now)


@dataclass(frozen=True)
class _EventFamilies:
    """The per-event families of one snapshot; only seconds_until_not_before depends on the scrape's time."""

    records: Mapping[str, EventRecord]
    vm_name: str | None
    static: tuple[Metric, ...]
    not_before: tuple[tuple[dict[str, str], float], ...]  # label set, NotBefore as unix time

    @classmethod
    def build(cls, snap: Snapshot, hits: Tally[str]) -> _EventFamilies:
        pending = GaugeMetricFamily(f"{NAMESPACE}_pending", "Events listed now, by type, status and whether the "
                                    "event lists this VM (a combination none is listed with has no series).",
                                    labels=["event_type", "event_status", "affects_this_vm"])
        info = GaugeMetricFamily(f"{EVENT}_info", "1 per listed event.",
                                 labels=["event_id", "event_type", "event_status", "event_source",
                                         "resource_type", "affects_this_vm"])
        not_before = GaugeMetricFamily(f"{EVENT}_not_before_timestamp_seconds", "NotBefore as unix time.",
                                       labels=["event_id", "event_type"])
        duration = GaugeMetricFamily(f"{EVENT}_duration_seconds",
                                     "DurationInSeconds as reported (-1 = unknown, 0 = no impact).",
                                     labels=["event_id", "event_type"])
        first_seen = GaugeMetricFamily(f"{EVENT}_first_seen_timestamp_seconds",
                                       "When this exporter first saw the event, as unix time.",
                                       labels=["event_id", "event_type"])
        started = GaugeMetricFamily(f"{EVENT}_started_timestamp_seconds",
                                    "When this exporter first saw the event Started, as unix time.",
                                    labels=["event_id", "event_type"])
        counts: Tally[tuple[str, str, str]] = Tally()
        stamps: list[tuple[dict[str, str], float]] = []
        every = list(snap.records.values())
        affects = {record.event.event_id: affects_label(affects_vm(record.event, snap.vm_name)) for record in every}
        for record in every:  # pending counts every event
            counts[(record.event.event_type, record.event.event_status, affects[record.event.event_id])] += 1
        selected = _with_series(every, affects, hits)
        for record in selected:
            event = record.event
            key = [_label(event.event_id, hits), event.event_type]
            info.add_metric([key[0], event.event_type, event.event_status,
                             _label(event.event_source or "unknown", hits),
                             _label(event.resource_type or "unknown", hits),
                             affects[event.event_id]], 1.0)
            first_seen.add_metric(key, record.first_seen)
            if record.started_at is not None:
                started.add_metric(key, record.started_at)
            if event.not_before is not None:
                stamp = event.not_before.timestamp()
                not_before.add_metric(key, stamp)
                stamps.append(({"event_id": key[0], "event_type": event.event_type}, stamp))
            if event.duration_seconds is not None:
                duration.add_metric(key, float(event.duration_seconds))
        for (event_type, status, affected), count in sorted(counts.items()):
            pending.add_metric([event_type, status, affected], float(count))
        families = (pending, info, not_before, duration, first_seen, started, _longest_pauses(selected, affects))
        return cls(snap.records, snap.vm_name, families, tuple(stamps))

    def until(self, now: float) -> Metric:
        family = GaugeMetricFamily(f"{EVENT}_seconds_until_not_before",
                                   "NotBefore minus now, at scrape time; negative once passed.",
                                   labels=["event_id", "event_type"])
        name = family.name
        for labels, stamp in self.not_before:  # add_sample: the label dicts are built once per document
            family.add_sample(name, labels, stamp - now)
        return family


def _longest_pauses(selected: list[EventRecord], affects: Mapping[str, str]) -> Metric:
    """The longest pause felt during each event with series that may be this VM's (a neighbour's is never)."""
    family = GaugeMetricFamily(f"{EVENT}_longest_pause_seconds", "The longest pause this VM felt while the event "
                               "was listed (0: none yet); for events that may be this VM's.",
                               labels=["event_id", "event_type"])
    for record in selected:
        if affects[record.event.event_id] != NEIGHBOURS:  # labels as the other families cut them, counted there
            family.add_metric([_label(record.event.event_id, Tally()), record.event.event_type], record.longest_pause)
    return family


def _with_series(records: list[EventRecord], affects: Mapping[str, str], hits: Tally[str]) -> list[EventRecord]:
    """The events that get per-event series: all, or past MAX_EVENT_SERIES this VM's first, then by EventId
    (deterministic, whatever the document's order), the rest counted in ``hits``."""
    if len(records) <= MAX_EVENT_SERIES:
        return records
    hits["events_per_document"] += len(records) - MAX_EVENT_SERIES
    return sorted(records, key=lambda record: (affects[record.event.event_id] == NEIGHBOURS,
                                               record.event.event_id))[:MAX_EVENT_SERIES]


def _label(value: str, hits: Tally[str]) -> str:
    """``value`` as a label: at most MAX_LABEL characters, a longer one cut and marked (and counted in ``hits``)."""
    if len(value) <= MAX_LABEL:
        return value
    hits["label_length"] += 1
    return value[:MAX_LABEL - len(LABEL_MARK)] + LABEL_MARK


# A snapshot in which every state family is present (each optional field set): what ``describe`` collects, and what
# the reference's generator (scripts/docs.py) and its test start from, so a new gauge shown only while a field is
# set is described and documented once that field is set here.
EVERY_FAMILY = Snapshot(incarnation=0, identity=VmIdentity(), watching_since=0.0)


def _gauge(name: str, documentation: str, value: float) -> Metric:
    return GaugeMetricFamily(name, documentation, value=value)
