"""One hub's platform side as the consumer sees it: ``consumer.FirstReader`` (claim, handle, release) and
``persistence.AttachedState`` (the partition's platform blob, written before its VM state and so before the checkpoint).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from azure.eventhub.aio import PartitionContext

from se_exporter.fleet.collector import FleetMetrics
from se_exporter.fleet.message import InvalidMessage
from se_exporter.fleet.persistence import until_read
from se_exporter.fleet.platform.homes import Homes
from se_exporter.fleet.platform.hubs import HubPlatform, OwnedPlatform
from se_exporter.fleet.platform.reader import read_platform
from se_exporter.fleet.platform.records import PictureState, PlatformLimits, PlatformPicture
from se_exporter.fleet.platform.saving import decode_platform, encode_platform, platform_blob_name
from se_exporter.fleet.report import Report
from se_exporter.infra.logs import fields

log = logging.getLogger("se_exporter.fleet")


class Owner(Protocol):
    """What a reader needs of the replica's platform side, ``service.Platform``: named here, not imported from it."""

    metrics: FleetMetrics
    report: Report
    limits: PlatformLimits
    max_bytes: int
    hubs: dict[str, HubPlatform]
    homes: Homes
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[object]]

    def report_bounds(self, picture: PlatformPicture, before: dict[str, int]) -> None: ...

    def note_applied(self) -> None: ...


class PlatformReader:
    """One hub's platform side, as ``consumer.Service.first_reader`` and ``persistence.PartitionPersistence.beside``."""

    def __init__(self, platform: Owner, side: HubPlatform) -> None:
        self._platform = platform
        self._side = side

    async def claim(self, context: PartitionContext) -> None:
        """Restore the partition's picture (and a home's counting) before it is read, retried as the VM state is."""
        partition_id, side, platform = context.partition_id, self._side, self._platform
        side.prefix = (context.fully_qualified_namespace, context.eventhub_name, context.consumer_group)
        side.store.name(partition_id, platform_blob_name(*side.prefix, partition_id))
        side.forget_peer(partition_id)
        data = await until_read(lambda: side.store.fetch(partition_id), platform.report,
                                f"platform-restore:{side.role}:{partition_id}",
                                f"partition {partition_id}: cannot read its platform picture", platform.sleep)
        held = side.held[partition_id] = OwnedPlatform(checking=context)
        if data is None:
            return
        loaded = decode_platform(data, partition_id)
        if loaded.damaged is not None:
            platform.metrics.state_damaged.labels(loaded.damaged).inc()
            platform.report.once(f"platform-damaged:{partition_id}", logging.ERROR,
                                  "partition %s: the stored platform picture is damaged (%s); starting it from the "
                                  "partition's checkpoint alone", partition_id, loaded.problem,
                                  extra=fields(partition_id=partition_id, reason=loaded.damaged))
            return
        if loaded.rows:
            platform.metrics.state_damaged.labels("row").inc(loaded.rows)
        held.restored, held.judged = loaded.position, loaded.judged
        if loaded.state is not None and (loaded.state.records or loaded.state.ids or loaded.state.forgotten):
            held.picture = PlatformPicture.restored(loaded.state, platform.limits)
        if side.role == platform.homes.role:
            held.counted = loaded.memory
        log.info("partition %s: platform picture restored: %d events", partition_id,
                 len(loaded.state.records) if loaded.state else 0, extra=fields(partition_id=partition_id))

    def handle(self, partition_id: str, sequence_number: int, body: bytes, enqueued: float) -> str | None:
        platform = self._platform
        read = read_platform(body, platform.max_bytes, enqueued)  # InvalidMessage: counted by the Service
        if read is None:
            return None
        if self._side.role == "sidecar" and "platform" in platform.hubs:
            # Every VM may send to the sidecars' hub: Azure's copy is believed only from the hub Event Grid
            # delivers to, or a compromised VM could end a real event early or announce one naming every VM.
            raise InvalidMessage("platform_on_sidecars_hub", "an Event Grid event on the sidecars' hub, while "
                                 "--platform-eventhub-* names the platform's own: not applied")
        held = self._side.held.get(partition_id) or self._side.held.setdefault(partition_id, OwnedPlatform())
        if held.restored is not None and sequence_number <= held.restored and self._replayed(held, partition_id):
            return "replayed"
        metrics, report = platform.metrics, platform.report
        for reason, line in read.skipped:
            metrics.invalid.labels(reason).inc()
            report.once(f"invalid:{reason}", logging.WARNING, "platform message partly skipped (partition %s, "
                        "sequence number %d): %s", partition_id, sequence_number, line,
                        extra=fields(reason=reason, partition_id=partition_id))
        for bound in read.bounds:
            report.bound_hit(bound)
        if read.warnings:
            metrics.warnings.labels("platform_event").inc(len(read.warnings))
        picture = held.picture = held.picture or PlatformPicture(platform.limits)
        before, now = picture.bound_hits.copy(), platform.clock()
        for event in read.events:
            picture.apply(event, now)  # a duplicate is counted by its EventId's home, from the merged record
        if picture.bound_hits != before:  # rarely: one comparison in C per message, not a loop over the bounds
            platform.report_bounds(picture, before)
        held.changes += 1
        platform.note_applied()
        return "platform"

    def _replayed(self, held: OwnedPlatform, partition_id: str) -> bool:
        """Whether the restored position holds. Past the partition's newest event (a hub recreated under the same
        name) it is damage, as the VM state's is to ``Fleet.check_restored``: counted and forgotten, so the new
        hub's messages are applied. Checked once, when the newest event is known: it only grows."""
        properties = held.checking.last_enqueued_event_properties if held.checking is not None else None
        newest = properties.get("sequence_number") if properties else None
        if newest is None or held.restored is None:
            return True
        held.checking = None
        if held.restored <= int(newest):
            return True
        self._platform.metrics.state_damaged.labels("position").inc()
        log.error("partition %s: the stored platform picture claims sequence number %d, past the partition's "
                  "newest event %d; its position is ignored and every platform message from the checkpoint on is "
                  "applied", partition_id, held.restored, int(newest), extra=fields(partition_id=partition_id))
        held.restored = None
        return False

    def release(self, partition_id: str) -> None:
        self._side.held.pop(partition_id, None)
        self._side.store.forget(partition_id)  # its EventIds' counting is the next owner's, from the blob

    def dirty(self, partition_id: str) -> bool:
        held = self._side.held.get(partition_id)
        return held is not None and held.changes != held.written

    def prepare(self, partition_id: str, position: int) -> Callable[[], Awaitable[bool]] | None:
        if not self.dirty(partition_id):
            return None
        held = self._side.held[partition_id]
        state = held.picture.state() if held.picture is not None else PictureState()
        data = encode_platform(partition_id, position, state, held.counted, held.judged)
        changes, pending = held.changes, held.pending
        held.pending = []

        async def write() -> bool:
            written = False
            try:
                written = await self._side.store.save_blocks(partition_id, position, lambda _block: data, None)
            finally:
                if written:
                    held.written = changes
                    for apply in pending:  # remembered in the blob now: counted here, and never by a next owner
                        apply()
                else:  # written by a later round (or dropped with the partition, for its next owner to count)
                    held.pending[:0] = pending
            return written

        return write
