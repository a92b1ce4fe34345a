"""One hub's platform side in ``se-exporter fleet``: its owned partitions (``OwnedPlatform``) and what is known of the
others from their blobs (``HubPlatform.read_peers``), so each replica knows every EventId wherever its messages
landed."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from azure.eventhub.aio import PartitionContext

from se_exporter.fleet.message import VmState
from se_exporter.fleet.platform.counting import Counted
from se_exporter.fleet.platform.records import PlatformPicture, PlatformRecord
from se_exporter.fleet.platform.saving import NOT_JUDGED, VmVerdicts, decode_platform, platform_blob_name
from se_exporter.fleet.statestore import StateStore
from se_exporter.fleet.vms import Fleet


def home(key: str, partitions: int) -> str:
    """The partition id of an EventId's home: stable across processes and releases (CRC-32, not ``hash``)."""
    return str(zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions)


@dataclass
class OwnedPlatform:
    """One owned partition's platform side."""

    picture: PlatformPicture | None = None  # None until it holds a platform message (or a stored picture)
    restored: int | None = None  # platform messages at or below this sequence number are in the picture already
    # The claim's context until ``restored`` is checked against the partition's newest event (which only grows).
    checking: PartitionContext | None = None
    changes: int = 0
    written: int = 0  # ``changes`` when last written
    judged: VmVerdicts = NOT_JUDGED  # of the VMs it shows (``counting.COVERAGE``; why kept: ``saving``'s docstring)
    counted: dict[str, Counted] = field(default_factory=dict)  # of the EventIds homed here (``homes``), in the blob
    # Counter increments decided by an EventId's home and remembered here, applied once the blob remembering them is
    # written: a partition lost before that is counted by its next owner instead, so nothing is counted twice.
    pending: list[Callable[[], object]] = field(default_factory=list)


@dataclass
class HubPlatform:
    """What the platform side needs of one hub read: its role, its VMs, its partition count, its blob store."""

    role: str
    fleet: Fleet
    store: StateStore
    partitions: Callable[[], int | None]
    peer_store: StateStore | None = None  # reads the other partitions' pictures (another replica's, or nobody's)
    held: dict[str, OwnedPlatform] = field(default_factory=dict)
    prefix: tuple[str, str, str] | None = None  # (namespace, hub, consumer group), from the first claim
    peers: dict[str, tuple[PlatformRecord, ...]] = field(default_factory=dict)  # partitions not held: their records
    peer_tags: dict[str, str] = field(default_factory=dict)  # the ETag of each peer's blob when read
    peer_judged: dict[str, VmVerdicts] = field(default_factory=dict)  # their ``OwnedPlatform.judged``
    partition_vms: Callable[[], dict[str, list[VmState]]] = dict  # the VMs of each owned partition shown here

    def forget_peer(self, partition_id: str) -> None:
        """What was read of a partition's blob as a peer's: it is gone, or held here now."""
        self.peers.pop(partition_id, None)
        self.peer_tags.pop(partition_id, None)
        self.peer_judged.pop(partition_id, None)

    async def read_peers(self) -> None:
        """Every partition's picture this replica does not hold, from its blob (another replica's, or nobody's): one
        listing, then each blob that changed. An error is raised for the caller to count (the records read stay)."""
        if self.prefix is None or self.peer_store is None:
            return
        store, folder = self.peer_store, platform_blob_name(*self.prefix, "")
        listed = await store.listing(folder)
        for name, tag in listed.items():
            partition_id = name.removeprefix(folder)
            if partition_id in self.held or self.peer_tags.get(partition_id) == tag:
                continue
            store.name(partition_id, name)
            data = await store.fetch(partition_id)
            loaded = decode_platform(data, partition_id) if data is not None else None
            if partition_id not in self.held and loaded is not None and loaded.state is not None:
                self.peers[partition_id] = loaded.state.records
                self.peer_tags[partition_id] = tag
                self.peer_judged[partition_id] = loaded.judged
        for partition_id in [known for known in self.peers
                             if platform_blob_name(*self.prefix, known) not in listed or known in self.held]:
            self.forget_peer(partition_id)
