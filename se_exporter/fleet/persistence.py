"""A partition's state read before the partition is, and written before its checkpoint.

A partition read without its state would show (and then checkpoint) a fleet missing every VM quiet since, so it is
not read until the store answers; only the store's refusals are retried (``Restored`` says what was wrong with a
state). A checkpoint follows a state at or past it and never moves back, so a replica that takes the partition over
never starts reading after events its state lacks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, TypeVar

from azure.eventhub import EventData
from azure.eventhub.aio import PartitionContext

from se_exporter.core.retry import backoff
from se_exporter.fleet.collector import PartitionView
from se_exporter.fleet.message import BOUND_NAMES
from se_exporter.fleet.report import Report
from se_exporter.fleet.stateformat import encode_base, encode_delta
from se_exporter.fleet.statestore import Restored, StateStore
from se_exporter.fleet.vms import Fleet, PartitionState, StateWrite
from se_exporter.infra.azure.clients import describe
from se_exporter.infra.logs import fields

log = logging.getLogger("se_exporter.fleet")
RESTORE_RETRY_MAX = 30.0
T = TypeVar("T")


@dataclass
class Partition:
    """Everything one replica knows about one partition it owns: made whole on claim, dropped whole on loss. The
    VMs and the position (``state``) are also held by ``Fleet``, which scrapes read under its lock; the rest is the
    consumer's: the SDK's context, the last event, where reading stands, and what was last written."""

    context: PartitionContext
    state: PartitionState  # the same object ``Fleet`` holds for this partition
    view: PartitionView = field(default_factory=PartitionView)  # what /metrics shows of it besides its VMs
    last_event: EventData | None = None  # the last event handled: the one the next checkpoint names
    handled_at: float | None = None  # enqueue time of the last event handled: the partition's own clock
    lag_from: EventData | None = None  # the last batch's last event, whose lag the view does not hold yet
    saved: int | None = None  # the position of the state last written or read
    checkpointed: int = -1  # the sequence number of the last checkpoint written (never moved back)
    restored_checked: bool = False  # the restored position was checked against the partition's newest event
    saving: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def partition_id(self) -> str:
        return self.context.partition_id


async def until_read(read: Callable[[], Awaitable[T]], report: Report, key: str, what: str,
                     sleep: Callable[[float], Awaitable[object]]) -> T:
    """``read()``, retried with backoff while the store refuses: each refusal counted, logged once a minute per key."""
    failures = 0
    while True:
        try:
            return await read()
        except Exception as error:  # storage unreachable or refusing: retried until it answers
            report.metrics.errors.labels("state_read").inc()
            report.once(key, logging.WARNING, "%s (%s); retrying before reading it", what, describe(error))
            failures += 1
            await sleep(backoff(failures, 1.0, RESTORE_RETRY_MAX))


class AttachedState(Protocol):
    """A state kept beside a partition's VMs and written before them at the same position (so before the checkpoint
    moves past it): the platform picture (``fleet/platform/service.py``)."""

    def dirty(self, partition_id: str) -> bool:
        """It changed since its last write, even if the partition's position did not."""

    def prepare(self, partition_id: str, position: int) -> Callable[[], Awaitable[bool]] | None:
        """Its state now, as a write to await (None: nothing to write); the write is False when a newer one is
        stored (another owner's): the partition's state and checkpoint then give way too."""


