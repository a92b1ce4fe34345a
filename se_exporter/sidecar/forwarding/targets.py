"""Every forwarding target in one table: what turns it on and how it is built.

The settings check (a heartbeat needs a target), the assembly and the docs read ``TARGETS``; a new target is one row
here and one module with a ``Target`` (``accept``, ``close``), which ``ForwardSink`` then feeds through a batching
processor of its own (queue, retries with backoff, drop-oldest counted) like every other. Each row imports its module
only when the target is on, so a sidecar without Event Hubs never loads its SDK.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from se_exporter.sidecar.forwarding.envelope import Sequencer
    from se_exporter.sidecar.forwarding.forward import ForwardMetrics, Target
    from se_exporter.sidecar.settings import Settings
    from se_exporter.sidecar.statedir import StateDir

log = logging.getLogger("se_exporter.forward")


@dataclass(frozen=True)
class TargetRow:
    name: str  # the ``sink`` label of the forwarding metrics
    given_by: str  # the flags that turn it on, as messages name them
    enabled: Callable[[Settings], bool]
    build: Callable[[Settings, StateDir, ForwardMetrics, Sequencer], Target]


def _file(settings: Settings, state_dir: StateDir, metrics: ForwardMetrics, sequencer: Sequencer) -> Target:
    from se_exporter.sidecar.forwarding.forward_file import FileTarget  # noqa: PLC0415 - only when the target is on

    assert settings.forward_file is not None  # enabled() said so
    target = FileTarget(settings.forward_file, metrics)
    sequencer.advance_past(target.last_sequence)  # numbers used while forwarding.json could not be saved
    log.info("forwarding documents to the file %s", settings.forward_file.resolve())
    return target


def _eventhubs(settings: Settings, state_dir: StateDir, metrics: ForwardMetrics, sequencer: Sequencer) -> Target:
    from se_exporter.infra.azure.clients import producer_factory  # noqa: PLC0415 - the SDK only with Event Hubs
    from se_exporter.sidecar.forwarding.eventhubs import EventHubsTarget  # noqa: PLC0415
    from se_exporter.sidecar.forwarding.spool import Spool  # noqa: PLC0415

    spool = Spool(state_dir.spool, settings.spool_max_bytes, on_drop=metrics.dropped.inc)
    sequencer.advance_past(spool.last_sequence)
    metrics.spool_documents.set_function(spool.__len__)
    metrics.spool_bytes.set_function(lambda: spool.size_bytes)
    target = EventHubsTarget(spool, producer_factory(
        settings.eventhub_connection_string, settings.eventhub_name, settings.eventhub_namespace,
        settings.eventhub_client_id, endpoint=settings.eventhub_endpoint, ca_file=settings.eventhub_ca_file),
        metrics, send_timeout=settings.eventhub_send_timeout, max_retry_wait=settings.eventhub_retry_max)
    where = settings.eventhub_namespace or "the namespace of the connection string"
    if settings.eventhub_endpoint:
        where += f" through {settings.eventhub_endpoint}"
    log.info("forwarding documents to Event Hubs (%s), spooled in %s", where, state_dir.spool.resolve())
    return target


TARGETS: tuple[TargetRow, ...] = (
    TargetRow("file", "--forward-file", lambda settings: settings.forward_file is not None, _file),
    TargetRow("eventhubs", "--eventhub-connection-string or --eventhub-namespace",
              lambda settings: settings.eventhubs_enabled, _eventhubs),
)


def enabled_targets(settings: Settings) -> tuple[TargetRow, ...]:
    return tuple(row for row in TARGETS if row.enabled(settings))


def target_flags() -> str:
    """What turns forwarding on, for a message: every row's flags."""
    return ", or ".join(row.given_by for row in TARGETS)
