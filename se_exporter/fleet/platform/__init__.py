"""Azure's own copy of the scheduled events (Event Grid): read, folded, reconciled with the sidecars.

The pure core, a module per step: ``reader`` and ``fields`` (a message to ``PlatformEvent`` values), ``records``
(per EventId), ``counting`` (the once-only rules), ``saved`` (a picture as JSON), ``coverage`` (per EventId and VM)
and ``exposition`` (the gauges). With I/O: ``partitions`` (reads a hub's messages first), ``hubs`` (a hub's
partitions and the others' blobs), ``homes`` (each EventId's home), ``saving`` (a partition's blob) and ``service``
(the reconciliation loop). A consumer offers each message to ``read_platform`` before ``message.read_message``.
"""
