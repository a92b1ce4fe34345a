"""Azure's own copy of the scheduled events (Event Grid): read, folded, reconciled with the sidecars.

The pure core, a module per step: ``reader`` (with ``fields``: a received message to ``PlatformEvent`` values, or
None when it is not Event Grid's), ``records`` (per EventId, statuses only moving forward, duplicates applied once
and their copies kept, retention), ``counting`` (the once-only rules, ``COUNTING`` and ``COVERAGE``, and what they
add), ``saved`` (a picture as JSON with named fields and back), ``coverage`` (per EventId and VM: observed, missed,
imds_unreachable, no_sidecar; and the reverse) and ``exposition`` (the gauges, a prometheus-client collector). The
fleet's side of it, with I/O: ``partitions`` (reads a hub's messages first, one per hub), ``hubs`` (a hub's owned
partitions and the others' blobs read back), ``homes`` (each EventId's home partition, what was counted of it),
``saving`` (a partition's blob) and ``service`` (merging, judging, counting: the reconciliation loop).

How a consumer tells the two streams apart, per received message: ``read_platform`` first (a sidecar's document
costs it one look at the bytes, no parsing); None means not Event Grid's, for ``message.read_message``.
"""
