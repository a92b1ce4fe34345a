"""The fleet's registry side: the consumer's counters and its per-partition gauges, written by prometheus-client
(the per-VM families are ``scrape.FleetExposition``'s; ``scrape.scrape`` writes both)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from se_exporter.core.model import EVENT_TYPES
from se_exporter.fleet.message import BOUND_NAMES, INVALID_REASONS

FLEET = "azure_scheduled_fleet"
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
    unsaved_since: float | None = None  # when (monotonic) the first event not yet checkpointed was handled
    newer_format: bool = False  # its state blob is a newer release's: neither state nor checkpoint written


class FleetMetrics:
    """Counters of the consumer itself.

    What every batch counts (messages received, documents applied by kind, when) is queued (``batch``) and added
    to the counters when the registry is collected or ``flush`` is called (the consumer's watchdog, every second):
    one append per batch instead of three locked counter updates, at one heartbeat a batch a few per cent of a
    replica's CPU. A scrape reads them exact, whole or filtered by name (``_Flushed`` collects them after a flush);
    the queue holds at most a second's batches."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._batches: deque[tuple[int, int, int, float | None]] = deque()  # thread-safe append and popleft
        self._flushing = threading.Lock()  # one flush at a time: the last-applied time never moves back
        self.consumed = Counter(f"{FLEET}_documents_consumed", "Messages received from Event Hubs.", registry=None)
        self.applied = Counter(f"{FLEET}_documents_applied", "Documents that became a VM's latest, by kind (retired: a "
                               "sidecar's message that retired the VM known by its name).",
                               ["kind"], registry=None)
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
                                  registry=None)
        registry.register(_Flushed(self, (self.consumed, self.applied, self.last_applied)))
        for counter, values in ((self.applied, ("change", "heartbeat", "retired")),
                                (self.duplicates, ("resend", "older")),
                                (self.invalid, (*INVALID_REASONS, "internal_error")),
                                (self.state_damaged, DAMAGE_REASONS), (self.bound_hits, BOUND_NAMES),
                                (self.checkpoints, ("ok", "error", "superseded")),
                                (self.state_bytes, ("base", "delta")), (self.errors, ERROR_REASONS),
                                (self.loss_signs, LOSS_SIGNS)):
            for value in values:
                counter.labels(value)  # every series from the start, at 0
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
            self.consumed.inc(received)
            self.applied.labels("change").inc(changes)
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
                 hub_partitions: Callable[[], int | None], clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: the monotonic clock ``PartitionView.unsaved_since`` is read from (the checkpoint age)."""
        self._partitions = partitions
        self._hub_partitions = hub_partitions
        self._clock = clock

    def describe(self) -> list[Metric]:
        """Every family ``collect`` can yield (without samples), so the registry maps each name to this collector."""
        return [GaugeMetricFamily(family.name, family.documentation)
                for family in PartitionCollector(lambda: {}, lambda: 0).collect()]

    def collect(self) -> Iterator[Metric]:
        now, partitions = self._clock(), self._partitions()
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


class _Flushed(Collector):
    """The counters every batch feeds, collected once the queued batches' counts are added to them: their names are
    this collector's, so a scrape filtered by name (``registry.restricted_registry``) flushes them too."""

    def __init__(self, metrics: FleetMetrics, counters: tuple[Counter | Gauge, ...]) -> None:
        self._metrics, self._counters = metrics, counters

    def describe(self) -> list[Metric]:
        return [family for counter in self._counters for family in counter.describe()]

    def collect(self) -> Iterator[Metric]:
        self._metrics.flush()
        for counter in self._counters:
            yield from counter.collect()
