"""Everything one replica knows about one partition it owns: made whole on claim, dropped whole on loss.

The VMs and the position (``vms.PartitionState``) are also held by ``Fleet``, which scrapes read under its lock; the
rest is the consumer's: the SDK's context, the last event, where reading stands, and what was last written.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from azure.eventhub import EventData
from azure.eventhub.aio import PartitionContext

from se_exporter.fleet.collector import PartitionView
from se_exporter.fleet.vms import PartitionState


@dataclass
class Partition:
    """One owned partition."""

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
