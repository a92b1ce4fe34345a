"""Each partition's fleet state as one blob beside the SDK's checkpoint blobs, in the same container.

Why state beside the checkpoints rather than re-reading a window of the hub on start: the state is a
fold of the partition's events, so a snapshot taken at sequence number P plus the events after P is
the whole picture, however long ago a quiet VM last spoke and whether or not its sidecar sends
heartbeats; a restart costs one download per partition and a replay of at most one checkpoint
interval. A window would have to span the VM expiry (15 minutes of 10,000 VMs' heartbeats by
default) and would still lose every VM that sent nothing inside it.

A blob this release cannot read is counted and logged by the caller: a damaged one (``stateformat.DamagedState``)
is replaced by the next write, the partition read from its checkpoint alone meanwhile; one of a newer format
(``NewerState``) is never written over by this older release: the partition is read, but neither its state nor its
checkpoint is written here (``frozen``), so a newer replica taking it back finds its own state intact.

Invariant: a checkpoint is written only after a state blob at or past it, so a replica that takes
the partition over never starts reading after events its state lacks. The blob's sequence number is
kept in its metadata and only ever moves forward: writes are conditional on the ETag last seen, and
a write that finds a newer blob (another owner during a hand-over) gives way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob import ContentSettings
from azure.storage.blob.aio import ContainerClient

from se_exporter.fleet.message import DEFAULT_BOUNDS, Bounds
from se_exporter.fleet.picture import PartitionState
from se_exporter.fleet.stateformat import DamagedState, NewerState, decode

log = logging.getLogger("se_exporter.fleet")
MAX_STATE_BLOB_BYTES = 128 * 1024**2  # gzip'd; 100,000 VMs of ordinary documents are a few MB
POSITION_KEY = "sequencenumber"  # the same metadata name the checkpoint store uses for its position


def state_blob_name(namespace: str, eventhub_name: str, consumer_group: str, partition_id: str) -> str:
    """Named like the checkpoint store's own blobs (``<namespace>/<hub>/<group>/checkpoint/<id>``)."""
    return f"{namespace}/{eventhub_name}/{consumer_group}/fleet-state/{partition_id}".lower()


@dataclass
class Restored:
    """What a partition's state blob gave: the state (None: start from the checkpoint alone), and what was wrong."""

    state: PartitionState | None = None
    damaged: str | None = None  # the reason the whole blob was unusable
    newer_format: int | None = None
    problem: str = ""
    dropped: dict[str, int] = field(default_factory=dict)  # rows left out, by reason


class StateBlobs:
    """Loads and saves partition states by partition id, once ``name`` says where each one lives."""

    def __init__(self, container: ContainerClient, bounds: Bounds = DEFAULT_BOUNDS) -> None:
        self._container = container
        self._bounds = bounds
        self._names: dict[str, str] = {}
        self._etags: dict[str, str | None] = {}
        self._frozen: set[str] = set()

    def frozen(self, partition_id: str) -> bool:
        """Its blob is of a newer format: neither state nor checkpoint is written for it by this replica."""
        return partition_id in self._frozen

    def name(self, partition_id: str, blob_name: str) -> None:
        self._names[partition_id] = blob_name

    def _blob(self, partition_id: str) -> Any:
        return self._container.get_blob_client(self._names[partition_id])

    async def load(self, partition_id: str, now: float) -> Restored:
        """The stored state (None when there is none yet or it is unusable, with why). Storage errors propagate:
        the caller retries; whatever the blob holds does not."""
        try:
            download = await self._blob(partition_id).download_blob()
            if download.size > MAX_STATE_BLOB_BYTES:  # never read: damaged, replaced by the next write
                self._etags[partition_id] = download.properties.etag
                return Restored(damaged="unreadable", problem=f"the state blob is {download.size} bytes, more than "
                                f"{MAX_STATE_BLOB_BYTES} (gzip'd)")
            data = await download.readall()
        except ResourceNotFoundError:
            self._etags[partition_id] = None
            return Restored()
        self._etags[partition_id] = download.properties.etag
        try:
            decoded = decode(data, partition_id, now, self._bounds)
        except NewerState as newer:
            self._frozen.add(partition_id)
            return Restored(newer_format=newer.format, problem=str(newer))
        except DamagedState as damage:
            return Restored(damaged=damage.reason, problem=str(damage))
        state = PartitionState(vms=decoded.vms, position=decoded.position, restored_position=decoded.position)
        return Restored(state, dropped=dict(decoded.dropped))

    async def save(self, partition_id: str, data: bytes, position: int) -> bool:
        """Write the state at ``position``; False when a newer one is already there (nothing written)."""
        if partition_id in self._frozen:
            return False
        blob = self._blob(partition_id)
        for _attempt in range(3):
            etag = self._etags.get(partition_id)
            conditions: dict[str, Any] = {"if_match": etag} if etag else {"if_none_match": "*"}
            try:
                result = await blob.upload_blob(
                    data, overwrite=True, metadata={POSITION_KEY: str(position)},
                    content_settings=ContentSettings(content_type="application/gzip"), **conditions)
            except ResourceNotFoundError:  # deleted since we read it: write it anew
                self._etags[partition_id] = None
                continue
            except (ResourceModifiedError, ResourceExistsError):
                try:
                    properties = await blob.get_blob_properties()
                except ResourceNotFoundError:
                    self._etags[partition_id] = None
                    continue
                theirs = int((properties.metadata or {}).get(POSITION_KEY, "-1"))
                if theirs >= position:
                    return False
                self._etags[partition_id] = properties.etag  # an older write behind ours: overwrite it
                continue
            self._etags[partition_id] = result.get("etag")
            return True
        return False

    def forget(self, partition_id: str) -> None:
        self._etags.pop(partition_id, None)
        self._names.pop(partition_id, None)
        self._frozen.discard(partition_id)
