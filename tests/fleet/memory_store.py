"""The in-memory state store the fleet's unit tests run the service against (as the SDK's own in-memory checkpoint
store stands beside its Blob one): several stores given one ``states`` dict behave as replicas sharing one storage
account."""

from __future__ import annotations

from dataclasses import dataclass, field

from se_exporter.fleet.message import DEFAULT_BOUNDS, Bounds
from se_exporter.fleet.statestore import Commit, StateStore


@dataclass
class Stored:
    """One state in a ``MemoryStateStore``: its bytes, its position, and a revision standing for an ETag; ``blocks``
    its committed block ids and their bytes (empty: written whole, as by Put Blob)."""

    data: bytes
    position: int
    revision: int
    blocks: list[tuple[str, bytes]] = field(default_factory=list)


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

    async def _commit(self, partition_id: str, ids: list[str], block: str, data: bytes, position: int) -> Commit:
        self._fail()
        name = self._names[partition_id]
        stored = self.states.get(name)
        if (stored.revision if stored else None) != self._seen.get(partition_id):
            return "conflict"
        committed = dict(stored.blocks) if stored else {}
        if any(each not in committed for each in ids):
            return "invalid"
        blocks = [(each, committed[each]) for each in ids] + [(block, data)]
        revision = (stored.revision if stored else 0) + 1
        self.states[name] = Stored(b"".join(part for _id, part in blocks), position, revision, blocks)
        self._seen[partition_id] = revision
        return "ok"

    async def listing(self, prefix: str) -> dict[str, str]:
        self._fail()
        return {name: str(stored.revision) for name, stored in self.states.items() if name.startswith(prefix)}

    async def _stored_position(self, partition_id: str) -> int | None:
        self._fail()
        stored = self.states.get(self._names[partition_id])
        self._seen[partition_id] = stored.revision if stored else None
        return stored.position if stored else None

    def forget(self, partition_id: str) -> None:
        super().forget(partition_id)
        self._seen.pop(partition_id, None)

    def _fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)
