"""Azure's own copy of the scheduled events (Event Grid): read, folded, reconciled with the sidecars.

The pure core, a module per step: ``reader`` (with ``fields``: a received message to ``PlatformEvent`` values, or
None when it is not Event Grid's), ``records`` (per EventId, statuses only moving forward, duplicates applied once
and their copies kept, retention), ``counting`` (the once-only rules, ``COUNTING`` and ``COVERAGE``, and what they
add), ``saved`` (a picture as JSON with named fields and back), ``coverage`` (per EventId and VM: observed, missed,
imds_unreachable, no_sidecar; and the reverse) and ``exposition`` (the gauges, a prometheus-client collector). The
fleet's side of it, with I/O: ``hubs``, ``homes``, ``partitions``, ``saving`` and ``service``.

How a consumer tells the two streams apart, per received message: ``read_platform`` first (a sidecar's document
costs it one look at the bytes, no parsing); None means not Event Grid's, for ``message.read_message``.
"""

from __future__ import annotations

from se_exporter.fleet.platform.coverage import (
    COVERAGE_BOUND_NAMES,
    COVERAGES,
    MISSED_REASONS,
    Coverage,
    Reconciler,
    ReconcileSettings,
    Reconciliation,
)
from se_exporter.fleet.platform.exposition import PlatformCollector, platform_families
from se_exporter.fleet.platform.reader import (
    DEFAULT_PLATFORM_BOUNDS,
    EVENT_TYPE,
    PLATFORM_BOUND_NAMES,
    PLATFORM_INVALID_REASONS,
    PlatformBounds,
    PlatformEvent,
    PlatformMessage,
    looks_like_platform,
    read_platform,
)
from se_exporter.fleet.platform.records import (
    DEFAULT_LIMITS,
    PICTURE_BOUND_NAMES,
    ApplyResult,
    PictureState,
    PlatformLimits,
    PlatformPicture,
    PlatformRecord,
    merge,
)
from se_exporter.fleet.platform.saved import record_from_json, record_to_json, state_from_json, state_to_json

__all__ = [
    "COVERAGES",
    "COVERAGE_BOUND_NAMES",
    "DEFAULT_LIMITS",
    "DEFAULT_PLATFORM_BOUNDS",
    "EVENT_TYPE",
    "MISSED_REASONS",
    "PICTURE_BOUND_NAMES",
    "PLATFORM_BOUND_NAMES",
    "PLATFORM_INVALID_REASONS",
    "ApplyResult",
    "Coverage",
    "PictureState",
    "PlatformBounds",
    "PlatformCollector",
    "PlatformEvent",
    "PlatformLimits",
    "PlatformMessage",
    "PlatformPicture",
    "PlatformRecord",
    "ReconcileSettings",
    "Reconciler",
    "Reconciliation",
    "looks_like_platform",
    "merge",
    "platform_families",
    "read_platform",
    "record_from_json",
    "record_to_json",
    "state_from_json",
    "state_to_json",
]
