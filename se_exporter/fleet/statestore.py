"""Where each partition's fleet state lives between owners: the interface, and the store in Blob Storage.

Why state rather than re-reading a window of the hub on start: the state is a fold of the partition's events, so a
snapshot at sequence number P plus the events after P is the whole picture, however long ago a quiet VM last spoke;
a window would have to span the VM expiry and would still lose every VM that sent nothing inside it.

Shaped like the Event Hubs SDK's own ``CheckpointStore``: the service takes a ``StateStore``, so its rules are
tested against an in-memory store and run against ``StateBlobs``. What every store shares: a stored state is read by
``stateformat.decode`` and never trusted; a newer format is left in place (``frozen``); writes only move the stored
position forward. Every write is a base or a delta appended to the block list this replica knows, each commit one
ETag-conditional replacement of the list (``save_blocks``; docs/fleet.md, "State cost", says when a write is a base
and what a restore then reads).
"""

from __future__ import annotations

import abc
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob import ContentSettings
from azure.storage.blob.aio import ContainerClient

from se_exporter.fleet.message import DEFAULT_BOUNDS, Bounds
from se_exporter.fleet.stateformat import DamagedState, NewerState, decode
from se_exporter.fleet.vms import PartitionState

COMPACT_FRACTION = 1.0  # deltas past this share of the base's bytes: the next write is a base (docs/fleet.md)
MAX_BLOCKS = 64  # a base and 63 deltas at most: bounds the restore and the block list every commit sends
BLOCK_ID_LENGTH = 12  # hex characters; one length for every block of a blob, as Blob Storage requires
MAX_STATE_BLOB_BYTES = 128 * 1024**2  # gzip'd; 100,000 VMs of ordinary documents are a few MB
POSITION_KEY = "sequencenumber"  # the same metadata name the checkpoint store uses for its position
GZIP = ContentSettings(content_type="application/gzip")
Commit = Literal["ok", "conflict", "invalid"]  # written; the ETag moved; the block list names blocks not there


