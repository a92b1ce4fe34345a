"""``se-exporter fleet``: the official async consumer client with the Blob checkpoint store, and its wiring.

One asyncio loop runs the SDK's receive and the periodic tasks; scrapes are answered from the HTTP server's threads
under ``Fleet``'s lock. Per partition the SDK calls ``on_initialize`` (the stored state first: ``persistence``),
``on_batch`` and ``on_close``; a partition is shown from its first batch and hidden when ``on_error`` reports its
link stolen (docs/operations.md, "The fleet's replicas"). The state store is passed in: tested against an in-memory one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any, Protocol

from azure.eventhub import CloseReason, EventData
from azure.eventhub.aio import EventHubConsumerClient, PartitionContext
from azure.eventhub.amqp import AmqpMessageBodyType
from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

from se_exporter.fleet import received
from se_exporter.fleet.collector import FleetMetrics, PartitionView
from se_exporter.fleet.message import BOUND_NAMES, InvalidMessage, VmState, read_message
from se_exporter.fleet.persistence import Partition, PartitionPersistence
from se_exporter.fleet.report import Report
from se_exporter.fleet.settings import FleetSettings
from se_exporter.fleet.statestore import StateStore, state_blob_name
from se_exporter.fleet.vms import Fleet
from se_exporter.infra.azure.clients import classify, describe
from se_exporter.infra.logs import fields

__all__ = ["BATCH_SIZE", "EMPTY_BATCH_AFTER", "NEWEST_TIMEOUT", "ObservedCheckpointStore", "Service", "newest_event"]
log = logging.getLogger("se_exporter.fleet")
BATCH_SIZE = 300  # the SDK's default prefetch: one batch drains what one link fetches
EMPTY_BATCH_AFTER = 1.0  # seconds without events before the SDK says so: the partition is caught up
NEWEST_TIMEOUT = 10.0  # seconds for the hub to say a partition's newest event; unanswered, the clock is not trusted


class FirstReader(Protocol):
    """What reads each message before ``read_message`` does, per partition: the platform stream's reader."""

    async def claim(self, context: PartitionContext) -> None:
        """The partition is claimed: its own state is restored before a single event is read."""

    def handle(self, partition_id: str, sequence_number: int, body: bytes, enqueued: float) -> str | None:
        """What became of the message (an outcome ``_count`` may count) when it was its kind; None when it is not
        (then a sidecar's document); ``InvalidMessage`` when it is its kind but unreadable."""

    def release(self, partition_id: str) -> None:
        """The partition is no longer this replica's."""


