"""Each partition's fleet state as one block blob beside the SDK's checkpoint blobs, in the same container.

Why state rather than re-reading a window of the hub on start: the state is a fold of the partition's events, so a
snapshot at sequence number P plus the events after P is the whole picture, however long ago a quiet VM last spoke;
a window would have to span the VM expiry and would still lose every VM that sent nothing inside it.

The rules every store shares are ``statestore.StateStore``'s; this module is the Blob Storage side: the position in
the blob's metadata, every commit conditional on the ETag last seen, and a block list naming a block the blob does
not have refused by the service (the write becomes a base).
"""

from __future__ import annotations

from typing import Any

from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import ContentSettings
from azure.storage.blob.aio import ContainerClient

from se_exporter.fleet.message import DEFAULT_BOUNDS, Bounds
from se_exporter.fleet.stateformat import DamagedState
from se_exporter.fleet.statestore import Commit, Restored, StateStore, state_blob_name

__all__ = ["MAX_STATE_BLOB_BYTES", "POSITION_KEY", "Restored", "StateBlobs", "state_blob_name"]
MAX_STATE_BLOB_BYTES = 128 * 1024**2  # gzip'd; 100,000 VMs of ordinary documents are a few MB
POSITION_KEY = "sequencenumber"  # the same metadata name the checkpoint store uses for its position
GZIP = ContentSettings(content_type="application/gzip")


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
