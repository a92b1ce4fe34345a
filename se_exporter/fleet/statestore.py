"""Where each partition's fleet state lives between owners: the interface, and an in-memory store.

Shaped like the Event Hubs SDK's own ``CheckpointStore`` (abstract, with an in-memory implementation beside the Blob
one): the service takes a ``StateStore``, so its claim, restore and save rules are tested against
``MemoryStateStore`` without a storage account, and run against ``blobstate.StateBlobs`` in production.

What every store shares lives here, so that both behave alike: whatever a stored state holds is read by
``stateformat.decode`` and never trusted; a state of a newer format than this release reads is left in place
(``frozen``: neither it nor the checkpoint is written for that partition); writes only move the stored position
forward (an implementation's ``_upload`` gives way to a newer state written by another owner).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from se_exporter.fleet.message import DEFAULT_BOUNDS, Bounds
from se_exporter.fleet.picture import PartitionState
from se_exporter.fleet.stateformat import DamagedState, NewerState, decode


def state_blob_name(namespace: str, eventhub_name: str, consumer_group: str, partition_id: str) -> str:
    """Where a partition's state lives, named like the checkpoint store's own blobs
    (``<namespace>/<hub>/<group>/checkpoint/<id>``): the blob's name in Blob Storage, the key in any other store."""
    return f"{namespace}/{eventhub_name}/{consumer_group}/fleet-state/{partition_id}".lower()


@dataclass
class Restored:
    """What a partition's stored state gave: the state (None: start from the checkpoint alone), and what was wrong."""

    state: PartitionState | None = None
    damaged: str | None = None  # the reason the whole state was unusable
    newer_format: int | None = None
    problem: str = ""
    dropped: dict[str, int] = field(default_factory=dict)  # VMs left out, by reason
    format: int | None = None  # the format it was stored in (None: no state, or an unreadable one)


class StateStore(abc.ABC):
    """Loads and saves partition states by partition id, once ``name`` says where each one lives."""

    def __init__(self, bounds: Bounds = DEFAULT_BOUNDS) -> None:
        self._bounds = bounds
        self._names: dict[str, str] = {}
        self._frozen: set[str] = set()

    def name(self, partition_id: str, state_name: str) -> None:
        self._names[partition_id] = state_name

    def frozen(self, partition_id: str) -> bool:
        """Its state is of a newer format: neither state nor checkpoint is written for it by this replica."""
        return partition_id in self._frozen

    async def load(self, partition_id: str, now: float) -> Restored:
        """The stored state (None when there is none yet or it is unusable, with why). Storage errors propagate:
        the caller retries; whatever the state holds does not."""
        try:
            data = await self._download(partition_id)
            if data is None:
                return Restored()
            decoded = decode(data, partition_id, now, self._bounds)
        except NewerState as newer:
            self._frozen.add(partition_id)
            return Restored(newer_format=newer.format, problem=str(newer))
        except DamagedState as damage:
            return Restored(damaged=damage.reason, problem=str(damage))
        state = PartitionState(vms=decoded.vms, position=decoded.position, restored_position=decoded.position)
        return Restored(state, dropped=dict(decoded.dropped), format=decoded.format)

    async def save(self, partition_id: str, data: bytes, position: int) -> bool:
        """Write the state at ``position``; False when a newer one is already there, or the stored one is a newer
        release's (nothing written)."""
        if partition_id in self._frozen:
            return False
        return await self._upload(partition_id, data, position)

    def forget(self, partition_id: str) -> None:
        """The partition is no longer ours: what was learnt about its stored state goes with it."""
        self._names.pop(partition_id, None)
        self._frozen.discard(partition_id)

    @abc.abstractmethod
    async def _download(self, partition_id: str) -> bytes | None:
        """The stored bytes, None when there are none; ``DamagedState`` for bytes not to be read at all."""

    @abc.abstractmethod
    async def _upload(self, partition_id: str, data: bytes, position: int) -> bool:
        """Write unless a state at ``position`` or past it was written by someone else since our last read."""


@dataclass
class Stored:
    """One state in a ``MemoryStateStore``: its bytes, its position, and a revision standing for an ETag."""

    data: bytes
    position: int
    revision: int


class MemoryStateStore(StateStore):
    """States in a dict; several stores given one ``states`` dict behave as replicas sharing one storage account.
    ``failures`` are raised, one per call, before any other work (an unreachable or refusing storage)."""

    def __init__(self, states: dict[str, Stored] | None = None, bounds: Bounds = DEFAULT_BOUNDS) -> None:
        super().__init__(bounds)
        self.states = {} if states is None else states
        self.failures: list[Exception] = []
        self._seen: dict[str, int | None] = {}  # the revision last read or written, per partition

    async def _download(self, partition_id: str) -> bytes | None:
        self._fail()
        stored = self.states.get(self._names[partition_id])
        self._seen[partition_id] = stored.revision if stored else None
        return stored.data if stored else None

    async def _upload(self, partition_id: str, data: bytes, position: int) -> bool:
        self._fail()
        name = self._names[partition_id]
        stored = self.states.get(name)
        theirs = stored.revision if stored else None
        if theirs != self._seen.get(partition_id) and stored is not None and stored.position >= position:
            return False  # another owner wrote a newer state since our last read: give way
        revision = (theirs or 0) + 1
        self.states[name] = Stored(data, position, revision)
        self._seen[partition_id] = revision
        return True

    def forget(self, partition_id: str) -> None:
        super().forget(partition_id)
        self._seen.pop(partition_id, None)

    def _fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)