class PartitionPersistence:
    """Restores and saves the owned partitions' states through a ``StateStore``."""

    def __init__(self, store: StateStore, fleet: Fleet, report: Report, clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep, heartbeat_interval: float = 0.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``clock``: the wall clock (what stored rows' times are checked against); ``monotonic``: what the wait of
        unsaved events (``PartitionView.unsaved_since``) is measured on."""
        self.store = store
        self._fleet = fleet
        self._report = report
        self._clock, self._monotonic = clock, monotonic
        self._sleep = sleep
        self.heartbeat_interval = heartbeat_interval
        store.on_written = lambda kind, size: report.metrics.state_bytes.labels(kind).inc(size)
        self.beside: AttachedState | None = None  # another state written with each partition's (the platform picture)

    async def restore(self, partition_id: str) -> Restored:
        """The partition's stored state, retried for as long as the store refuses; damage counted and logged."""
        report, metrics = self._report, self._report.metrics
        restored = await until_read(lambda: self.store.load(partition_id, self._clock()), report,
                                    f"restore:{partition_id}", f"partition {partition_id}: cannot read its fleet state",
                                    self._sleep)
        if restored.damaged is not None:
            metrics.state_damaged.labels(restored.damaged).inc()
            report.once(f"damaged:{partition_id}", logging.ERROR,
                        "partition %s: the stored fleet state is damaged (%s); reading the partition from its "
                        "checkpoint alone, VMs reappear as they send documents; the next write replaces it",
                        partition_id, restored.problem, extra=fields(partition_id=partition_id,
                                                                     reason=restored.damaged))
        if restored.newer_format is not None:
            report.once(f"newer:{partition_id}", logging.WARNING,
                        "partition %s: %s; left in place for that release: reading the partition from its "
                        "checkpoint alone and writing neither its state nor its checkpoint", partition_id,
                        restored.problem, extra=fields(partition_id=partition_id))
        for reason, count in restored.dropped.items():
            if reason in BOUND_NAMES:
                report.bound_hit(reason, count)
            else:
                metrics.state_damaged.labels(reason).inc(count)
                report.once(f"rows:{partition_id}", logging.WARNING,
                            "partition %s: %d rows of the stored fleet state left out (wrong types or out of "
                            "range); the rest restored", partition_id, count)
        return restored

    def due(self, partition: Partition) -> bool:
        """Whether the periodic write should write the partition now. Heartbeats alone wait until the first of them
        has waited ``heartbeat_interval`` (the next owner replays them from the checkpoint anyway: docs/fleet.md,
        "Heartbeats wait"); anything else (a VM new, changed or gone, the platform picture) is written at once."""
        waiting = partition.view.unsaved_since
        if waiting is None or self._monotonic() - waiting >= self.heartbeat_interval:
            return True
        return not self._fleet.heartbeats_only(partition.partition_id) or self._beside_dirty(partition)

    def _beside_dirty(self, partition: Partition) -> bool:
        """The state kept beside the partition's (the platform picture) changed: a write is due without events."""
        return self.beside is not None and self.beside.dirty(partition.partition_id)

    async def save(self, partition: Partition) -> None:
        """Write the partition's state, then checkpoint the last event it covers (never an older one)."""
        partition_id, metrics = partition.partition_id, self._report.metrics
        async with partition.saving:
            if self.store.frozen(partition_id):
                return  # a newer release's state: neither it nor (without it) the checkpoint is ours to write
            if self._fleet.position(partition_id) == partition.saved and not self._beside_dirty(partition):
                return  # nothing new since the last write: neither encoded nor uploaded again
            snapshot = self._fleet.snapshot(partition_id)
            if snapshot is None:
                return  # nothing handled or restored yet, or released meanwhile
            position = snapshot.position
            event = partition.last_event
            # taken at the snapshot's instant (no await between): the state beside is the one at ``position`` too
            write_beside = self.beside.prepare(partition_id, position) if self.beside is not None else None
            try:
                newer = None  # what another owner stored already, past ours
                if write_beside is not None and not await write_beside():
                    newer = "platform picture"
                elif not await self._write(partition_id, snapshot):
                    newer = "state"
                if newer is not None:
                    metrics.checkpoints.labels("superseded").inc()
                    log.info("partition %s: a newer %s is stored already (another owner); not checkpointing",
                             partition_id, newer)
                    return
                sequence = event.sequence_number if event is not None else None
                if event is not None and sequence is not None and sequence > partition.checkpointed:
                    await partition.context.update_checkpoint(event)
                    partition.checkpointed = sequence
            except Exception as error:  # storage trouble: the state stays in memory, the next round retries
                metrics.checkpoints.labels("error").inc()
                self._report.once(f"checkpoint:{partition_id}", logging.WARNING,
                                  "partition %s: writing state and checkpoint failed: %s", partition_id,
                                  describe(error))
                return
            metrics.checkpoints.labels("ok").inc()
            self._fleet.settle(partition_id, snapshot.tick)
            partition.saved = position
            partition.view.unsaved_since = None if self._fleet.position(partition_id) == position \
                else self._monotonic()

    async def _write(self, partition_id: str, snapshot: StateWrite) -> bool:
        """The state at the snapshot's position: a delta of what changed since the last write when the store can
        append one (``StateStore.save_blocks``), else a base."""
        position = snapshot.position
        base = partial(encode_base, partition_id, position, snapshot.vms)  # each takes the new block's id
        delta = partial(encode_delta, position, changed=snapshot.changed, touched=snapshot.touched, gone=snapshot.gone)
        return await self.store.save_blocks(partition_id, position, base, None if snapshot.rebase else delta)
