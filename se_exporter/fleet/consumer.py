"""``se-exporter fleet``: the official async consumer client with the Blob checkpoint store, and its wiring.

One asyncio loop runs the SDK's receive, a checkpoint task, an expiry task and a watchdog; the HTTP
server (the sidecar's bounded ``serve``) answers scrapes from its own threads, reading the state under
``Fleet``'s lock.

Per partition the SDK calls, in order: ``on_initialize`` (the stored state is loaded before a single
event is read: until it is, the partition is not read at all; see ``persistence``), ``on_batch`` for events, and
``on_close`` (on shutdown a last state and checkpoint are written before the SDK releases ownership;
when ownership is lost, the partition's VMs are dropped at once, so that the sum over replicas counts
every VM once).

Facts about azure-eventhub (5.15) this module is built around: with a checkpoint store the SDK opens
every partition as an exclusive receiver (owner level 0), so a replica taking a partition over closes
the previous owner's link (``amqp:link:stolen``, reported to ``on_error``, not fatal); duplicates
happen around hand-overs and are dropped by sequence.

What the service knows of a partition is one ``Partition``, made on claim and dropped whole on close; the
state store is passed in (``statestore.StateStore``), so the service is tested against ``MemoryStateStore``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from azure.eventhub import CloseReason, EventData
from azure.eventhub.aio import PartitionContext
from azure.eventhub.amqp import AmqpMessageBodyType
from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

from se_exporter.fleet.collector import FleetMetrics, PartitionView
from se_exporter.fleet.message import BOUND_NAMES, InvalidMessage, VmState, read_message
from se_exporter.fleet.partition import Partition
from se_exporter.fleet.persistence import Keeper
from se_exporter.fleet.picture import Fleet
from se_exporter.fleet.report import Report
from se_exporter.fleet.settings import FleetSettings
from se_exporter.fleet.statestore import StateStore, state_blob_name
from se_exporter.infra.azure.clients import classify, describe
from se_exporter.infra.logs import fields

__all__ = ["BATCH_SIZE", "EMPTY_BATCH_AFTER", "ObservedCheckpointStore", "Service"]
log = logging.getLogger("se_exporter.fleet")
BATCH_SIZE = 300  # the SDK's default prefetch: one batch drains what one link fetches
EMPTY_BATCH_AFTER = 1.0  # seconds without events before the SDK says so: the partition is caught up


class Service:
    """The SDK's callbacks, the periodic tasks, and what /healthz and /readyz report."""

    def __init__(self, settings: FleetSettings, fleet: Fleet, metrics: FleetMetrics, store: StateStore,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        self._settings = settings
        self._fleet = fleet
        self._metrics = metrics
        self._report = Report(metrics)
        self._clock = clock
        self.keeper = Keeper(store, fleet, self._report, clock, settings.state_format, sleep)
        self.partitions: dict[str, Partition] = {}
        self.restoring: set[str] = set()
        self.alive = time.monotonic()
        self.balanced = False
        self.hub_partitions: int | None = None
        self.storage_problem: str | None = None  # why the storage account is not reachable, while it is not

    @property
    def views(self) -> dict[str, PartitionView]:
        """What /metrics shows of each owned partition besides its VMs."""
        return {partition_id: partition.view for partition_id, partition in list(self.partitions.items())}

    # ------------------------------------------------------------------ SDK callbacks

    async def on_initialize(self, context: PartitionContext) -> None:
        partition_id = context.partition_id
        self.keeper.store.name(partition_id, state_blob_name(
            context.fully_qualified_namespace, context.eventhub_name, context.consumer_group, partition_id))
        self.restoring.add(partition_id)
        try:
            restored = await self.keeper.restore(partition_id)
        finally:
            self.restoring.discard(partition_id)
        state = self._fleet.claim(partition_id, restored.state)
        self.partitions[partition_id] = Partition(
            context, state, PartitionView(newer_format=restored.newer_format is not None),
            saved=state.position, saved_format=restored.format)
        self._metrics.claims.inc()
        log.info("partition %s claimed: %d VMs restored", partition_id, len(state.vms),
                 extra=fields(partition_id=partition_id, state_sequence_number=state.position))

    async def on_batch(self, context: PartitionContext, events: list[EventData]) -> None:
        partition = self.partitions.get(context.partition_id)
        if partition is None:
            return
        view = partition.view
        if not events:  # EMPTY_BATCH_AFTER passed without an event: nothing waits in this partition
            partition.caught_up = True
            view.lag_events, view.lag_seconds = 0.0, 0.0
            return
        self._check_restored(context)
        outcomes: Tally[str] = Tally()
        for event in events:
            try:
                outcome = self._handle(partition, event, outcomes)
            except Exception as error:  # never out of the batch handler: the SDK would close the partition
                self._fleet.handled(partition.partition_id, event.sequence_number or 0)
                self._metrics.invalid.labels("internal_error").inc()
                self._report.once("invalid:internal_error", logging.ERROR, "message skipped after an unexpected "
                                  "error (partition %s, sequence number %s): %s", partition.partition_id,
                                  event.sequence_number, describe(error),
                                  extra=fields(reason="internal_error", partition_id=partition.partition_id))
                outcome = "invalid"
            outcomes[outcome] += 1
        self._count(len(events), outcomes)
        last = events[-1]
        partition.last_event = last
        if view.unsaved_since is None:
            view.unsaved_since = self._clock()
        self._lag(context, partition, last)

    def _count(self, received: int, outcomes: Tally[str]) -> None:
        """Counters once per batch, not per event: each increment takes a lock."""
        self._metrics.consumed.inc(received)
        if outcomes["change"] or outcomes["heartbeat"]:
            self._metrics.last_applied.set(self._clock())
        for outcome, count in outcomes.items():
            if outcome in ("change", "heartbeat"):
                self._metrics.applied.labels(outcome).inc(count)
            elif outcome in ("resend", "older"):
                self._metrics.duplicates.labels(outcome).inc(count)
            elif outcome == "replayed":
                self._metrics.replayed.inc(count)
            elif outcome in BOUND_NAMES:
                self._report.bound_hit(outcome, count)

    def _check_restored(self, context: PartitionContext) -> None:
        """A restored position past the partition's newest event is damage (see ``Fleet.check_restored``)."""
        properties = context.last_enqueued_event_properties
        newest = properties.get("sequence_number") if properties else None
        if newest is None:
            return
        bogus = self._fleet.check_restored(context.partition_id, int(newest))
        if bogus is not None:
            self._metrics.state_damaged.labels("position").inc()
            log.error("partition %s: the stored fleet state claims sequence number %d, past the partition's newest "
                      "event %d; its position is ignored and every event from the checkpoint on is applied",
                      context.partition_id, bogus, int(newest), extra=fields(partition_id=context.partition_id))

    def _handle(self, partition: Partition, event: EventData, outcomes: Tally[str]) -> str:
        """Read, check and fold one event; what became of it (the bounds its document reached, added to
        ``outcomes``, are counted with the batch's other outcomes)."""
        partition_id, sequence_number = partition.partition_id, event.sequence_number
        if sequence_number is None:
            return "unnumbered"
        enqueued = event.enqueued_time.timestamp() if event.enqueued_time else self._clock()
        partition.handled_at = enqueued
        if self._fleet.already_applied(partition_id, sequence_number):
            return "replayed"
        try:
            message = read_message(_body(event), event.properties or {}, event.message_id, event.partition_key,
                                   enqueued, self._settings.max_message_bytes)
        except InvalidMessage as error:
            self._fleet.handled(partition_id, sequence_number)
            self._metrics.invalid.labels(error.reason).inc()
            self._report.once(f"invalid:{error.reason}", logging.WARNING,
                              "invalid message skipped (partition %s, sequence number %d): %s", partition_id,
                              sequence_number, error, extra=fields(reason=error.reason, partition_id=partition_id,
                                                                   sequence_number=sequence_number))
            return "invalid"
        outcome = self._fleet.apply(partition_id, message, sequence_number)
        if message.unknown_properties:
            self._metrics.warnings.labels("unknown_property").inc()
            self._report.once("unknown_property", logging.INFO,  # one key: names are the sender's to choose
                              "message with properties this version does not know, applied: %s",
                              ", ".join(message.unknown_properties[:10]))
        if message.document_warnings:
            self._metrics.warnings.labels("document").inc(message.document_warnings)
        if outcome == "applied":  # a bound counts once, for the document kept: not for an older duplicate dropped
            outcomes.update(message.bounds)
            return "heartbeat" if message.heartbeat else "change"
        return outcome

    def _lag(self, context: PartitionContext, partition: Partition, last: EventData) -> None:
        properties, view = context.last_enqueued_event_properties, partition.view
        if not properties or properties.get("sequence_number") is None or last.sequence_number is None:
            return
        view.lag_events = float(max(0, int(properties["sequence_number"]) - last.sequence_number))
        newest, handled = properties.get("enqueued_time"), last.enqueued_time
        if newest is not None and handled is not None:
            view.lag_seconds = max(0.0, (newest - handled).total_seconds()) if view.lag_events else 0.0
        partition.caught_up = view.lag_events == 0

    async def on_close(self, context: PartitionContext, reason: CloseReason) -> None:
        partition_id = context.partition_id
        partition = self.partitions.get(partition_id)
        if reason == CloseReason.SHUTDOWN and partition is not None:
            await self.keeper.save(partition)  # before the SDK releases ownership: the next owner starts from here
        dropped = self._fleet.release(partition_id)
        self.partitions.pop(partition_id, None)
        self.keeper.store.forget(partition_id)
        name = "shutdown" if reason == CloseReason.SHUTDOWN else "ownership_lost"
        self._metrics.releases.labels(name).inc()
        log.info("partition %s released (%s): %d VMs dropped from this replica", partition_id, name, dropped,
                 extra=fields(partition_id=partition_id, reason=name))

    async def on_error(self, context: PartitionContext | None, error: Exception) -> None:
        """Never fatal: the SDK retries and rebalances by itself; counted, and logged once a minute per kind."""
        text = str(error)
        reason = "ownership_lost" if "stolen" in text or type(error).__name__ == "OwnershipLostError" \
            else classify(error)
        self._metrics.errors.labels(reason).inc()
        where = f"partition {context.partition_id}" if context is not None else "load balancing"
        self._report.once(f"error:{reason}:{where}", logging.INFO if reason == "ownership_lost" else logging.WARNING,
                          "Event Hubs client error (%s, %s): %s", where, reason, describe(error))

    # ------------------------------------------------------------------ periodic work

    async def save(self, partition_id: str) -> None:
        """Write the partition's state, then checkpoint the last event it covers (see ``Keeper.save``)."""
        partition = self.partitions.get(partition_id)
        if partition is not None:
            await self.keeper.save(partition)

    async def checkpoints(self, stop: asyncio.Event) -> None:
        while not await _stopped(stop, self._settings.checkpoint_interval):
            for partition in list(self.partitions.values()):
                await self.keeper.save(partition)

    async def expiry(self, stop: asyncio.Event) -> None:
        every = min(30.0, max(0.2, self._settings.vm_expiry / 4))
        while not await _stopped(stop, every):
            self.expire_now()

    def expire_now(self) -> list[VmState]:
        """Silence is measured on each partition's own timeline: while a partition is being caught up after an
        outage, its VMs are old only relative to the events already read, not to the wall clock."""
        now = self._clock()
        cutoffs = {}
        for partition_id, partition in list(self.partitions.items()):
            reference = now if partition.caught_up else partition.handled_at
            if reference is not None:
                cutoffs[partition_id] = reference - self._settings.vm_expiry
        gone = self._fleet.expire(cutoffs)
        if gone:
            self._metrics.expirations.inc(len(gone))
            names = ", ".join(vm.vm_name or vm.key for vm in gone[:20]) + (" ..." if len(gone) > 20 else "")
            log.warning("%d VMs expired: not heard from for %gs: %s", len(gone), self._settings.vm_expiry, names,
                        extra=fields(expired=len(gone)))
        return gone

    async def watchdog(self, stop: asyncio.Event) -> None:
        while not await _stopped(stop, 1.0):
            self.alive = time.monotonic()

    # ------------------------------------------------------------------ what the endpoints say

    @property
    def healthy(self) -> bool:
        return time.monotonic() - self.alive < 15.0

    @property
    def ready(self) -> bool:
        return self.balanced and not self.restoring


class ObservedCheckpointStore(BlobCheckpointStore):
    """The official Blob checkpoint store; it also tells /readyz that a load-balancing round went through."""

    on_listed: Callable[[], None] = staticmethod(lambda: None)

    async def list_ownership(self, *args: Any, **kwargs: Any) -> Iterable[dict[str, Any]]:
        result = await super().list_ownership(*args, **kwargs)
        self.on_listed()
        return result


def _body(event: EventData) -> bytes:
    if event.body_type != AmqpMessageBodyType.DATA:
        raise InvalidMessage("not_envelope", f"the AMQP body is {event.body_type}, not data")
    body = event.body
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    return b"".join(body)  # type: ignore[arg-type]  # a data body is bytes or an iterable of bytes


async def _stopped(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