def new_block_id() -> str:
    return secrets.token_hex(BLOCK_ID_LENGTH // 2)


def block_list_bytes(blocks: int) -> int:
    """About what a commit of ``blocks`` ids sends: each id base64'd inside <Latest></Latest>, and the envelope."""
    return blocks * (len("<Latest></Latest>") + 4 * -(-BLOCK_ID_LENGTH // 3)) + 64


@dataclass
class Layout:
    """A state's blocks as this replica last read or wrote them, and their position: what a delta is appended to."""

    ids: list[str]
    position: int
    base_bytes: int
    delta_bytes: int = 0

    def room(self, delta: int, position: int) -> bool:
        """Whether a delta of ``delta`` bytes at ``position`` may follow. Never one behind the stored position: a
        position reset (``Fleet.check_restored``) starts a fresh base, since a reader refuses a delta that goes back."""
        return position >= self.position and len(self.ids) < MAX_BLOCKS \
            and self.delta_bytes + delta <= COMPACT_FRACTION * self.base_bytes


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


class StateStore(abc.ABC):
    """Loads and saves partition states by partition id, once ``name`` says where each one lives."""

    def __init__(self, bounds: Bounds = DEFAULT_BOUNDS) -> None:
        self._bounds = bounds
        self._names: dict[str, str] = {}
        self._frozen: set[str] = set()
        self._layouts: dict[str, Layout] = {}  # states whose block list is known: deltas may follow
        self.on_written: Callable[[str, int], None] = lambda kind, size: None  # bytes uploaded: "base" or "delta"

    def name(self, partition_id: str, state_name: str) -> None:
        self._names[partition_id] = state_name

    def frozen(self, partition_id: str) -> bool:
        """Its state is of a newer format: neither state nor checkpoint is written for it by this replica."""
        return partition_id in self._frozen

    async def load(self, partition_id: str, now: float) -> Restored:
        """The stored state (None when there is none yet or it is unusable, with why). Storage errors propagate:
        the caller retries; whatever the state holds does not."""
        self._layouts.pop(partition_id, None)
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
        ids = [block for block, _size in decoded.blocks]
        if ids and not decoded.dropped and len(set(ids)) == len(ids) and all(len(i) == BLOCK_ID_LENGTH for i in ids):
            self._layouts[partition_id] = Layout(ids, decoded.position, decoded.blocks[0][1],
                                                 sum(size for _block, size in decoded.blocks[1:]))
        state = PartitionState(vms=decoded.vms, position=decoded.position, restored_position=decoded.position)
        return Restored(state, dropped=dict(decoded.dropped))

    async def save_blocks(self, partition_id: str, position: int, base: Callable[[str], bytes],
                          delta: Callable[[str], bytes] | None) -> bool:
        """Write the partition's VMs at ``position``: ``delta(block_id)`` appended when the stored block list is
        known and has room (``Layout.room``), else ``base(block_id)`` as the only block. On a conflict (another
        writer moved the ETag) a stored position past ours wins (False); one at or behind ours is replaced by a base,
        since our state in memory is the truth at our position."""
        if partition_id in self._frozen:
            return False
        for _attempt in range(3):
            appending, block = self._layouts.get(partition_id), new_block_id()  # the layout a delta is appended to
            data = delta(block) if delta is not None and appending is not None else None
            if appending is None or data is None or not appending.room(len(data), position):
                appending, data = None, base(block)
            ids = appending.ids if appending is not None else []
            outcome = await self._commit(partition_id, ids, block, data, position)
            self.on_written("base" if appending is None else "delta", len(data) + block_list_bytes(len(ids) + 1))
            if outcome == "ok":
                if appending is not None:
                    appending.ids.append(block)
                    appending.position, appending.delta_bytes = position, appending.delta_bytes + len(data)
                else:
                    self._layouts[partition_id] = Layout([block], position, len(data))
                return True
            self._layouts.pop(partition_id, None)  # a delta naming blocks not there is written again as a base
            if outcome == "conflict" or appending is None:
                # one at our position holds our events (our own write, too, its answer lost to a cancellation)
                theirs = await self._stored_position(partition_id)  # its ETag now the one to write on
                if theirs is not None and theirs > position:
                    return False
        return False

    async def listing(self, prefix: str) -> dict[str, str]:
        """Each stored blob whose name starts with ``prefix``: its name and a tag that changes with every write (an
        ETag): one request, so the states of partitions held elsewhere are fetched only when they changed."""
        raise NotImplementedError

    async def fetch(self, partition_id: str) -> bytes | None:
        """The stored bytes as they are, for a state of another kind kept beside the VMs' (the platform picture's,
        ``fleet/platform/saving.py``), which has its own reader; written as a base under the same rules."""
        return await self._download(partition_id)

    def forget(self, partition_id: str) -> None:
        """The partition is no longer ours: what was learnt about its stored state goes with it."""
        self._names.pop(partition_id, None)
        self._frozen.discard(partition_id)
        self._layouts.pop(partition_id, None)

    @abc.abstractmethod
    async def _download(self, partition_id: str) -> bytes | None:
        """The stored bytes, None when there are none; ``DamagedState`` for bytes not to be read at all."""

    @abc.abstractmethod
    async def _commit(self, partition_id: str, ids: list[str], block: str, data: bytes, position: int) -> Commit:
        """Stage ``data`` as ``block`` and commit ``ids + [block]`` with ``position``, conditional on the state
        being the one last read or written (none: that there is none)."""

    @abc.abstractmethod
    async def _stored_position(self, partition_id: str) -> int | None:
        """The stored state's position (None: no state), remembering its ETag as the one to write on."""


class StateBlobs(StateStore):
    """The state store in Blob Storage: one blob per partition, its position in the blob's metadata."""

    def __init__(self, container: ContainerClient, bounds: Bounds = DEFAULT_BOUNDS) -> None:
        super().__init__(bounds)
        self._container = container
        self._etags: dict[str, str | None] = {}
        self._clients: dict[str, Any] = {}  # the partition's blob client, kept while the partition is ours

    def _blob(self, partition_id: str) -> Any:
        """One client per partition's blob, made once: making one builds a request pipeline, a sixth of a state
        write's CPU when made anew for each of its requests."""
        name = self._names[partition_id]
        client = self._clients.get(partition_id)
        if client is None or client.blob_name != name:
            client = self._clients[partition_id] = self._container.get_blob_client(name)
        return client

    async def _download(self, partition_id: str) -> bytes | None:
        try:
            download = await self._blob(partition_id).download_blob()
            self._etags[partition_id] = download.properties.etag
            if download.size > MAX_STATE_BLOB_BYTES:  # never read: damaged, replaced by the next write
                raise DamagedState("unreadable", f"the state blob is {download.size} bytes, more than "
                                   f"{MAX_STATE_BLOB_BYTES} (gzip'd)")
            data: bytes = await download.readall()
        except ResourceNotFoundError:
            self._etags[partition_id] = None
            return None
        return data

    async def _commit(self, partition_id: str, ids: list[str], block: str, data: bytes, position: int) -> Commit:
        blob, etag = self._blob(partition_id), self._etags.get(partition_id)
        conditions: dict[str, Any] = {"if_match": etag} if etag else {"if_none_match": "*"}
        await blob.stage_block(block, data)
        try:
            result = await blob.commit_block_list([*ids, block], metadata={POSITION_KEY: str(position)},
                                                  content_settings=GZIP, **conditions)
        except (ResourceModifiedError, ResourceExistsError, ResourceNotFoundError):
            return "conflict"
        except HttpResponseError as error:
            if getattr(error, "error_code", None) == "InvalidBlockList":
                return "invalid"
            raise
        self._etags[partition_id] = result.get("etag")
        return "ok"

    async def listing(self, prefix: str) -> dict[str, str]:
        return {blob.name: str(blob.etag) async for blob in self._container.list_blobs(name_starts_with=prefix)}

    async def _stored_position(self, partition_id: str) -> int | None:
        try:
            properties = await self._blob(partition_id).get_blob_properties()
        except ResourceNotFoundError:
            self._etags[partition_id] = None
            return None
        self._etags[partition_id] = properties.etag
        try:
            return int((properties.metadata or {}).get(POSITION_KEY, "-1"))
        except ValueError:  # a position not a number: behind any, as none
            return -1

    def forget(self, partition_id: str) -> None:
        super().forget(partition_id)
        self._etags.pop(partition_id, None)
        self._clients.pop(partition_id, None)
