"""The fleet's registry side: the consumer's counters and its per-partition gauges, written by prometheus-client
(the per-VM families are ``scrape.FleetExposition``'s; ``scrape.scrape`` writes both)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from se_exporter.core.model import EVENT_TYPES
from se_exporter.fleet.message import BOUND_NAMES, INVALID_REASONS

FLEET = "azure_scheduled_fleet"
# What the forwarder's classify() says, plus a partition taken over by another replica and a state blob unread.
ERROR_REASONS = ("timeout", "auth", "connection", "service", "other", "ownership_lost", "state_read")
LOSS_SIGNS = ("link_stolen",)  # that another replica took an owned partition: its link stolen, as the SDK reports it
# Why a state blob (or part of it) was not used: not gzip'd JSON, JSON of another shape, an older or unknown format,
# rows out of type or range, a position past the partition's newest event.
DAMAGE_REASONS = ("unreadable", "wrong_shape", "format", "row", "position")
PLATFORM_STATUSES = ("Scheduled", "Started", "Completed", "Canceled")  # the platform copy's; IMDS shows the first two
LAG_BUCKETS = (-300.0, -60.0, -10.0, 0.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, float("inf"))
F = TypeVar("F", Counter, Gauge, Histogram)  # a family as prometheus-client makes it


@dataclass
class PartitionView:
    """What the consumer knows about one owned partition besides its VMs."""

    lag_events: float | None = None
    lag_seconds: float | None = None
    unsaved_since: float | None = None  # when (monotonic) the first event not yet checkpointed was handled
    newer_format: bool = False  # its state blob is a newer release's: neither state nor checkpoint written


class FleetMetrics:
    """Counters of the consumer itself.

    What every batch counts (messages received, documents applied by kind, when) is queued (``batch``) and added to the
    counters when a scrape collects them (``_Flushed``: exact, whole or filtered by name) or ``flush`` is called (the
    consumer's watchdog, every second: the queue holds at most a second's batches): one append per batch instead of
    three locked counter updates, at one heartbeat a batch a few per cent of a replica's CPU."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._batches: deque[tuple[int, int, int, float | None]] = deque()  # thread-safe append and popleft
        self._flushing = threading.Lock()  # one flush at a time: the last-applied time never moves back
        self.consumed = _family(None, Counter, "documents_consumed", "Messages received from Event Hubs.")
        self.applied = _family(None, Counter, "documents_applied", "Documents that became a VM's latest, by kind "
                               "(retired: a sidecar's message that retired the VM known by its name).", ["kind"],
                               ("change", "heartbeat", "retired"))
        self.duplicates = _family(registry, Counter, "duplicate_documents", "Documents dropped: a resend of the "
                                  "applied one, or older than it.", ["reason"], ("resend", "older"))
        self.replayed = _family(registry, Counter, "replayed_documents",
                                "Documents read again after a restore that the restored state already held.")
        self.invalid = _family(registry, Counter, "invalid_messages", "Messages that are not forwarded documents, by "
                               "reason.", ["reason"], (*INVALID_REASONS, "internal_error"))
        self.warnings = _family(registry, Counter, "message_warnings",
                                "Tolerated oddities of applied messages (unknown properties, document fields).",
                                ["reason"])
        self.expirations = _family(registry, Counter, "vm_expirations", "VMs forgotten after --vm-expiry of silence.")
        self.errors = _family(registry, Counter, "consumer_errors", "Errors the Event Hubs client reported, by "
                              "reason.", ["reason"], ERROR_REASONS)
        self.checkpoints = _family(registry, Counter, "checkpoints", "Writes of a partition's state and checkpoint, "
                                   "by outcome.", ["outcome"], ("ok", "error", "superseded"))
        self.state_bytes = _family(registry, Counter, "state_bytes_written", "Bytes of partition states uploaded, by "
                                   "kind: a whole state (base) or a delta.", ["kind"], ("base", "delta"))
        self.claims = _family(registry, Counter, "partition_claims", "Partitions this replica started reading.")
        self.releases = _family(registry, Counter, "partition_releases",
                                "Partitions this replica stopped reading, by reason.", ["reason"])
        self.loss_signs = _family(registry, Counter, "partition_loss_signs", "Signs that an owned partition may have "
                                  "passed to another replica, each hiding its VMs until it is ours again or closed, "
                                  "by sign.", ["sign"], LOSS_SIGNS)
        self.shown_partitions = _family(registry, Gauge, "shown_partitions", "Owned partitions whose VMs this "
                                        "replica shows: not one not read yet, nor one whose link was stolen.")
        self.state_damaged = _family(registry, Counter, "state_damaged", "State blobs, or rows of them, not used "
                                     "because they are damaged, by reason.", ["reason"], DAMAGE_REASONS)
        self.bound_hits = _family(registry, Counter, "bound_hits", "Times a bound on what the fleet keeps was "
                                  "reached, by bound.", ["bound"], BOUND_NAMES)
        self.last_applied = _family(None, Gauge, "last_applied_timestamp_seconds",
                                    "When this replica last applied a document, as unix time (0: not yet).")
        registry.register(_Flushed(self, (self.consumed, self.applied, self.last_applied)))
        self._platform(registry)

    def batch(self, received: int, changes: int, heartbeats: int, applied_at: float | None) -> None:
        """A batch's counts (from the consumer's loop); ``applied_at`` when it applied a document."""
        self._batches.append((received, changes, heartbeats, applied_at))

    def flush(self) -> None:
        """Add the queued batches' counts to the counters (from any thread: each batch is taken once, in order)."""
        with self._flushing:
            received = changes = heartbeats = 0
            applied_at = None
            while self._batches:  # only a flush takes from it, one at a time: not emptied meanwhile
                count, changed, beats, at = self._batches.popleft()
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
        self.platform_events = _family(registry, Counter, "platform_events", "Status changes of scheduled events the "
                                       "platform announced (Event Grid), each EventId and status once.",
                                       ["event_type", "event_status"])
        self.platform_applied = _family(registry, Counter, "platform_messages_applied", "Platform messages (Event "
                                        "Grid's) folded into a platform picture.")
        self.platform_last_applied = _family(registry, Gauge, "platform_last_applied_timestamp_seconds", "When this "
                                             "replica last applied a platform message, as unix time (0: not yet).")
        self.platform_duplicates = _family(registry, Counter, "platform_duplicates", "Platform messages Event Grid "
                                           "delivered again (the same id, on any partition), beyond the first: "
                                           "counted by the EventId's home replica once it has read that partition's "
                                           "picture.")
        self.missed_events = _family(registry, Counter, "missed_events", "Affected VMs of platform events whose "
                                     "sidecar did not list them, each VM and EventId once, by why.",
                                     ["event_type", "reason"])
        self.unannounced_events = _family(registry, Counter, "unannounced_events", "EventIds sidecars listed that the "
                                          "platform never announced (only in scopes that publish), each once.",
                                          ["event_type"])
        self.announcement_lag = _family(registry, Histogram, "announcement_lag_seconds", "When a VM first listed a "
                                        "platform event minus the eventTime of its first status (negative: the VM "
                                        "knew first).", buckets=LAG_BUCKETS)
        self.impact_seconds = _family(registry, Counter, "impact_seconds", "Per affected VM, Started to Completed of "
                                      "platform events by the platform's times.",
                                      ["event_type", "scope_name", "location"])
        for event_type in EVENT_TYPES:
            for status in PLATFORM_STATUSES:
                self.platform_events.labels(event_type, status)


def _family(registry: CollectorRegistry | None, kind: type[F], name: str, documentation: str,
            labels: Sequence[str] = (), values: Iterable[str] = (), **options: Any) -> F:
    """``azure_scheduled_fleet_<name>`` on ``registry`` (None: collected by ``_Flushed``), with the series of each
    of ``values`` (a one-label family's) from the start, at 0."""
    family = kind(f"{FLEET}_{name}", documentation, labels, registry=registry, **options)
    for value in values:
        family.labels(value)
    return family


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