class Service:
    """The SDK's callbacks, the periodic tasks, and what /healthz and /readyz report."""

    def __init__(self, settings: FleetSettings, fleet: Fleet, metrics: FleetMetrics, store: StateStore,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._fleet = fleet
        self._metrics = metrics
        metrics.shown_partitions.set_function(lambda: len(fleet.shown()))  # main's sums every hub read's instead
        self._report = Report(metrics)
        self._clock = clock  # the wall clock: compared with the hub's enqueue times and the stored rows' times
        self._monotonic = monotonic  # what a wait within this process is measured on
        self.keeper = PartitionPersistence(store, fleet, self._report, clock, sleep, settings.heartbeat_write_interval,
                                           monotonic)
        self.partitions: dict[str, Partition] = {}
        self.restoring: set[str] = set()
        self.alive = monotonic()
        self.balanced = False
        self.hub_partitions: int | None = None
        self.storage_problem: str | None = None  # why the storage account is not reachable, while it is not
        self.doubted: set[str] = set()  # held partitions whose link was stolen: hidden until closed
        self.newest: Callable[[str], Awaitable[int | None]] = _unknown  # the hub asked (``newest_event``)
        self.first_reader: FirstReader | None = None  # the platform stream's reader (fleet/platform/service.py)
        self._outcomes = {  # the rarer outcomes' counters (a VM known by name retired by its sidecar's message)
            "resend": metrics.duplicates.labels("resend"), "older": metrics.duplicates.labels("older"),
            "replayed": metrics.replayed, "retired": metrics.applied.labels("retired")}

    @property
    def views(self) -> dict[str, PartitionView]:
        """What /metrics shows of each owned partition besides its VMs (its lag as of its last batch)."""
        return {partition_id: self._lagged(partition) for partition_id, partition in list(self.partitions.items())}

    # ------------------------------------------------------------------ SDK callbacks

    async def on_initialize(self, context: PartitionContext) -> None:
        partition_id = context.partition_id
        self.keeper.store.name(partition_id, state_blob_name(
            context.fully_qualified_namespace, context.eventhub_name, context.consumer_group, partition_id))
        self.restoring.add(partition_id)
        try:
            restored = await self.keeper.restore(partition_id)
            if self.first_reader is not None:
                await self.first_reader.claim(context)
        finally:
            self.restoring.discard(partition_id)
        self.doubted.discard(partition_id)
        state = self._fleet.claim(partition_id, restored.state, shown=False)  # shown once its link is attached
        self.partitions[partition_id] = Partition(
            context, state, PartitionView(newer_format=restored.newer_format is not None), saved=state.position)
        self._metrics.claims.inc()
        log.info("partition %s claimed: %d VMs restored", partition_id, len(state.vms),
                 extra=fields(partition_id=partition_id, state_sequence_number=state.position))

    async def on_batch(self, context: PartitionContext, events: list[EventData]) -> None:
        partition = self.partitions.get(context.partition_id)
        if partition is None:
            return
        view = partition.view
        if not events:  # EMPTY_BATCH_AFTER passed without an event handed over (the link may be down: see expiry)
            self._show(partition.partition_id)
            partition.lag_from = None
            view.lag_events, view.lag_seconds = 0.0, 0.0
            return
        if not self._fleet.is_shown(partition.partition_id):  # most batches: shown already, nothing to take
            self._show(partition.partition_id)
        if not partition.restored_checked:
            partition.restored_checked = self._check_restored(context)
        outcomes: dict[str, int] = {}  # a plain dict: a Counter's construction and misses cost more, per batch
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
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        self._count(len(events), outcomes)
        partition.last_event = partition.lag_from = events[-1]  # the lag is worked out when asked (``_lagged``)
        if view.unsaved_since is None:
            view.unsaved_since = self._monotonic()

    def _count(self, received: int, outcomes: dict[str, int]) -> None:
        """Counters once per batch, not per event (each increment and ``labels`` call takes a lock): what every batch
        counts is queued (``FleetMetrics.batch``), the rarer outcomes counted at once."""
        changes, heartbeats = outcomes.get("change", 0), outcomes.get("heartbeat", 0)
        self._metrics.batch(received, changes, heartbeats, self._clock() if changes or heartbeats else None)
        for outcome, count in outcomes.items():
            counter = self._outcomes.get(outcome)
            if counter is not None:
                counter.inc(count)
            elif outcome in BOUND_NAMES:
                self._report.bound_hit(outcome, count)
            elif outcome == "platform":  # the platform stream's (fleet/platform/service.py)
                self._metrics.platform_applied.inc(count)
                self._metrics.platform_last_applied.set(self._clock())

    def _check_restored(self, context: PartitionContext) -> bool:
        """Whether ``Fleet.check_restored`` could be asked (then later batches skip it: the newest only grows)."""
        properties = context.last_enqueued_event_properties
        newest = properties.get("sequence_number") if properties else None
        if newest is None:
            return False
        bogus = self._fleet.check_restored(context.partition_id, int(newest))
        if bogus is not None:
            self._metrics.state_damaged.labels("position").inc()
            log.error("partition %s: the stored fleet state claims sequence number %d, past the partition's newest "
                      "event %d; its position is ignored and every event from the checkpoint on is applied",
                      context.partition_id, bogus, int(newest), extra=fields(partition_id=context.partition_id))
        return True

    def _handle(self, partition: Partition, event: EventData, outcomes: dict[str, int]) -> str:
        """Read, check and fold one event; what became of it (its document's bounds reached go to ``outcomes``)."""
        delivered = received.delivery(event)
        partition_id, sequence_number = partition.partition_id, delivered.sequence_number
        if sequence_number is None:
            return "unnumbered"
        enqueued = delivered.enqueued_at or self._clock()
        partition.handled_at = enqueued
        if self._fleet.already_applied(partition_id, sequence_number):
            return "replayed"
        try:
            body = _body(delivered)
            first = self.first_reader.handle(partition_id, sequence_number, body, enqueued) \
                if self.first_reader is not None else None
            if first is not None:  # the platform's (or replayed, or skipped): not a sidecar's document
                self._fleet.handled(partition_id, sequence_number)
                return first
            message = read_message(body, delivered.properties, delivered.message_id, delivered.partition_key,
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
            for bound in message.bounds:
                outcomes[bound] = outcomes.get(bound, 0) + 1
            return "heartbeat" if message.heartbeat else "change"
        return outcome

    def _lagged(self, partition: Partition) -> PartitionView:
        """The partition's view with its lag as of its last batch (``partition.lag_from``: the newest event the SDK
        delivered with it), or as the last empty batch left it; worked out when a scrape asks, changing nothing."""
        view, last = partition.view, partition.lag_from
        if last is None or (newest := received.newest(last)) is None or (sequence := last.sequence_number) is None:
            return view
        events, seconds = float(max(0, newest[0] - sequence)), view.lag_seconds
        if newest[1] is not None and (enqueued := received.enqueued_at(last)) is not None:
            seconds = max(0.0, newest[1] - enqueued) if events else 0.0
        return replace(view, lag_events=events, lag_seconds=seconds)

    async def on_close(self, context: PartitionContext, reason: CloseReason) -> None:
        partition_id = context.partition_id
        partition = self.partitions.get(partition_id)
        if reason == CloseReason.SHUTDOWN and partition is not None:
            await self.keeper.save(partition)  # before the SDK releases ownership: the next owner starts from here
        dropped = self._fleet.release(partition_id)
        if self.first_reader is not None:
            self.first_reader.release(partition_id)
        self.partitions.pop(partition_id, None)
        self.doubted.discard(partition_id)
        self.keeper.store.forget(partition_id)
        name = "shutdown" if reason == CloseReason.SHUTDOWN else "ownership_lost"
        self._metrics.releases.labels(name).inc()
        log.info("partition %s released (%s): %d VMs dropped from this replica", partition_id, name, dropped,
                 extra=fields(partition_id=partition_id, reason=name))

    async def on_error(self, context: PartitionContext | None, error: Exception) -> None:
        """Never fatal: the SDK retries and rebalances by itself; counted, and logged once a minute per kind."""
        reason = "ownership_lost" if "stolen" in str(error) or type(error).__name__ == "OwnershipLostError" \
            else classify(error)
        self._metrics.errors.labels(reason).inc()
        if reason == "ownership_lost" and context is not None:
            self._hide(context.partition_id, "link_stolen")
        where = f"partition {context.partition_id}" if context is not None else "load balancing"
        self._report.once(f"error:{reason}:{where}", logging.INFO if reason == "ownership_lost" else logging.WARNING,
                          "Event Hubs client error (%s, %s): %s", where, reason, describe(error))

    def on_listed(self) -> None:
        """A load-balancing round read the ownership records: the replica is ready (/readyz)."""
        self.balanced = True

    def _show(self, partition_id: str) -> None:
        if partition_id not in self.doubted and self._fleet.show(partition_id):
            log.info("partition %s shown: its receiver holds it", partition_id,
                     extra=fields(partition_id=partition_id))

    def _hide(self, partition_id: str, sign: str) -> None:
        if partition_id not in self.partitions or partition_id in self.doubted:  # counted once
            return
        self.doubted.add(partition_id)
        self._metrics.loss_signs.labels(sign).inc()
        if self._fleet.show(partition_id, shown=False):
            log.info("partition %s hidden (%s): another replica may show it now; still held until closed",
                     partition_id, sign, extra=fields(partition_id=partition_id, reason=sign))

    # ------------------------------------------------------------------ periodic work

    async def checkpoints(self, stop: asyncio.Event) -> None:
        while not await _stopped(stop, self._settings.checkpoint_interval):
            await self.write_due()

    async def write_due(self) -> None:
        """One round of the periodic writes: each owned partition whose write is due (``PartitionPersistence.due``)."""
        for partition in list(self.partitions.values()):
            if self.keeper.due(partition):
                await self.keeper.save(partition)

    async def expiry(self, stop: asyncio.Event) -> None:
        every = min(30.0, max(0.2, self._settings.vm_expiry / 4))
        while not await _stopped(stop, every):
            await self.expire_now()

    async def expire_now(self) -> list[VmState]:
        """Forget the VMs silent for --vm-expiry: on each partition's own timeline (the enqueue time of the last event
        read), on the clock only up to a moment when the hub said nothing waited unread in the partition (why:
        docs/architecture.md, "What it keeps"). The hub is asked only for partitions holding a VM the clock expires."""
        now, expiry = self._clock(), self._settings.vm_expiry
        cutoffs: dict[str, float] = {}
        asking: list[Partition] = []
        for partition_id, partition in list(self.partitions.items()):
            if partition.handled_at is not None:
                cutoffs[partition_id] = partition.handled_at - expiry
            if cutoffs.get(partition_id, -math.inf) < now - expiry and self._fleet.silent(partition_id, now - expiry):
                asking.append(partition)
        answers = await asyncio.gather(*(self._nothing_waits(partition) for partition in asking))
        for partition, since in zip(asking, answers, strict=True):
            if since is not None and self.partitions.get(partition.partition_id) is partition:
                cutoffs[partition.partition_id] = max(cutoffs.get(partition.partition_id, -math.inf), since - expiry)
        gone = self._fleet.expire(cutoffs)
        if gone:
            self._metrics.expirations.inc(len(gone))
            names = ", ".join(vm.vm_name or vm.key for vm in gone[:20]) + (" ..." if len(gone) > 20 else "")
            log.warning("%d VMs expired: not heard from for %gs: %s", len(gone), expiry, names,
                        extra=fields(expired=len(gone)))
        return gone

    async def _nothing_waits(self, partition: Partition) -> float | None:
        """A moment (the clock's) when nothing waited unread in the partition; None when the hub does not say so."""
        asked = self._clock()
        newest = await self.newest(partition.partition_id)
        if newest is None:
            return None
        position = self._fleet.position(partition.partition_id)
        return asked if newest < 0 or (position is not None and position >= newest) else None

    async def watchdog(self, stop: asyncio.Event) -> None:
        while not await _stopped(stop, 1.0):
            self.alive = self._monotonic()
            self._metrics.flush()  # the batches' counts, for a registry nobody scrapes: its queue stays short

    # ------------------------------------------------------------------ what the endpoints say

    @property
    def healthy(self) -> bool:
        return self._monotonic() - self.alive < 15.0

    @property
    def ready(self) -> bool:
        return self.balanced and not self.restoring


class ObservedCheckpointStore(BlobCheckpointStore):
    """The official Blob checkpoint store, telling the service when a load-balancing round read the ownerships."""

    on_listed: Callable[[], None] = staticmethod(lambda: None)

    async def list_ownership(self, *args: Any, **kwargs: Any) -> Iterable[dict[str, Any]]:
        result = await super().list_ownership(*args, **kwargs)
        self.on_listed()
        return result


def newest_event(client: EventHubConsumerClient, timeout: float = NEWEST_TIMEOUT,
                 ) -> Callable[[str], Awaitable[int | None]]:
    """The partition's newest sequence number as the hub says it now (``get_partition_properties``; -1 when the
    partition is empty), or None when it does not answer within ``timeout``: the expiry then trusts no clock."""
    async def newest(partition_id: str) -> int | None:
        try:
            properties = await asyncio.wait_for(client.get_partition_properties(partition_id), timeout)
        except Exception as error:  # an outage: silence is then measured on the partition's own timeline
            log.debug("partition %s: the hub did not say its newest event: %s", partition_id, describe(error))
            return None
        if properties.get("is_empty"):
            return -1
        sequence = properties.get("last_enqueued_sequence_number")
        return int(sequence) if isinstance(sequence, int) else None

    return newest


async def _unknown(partition_id: str) -> int | None:
    return None


def _body(delivered: received.Delivery) -> bytes:
    if delivered.body_type != AmqpMessageBodyType.DATA:
        raise InvalidMessage("not_envelope", f"the AMQP body is {delivered.body_type}, not data")
    body = delivered.body  # a data body is bytes or an iterable of bytes
    return bytes(body) if isinstance(body, (bytes, bytearray)) else b"".join(body)


async def _stopped(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
