"""The fleet's metrics: state families built from the owned partitions on every scrape, plus counters.

As in the sidecar, nothing is ever removed by hand: a VM, an event or a partition that is gone from the
state is gone from the next scrape. Labels are bounded by what the owned partitions hold right now.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from se_exporter.fleet.state import INVALID_REASONS, Fleet
from se_exporter.model import EVENT_STATUSES, EVENT_TYPES

FLEET = "azure_scheduled_fleet"
VM_LABELS = ["vm_id", "vm_name", "vmss_name", "location"]
# What the forwarder's classify() says, plus a partition taken over by another replica and a state blob unread.
ERROR_REASONS = ("timeout", "auth", "connection", "service", "other", "ownership_lost", "state_read")


@dataclass
class PartitionView:
    """What the consumer knows about one owned partition besides its VMs."""

    lag_events: float | None = None
    lag_seconds: float | None = None
    unsaved_since: float | None = None  # when the first event not yet covered by a checkpoint was handled


class FleetMetrics:
    """Counters of the consumer itself; the state families come from ``FleetCollector``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.consumed = Counter(f"{FLEET}_documents_consumed", "Messages received from Event Hubs.",
                                registry=registry)
        self.applied = Counter(f"{FLEET}_documents_applied", "Documents that became a VM's latest, by kind.",
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
        self.claims = Counter(f"{FLEET}_partition_claims", "Partitions this replica started reading.",
                              registry=registry)
        self.releases = Counter(f"{FLEET}_partition_releases", "Partitions this replica stopped reading, by reason.",
                                ["reason"], registry=registry)
        for kind in ("change", "heartbeat"):
            self.applied.labels(kind)
        for reason in ("resend", "older"):
            self.duplicates.labels(reason)
        for reason in INVALID_REASONS:
            self.invalid.labels(reason)
        for outcome in ("ok", "error", "superseded"):
            self.checkpoints.labels(outcome)
        for reason in ERROR_REASONS:
            self.errors.labels(reason)


class FleetCollector(Collector):
    """Yields the fleet families from the current state; never raises into a scrape."""

    def __init__(self, fleet: Fleet, partitions: Callable[[], Mapping[str, PartitionView]],
                 hub_partitions: Callable[[], int | None], clock: Callable[[], float] = time.time) -> None:
        self._fleet = fleet
        self._partitions = partitions
        self._hub_partitions = hub_partitions
        self._clock = clock

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        vms = self._fleet.vms()
        info = GaugeMetricFamily(f"{FLEET}_event_info", "1 per VM and event listed in its latest document.",
                                 labels=[*VM_LABELS, "event_id", "event_type", "event_status", "event_source",
                                         "affects_this_vm"])
        until = GaugeMetricFamily(f"{FLEET}_event_seconds_until_not_before",
                                  "NotBefore minus now, at scrape time, per VM and event; negative once passed.",
                                  labels=["vm_id", "event_id"])
        duration = GaugeMetricFamily(f"{FLEET}_event_duration_seconds",
                                     "DurationInSeconds per VM and event (-1 = unknown, 0 = no impact).",
                                     labels=["vm_id", "event_id"])
        seen = GaugeMetricFamily(f"{FLEET}_vm_last_seen_timestamp_seconds",
                                 "When Event Hubs enqueued the VM's latest document or heartbeat, as unix time.",
                                 labels=VM_LABELS)
        pending: Tally[tuple[str, str]] = Tally({(t, s): 0 for t in EVENT_TYPES for s in EVENT_STATUSES})
        blast: Tally[tuple[str, str]] = Tally()
        for vm in vms:
            identity = [vm.vm_id or vm.key, vm.vm_name, vm.vmss_name, vm.location]
            seen.add_metric(identity, vm.seen_at)
            kinds = set()
            for event in vm.events:
                info.add_metric([*identity, event.event_id, event.event_type, event.event_status,
                                 event.event_source, event.affects_this_vm], 1.0)
                if event.not_before is not None:
                    until.add_metric([identity[0], event.event_id], event.not_before - now)
                if event.duration_seconds is not None:
                    duration.add_metric([identity[0], event.event_id], event.duration_seconds)
                if event.counts_for_vm:
                    kinds.add((event.event_type, event.event_status))
                    blast[(event.event_id, event.event_type)] += 1
            pending.update(kinds)
        yield GaugeMetricFamily(f"{FLEET}_vms", "VMs known in the partitions this replica owns.", value=len(vms))
        pending_family = GaugeMetricFamily(f"{FLEET}_pending_vms",
                                           "VMs with a listed event that concerns them, by type and status.",
                                           labels=["event_type", "event_status"])
        for (event_type, status), count in sorted(pending.items()):
            pending_family.add_metric([event_type, status], count)
        blast_family = GaugeMetricFamily(f"{FLEET}_event_vms", "VMs one event concerns: its blast radius.",
                                         labels=["event_id", "event_type"])
        for (event_id, event_type), count in sorted(blast.items()):
            blast_family.add_metric([event_id, event_type], count)
        yield from (pending_family, blast_family, info, until, duration, seen)
        yield from self._consumer(now)

    def _consumer(self, now: float) -> Iterator[Metric]:
        partitions = self._partitions()
        yield GaugeMetricFamily(f"{FLEET}_owned_partitions", "Partitions this replica reads right now.",
                                value=len(partitions))
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
