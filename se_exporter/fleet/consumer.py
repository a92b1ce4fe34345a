"""``se-exporter fleet``: the official async consumer client with the Blob checkpoint store, and its wiring.

One asyncio loop runs the SDK's receive, a checkpoint task, an expiry task and a watchdog; the HTTP
server (the sidecar's bounded ``serve``) answers scrapes from its own threads, reading the state under
``Fleet``'s lock.

Per partition the SDK calls, in order: ``on_initialize`` (the state blob is loaded before a single
event is read: until it is, the partition is not read at all), ``on_batch`` for events, and
``on_close`` (on shutdown a last state and checkpoint are written before the SDK releases ownership;
when ownership is lost, the partition's VMs are dropped at once, so that the sum over replicas counts
every VM once).

Facts about azure-eventhub (5.15) this module is built around: with a checkpoint store the SDK opens
every partition as an exclusive receiver (owner level 0), so a replica taking a partition over closes
the previous owner's link (``amqp:link:stolen``, reported to ``on_error``, not fatal); the SDK lets a
checkpoint move backwards, so only events newer than the last checkpoint are checkpointed; duplicates
happen around hand-overs and are dropped by sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from typing import Any

from azure.eventhub import CloseReason, EventData
from azure.eventhub.aio import PartitionContext
from azure.eventhub.amqp import AmqpMessageBodyType
from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

from se_exporter.core.retry import backoff
from se_exporter.fleet.blobstate import Restored, StateBlobs, state_blob_name
from se_exporter.fleet.collector import FleetMetrics, PartitionView
from se_exporter.fleet.message import BOUND_NAMES, InvalidMessage, VmState, read_message
from se_exporter.fleet.picture import Fleet
from se_exporter.fleet.settings import FleetSettings
from se_exporter.infra.azure.clients import classify, describe
from se_exporter.infra.logs import Throttle, fields

log = logging.getLogger("se_exporter.fleet")
BATCH_SIZE = 300  # the SDK's default prefetch: one batch drains what one link fetches
EMPTY_BATCH_AFTER = 1.0  # seconds without events before the SDK says so: the partition is caught up
LOG_EVERY = 60.0  # seconds between repeated log lines of one kind of invalid message or error
RESTORE_RETRY_MAX = 30.0
BOUND_HELP = {
    "vms_per_partition": "a partition holds the most VMs one replica keeps for it; documents of further VMs skipped",
    "vms_per_installation": "one sidecar installation id sent documents for more VMs than one sidecar has; "
                            "documents of further VMs skipped",
    "events_per_vm": "a document lists more events than the fleet shows per VM; the rest left out",
    "body_bytes": "a document larger than the fleet keeps per VM; what it shows of it kept instead",
    "label_length": "an event field longer than a label may be; that event left out",
}


class Service:
    """The SDK's callbacks, the periodic tasks, and what /healthz and /readyz report."""

    def __init__(self, settings: FleetSettings, fleet: Fleet, metrics: FleetMetrics, blobs: StateBlobs,
                 clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._fleet = fleet
        self._metrics = metrics
        self._blobs = blobs
        self._clock = clock
        self.views: dict[str, PartitionView] = {}
        self._contexts: dict[str, PartitionContext] = {}
        self._last_events: dict[str, EventData] = {}
        self._handled_at: dict[str, float] = {}  # enqueue time of the last event handled, per partition
        self._caught_up: set[str] = set()
        self._saved: dict[str, int | None] = {}
        self._checkpointed: dict[str, int] = {}
        self._saving: dict[str, asyncio.Lock] = {}
        self.restoring: set[str] = set()
        self._logged = Throttle(LOG_EVERY)
        self.alive = time.monotonic()
        self.balanced = False
        self.hub_partitions: int | None = None
        self.storage_problem: str | None = None  # why the storage account is not reachable, while it is not

    # ------------------------------------------------------------------ SDK callbacks

    async def on_initialize(self, context: PartitionContext) -> None:
        partition_id = context.partition_id
        self._blobs.name(partition_id, state_blob_name(context.fully_qualified_namespace, context.eventhub_name,
                                                       context.consumer_group, partition_id))
        self.restoring.add(partition_id)
        try:
            restored = await self._restore(partition_id)
        finally:
            self.restoring.discard(partition_id)
        state = restored.state
        self._fleet.claim(partition_id, state)
        self.views[partition_id] = PartitionView(newer_format=restored.newer_format is not None)
        self._contexts[partition_id] = context
        self._saved[partition_id] = state.position if state else None
        self._saving[partition_id] = asyncio.Lock()
        self._metrics.claims.inc()
        log.info("partition %s claimed: %d VMs restored", partition_id, len(state.vms) if state else 0,
                 extra=fields(partition_id=partition_id, state_sequence_number=state.position if state else None))

    async def _restore(self, partition_id: str) -> Restored:
        """Until the state is read the partition is not read either: a partition read without its state would
        show (and then checkpoint) a fleet missing every VM that was quiet since. Only the storage's refusals are
        retried: whatever the blob holds is an answer (``Restored`` says what was wrong with it)."""
        failures = 0
        while True:
            try:
                restored = await self._blobs.load(partition_id, self._clock())
                break
            except Exception as error:  # storage unreachable or refusing: retried until it answers
                self._metrics.errors.labels("state_read").inc()
                self._log_once(f"restore:{partition_id}", logging.WARNING,
                               "partition %s: cannot read its fleet state (%s); retrying before reading it",
                               partition_id, describe(error))
                failures += 1
                await asyncio.sleep(backoff(failures, 1.0, RESTORE_RETRY_MAX))
        if restored.damaged is not None:
            self._metrics.state_damaged.labels(restored.damaged).inc()
            self._log_once(f"damaged:{partition_id}", logging.ERROR,
                           "partition %s: the stored fleet state is damaged (%s); reading the partition from its "
                           "checkpoint alone, VMs reappear as they send documents; the next write replaces it",
                           partition_id, restored.problem, extra=fields(partition_id=partition_id,
                                                                        reason=restored.damaged))
        if restored.newer_format is not None:
            self._log_once(f"newer:{partition_id}", logging.WARNING,
                           "partition %s: %s; left in place for that release: reading the partition from its "
                           "checkpoint alone and writing neither its state nor its checkpoint", partition_id,
                           restored.problem, extra=fields(partition_id=partition_id))
        for reason, count in restored.dropped.items():
            if reason in BOUND_NAMES:
                self._bound_hit(reason, count)
            else:
                self._metrics.state_damaged.labels(reason).inc(count)
                self._log_once(f"rows:{partition_id}", logging.WARNING,
                               "partition %s: %d rows of the stored fleet state left out (wrong types or out of "
                               "range); the rest restored", partition_id, count)
        return restored

    async def on_batch(self, context: PartitionContext, events: list[EventData]) -> None:
        partition_id = context.partition_id
        view = self.views.get(partition_id)
        if view is None:
            return
        if not events:  # EMPTY_BATCH_AFTER passed without an event: nothing waits in this partition
            self._caught_up.add(partition_id)
            view.lag_events, view.lag_seconds = 0.0, 0.0
            return
        self._check_restored(context)
        outcomes: Tally[str] = Tally()
        for event in events:
            try:
                outcome = self._handle(partition_id, event)
            except Exception as error:  # never out of the batch handler: the SDK would close the partition
                self._fleet.handled(partition_id, event.sequence_number or 0)
                self._metrics.invalid.labels("internal_error").inc()
                self._log_once("invalid:internal_error", logging.ERROR, "message skipped after an unexpected error "
                               "(partition %s, sequence number %s): %s", partition_id, event.sequence_number,
                               describe(error), extra=fields(reason="internal_error", partition_id=partition_id))
                outcome = "invalid"
            outcomes[outcome] += 1
        self._count(len(events), outcomes)
        last = events[-1]
        self._last_events[partition_id] = last
        if view.unsaved_since is None:
            view.unsaved_since = self._clock()
        self._lag(context, view, last)

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
                self._bound_hit(outcome, count)

    def _bound_hit(self, bound: str, count: int = 1) -> None:
        self._metrics.bound_hits.labels(bound).inc(count)
        self._log_once(f"bound:{bound}", logging.WARNING, "bound %s reached (%d times): %s", bound, count,
                       BOUND_HELP.get(bound, ""), extra=fields(bound=bound))

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

    def _handle(self, partition_id: str, event: EventData) -> str:
        """Read, check and fold one event; what became of it."""
        sequence_number = event.sequence_number
        if sequence_number is None:
            return "unnumbered"
        enqueued = event.enqueued_time.timestamp() if event.enqueued_time else self._clock()
        self._handled_at[partition_id] = enqueued
        if self._fleet.already_applied(partition_id, sequence_number):
            return "replayed"
        try:
            message = read_message(_body(event), event.properties or {}, event.message_id, event.partition_key,
                                   enqueued, self._settings.max_message_bytes)
        except InvalidMessage as error:
            self._fleet.handled(partition_id, sequence_number)
            self._metrics.invalid.labels(error.reason).inc()
            self._log_once(f"invalid:{error.reason}", logging.WARNING,
                           "invalid message skipped (partition %s, sequence number %d): %s", partition_id,
                           sequence_number, error, extra=fields(reason=error.reason, partition_id=partition_id,
                                                                sequence_number=sequence_number))
            return "invalid"
        outcome = self._fleet.apply(partition_id, message, sequence_number)
        if message.unknown_properties:
            self._metrics.warnings.labels("unknown_property").inc()
            self._log_once("unknown_property", logging.INFO,  # one key: names are the sender's to choose
                           "message with properties this version does not know, applied: %s",
                           ", ".join(message.unknown_properties[:10]))
        if message.document_warnings:
            self._metrics.warnings.labels("document").inc(message.document_warnings)
        for bound in message.bounds:
            self._bound_hit(bound)
        if outcome == "applied":
            return "heartbeat" if message.heartbeat else "change"
        return outcome

    def _lag(self, context: PartitionContext, view: PartitionView, last: EventData) -> None:
        properties = context.last_enqueued_event_properties
        if not properties or properties.get("sequence_number") is None or last.sequence_number is None:
            return
        view.lag_events = float(max(0, int(properties["sequence_number"]) - last.sequence_number))
        newest, handled = properties.get("enqueued_time"), last.enqueued_time
        if newest is not None and handled is not None:
            view.lag_seconds = max(0.0, (newest - handled).total_seconds()) if view.lag_events else 0.0
        if view.lag_events == 0:
            self._caught_up.add(context.partition_id)
        else:
            self._caught_up.discard(context.partition_id)

    async def on_close(self, context: PartitionContext, reason: CloseReason) -> None:
        partition_id = context.partition_id
        if reason == CloseReason.SHUTDOWN:
            await self.save(partition_id)  # before the SDK releases ownership: the next owner starts from here
        dropped = self._fleet.release(partition_id)
        for table in (self.views, self._contexts, self._last_events, self._handled_at, self._saved,
                      self._checkpointed, self._saving):
            table.pop(partition_id, None)
        self._caught_up.discard(partition_id)
        self._blobs.forget(partition_id)
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
        self._log_once(f"error:{reason}:{where}", logging.INFO if reason == "ownership_lost" else logging.WARNING,
                       "Event Hubs client error (%s, %s): %s", where, reason, describe(error))

    # ------------------------------------------------------------------ periodic work

    async def save(self, partition_id: str) -> None:
        """Write the partition's state, then checkpoint the last event it covers (never an older one)."""
        lock = self._saving.get(partition_id)
        if lock is None:
            return
        async with lock:
            if self._blobs.frozen(partition_id):
                return  # a newer release's state: neither it nor (without it) the checkpoint is ours to write
            if self._fleet.position(partition_id) == self._saved.get(partition_id):
                return  # nothing new since the last write: no encoding (10,000 VMs: ~30 ms of CPU each time)
            dumped = self._fleet.dump(partition_id)
            if dumped is None or dumped[1] == self._saved.get(partition_id):
                return
            data, position = dumped
            event, context = self._last_events.get(partition_id), self._contexts.get(partition_id)
            try:
                if not await self._blobs.save(partition_id, data, position):
                    self._metrics.checkpoints.labels("superseded").inc()
                    log.info("partition %s: a newer state is stored already (another owner); not checkpointing",
                             partition_id)
                    return
                sequence = event.sequence_number if event is not None else None
                if context is not None and event is not None and sequence is not None \
                        and sequence > self._checkpointed.get(partition_id, -1):
                    await context.update_checkpoint(event)
                    self._checkpointed[partition_id] = sequence
            except Exception as error:  # storage trouble: the state stays in memory, the next round retries
                self._metrics.checkpoints.labels("error").inc()
                self._log_once(f"checkpoint:{partition_id}", logging.WARNING,
                               "partition %s: writing state and checkpoint failed: %s", partition_id,
                               describe(error))
                return
            self._metrics.checkpoints.labels("ok").inc()
            if partition_id in self._saved:
                self._saved[partition_id] = position
            view = self.views.get(partition_id)
            if view is not None:
                view.unsaved_since = None if self._fleet.position(partition_id) == position else self._clock()

    async def checkpoints(self, stop: asyncio.Event) -> None:
        while not await _stopped(stop, self._settings.checkpoint_interval):
            for partition_id in list(self._contexts):
                await self.save(partition_id)

    async def expiry(self, stop: asyncio.Event) -> None:
        every = min(30.0, max(0.2, self._settings.vm_expiry / 4))
        while not await _stopped(stop, every):
            self.expire_now()

    def expire_now(self) -> list[VmState]:
        """Silence is measured on each partition's own timeline: while a partition is being caught up after an
        outage, its VMs are old only relative to the events already read, not to the wall clock."""
        now = self._clock()
        cutoffs = {}
        for partition_id in self.views:
            reference = now if partition_id in self._caught_up else self._handled_at.get(partition_id)
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

    def _log_once(self, key: str, level: int, message: str, *args: Any, extra: dict[str, Any] | None = None) -> None:
        if self._logged.due(key, time.monotonic()):
            log.log(level, message, *args, extra=extra)


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

