"""``se-exporter fleet``: the other end of forwarding, one live picture of every VM from the Event Hub.

    settings.py   the command's options (the Event Hubs ones shared with ``run`` and ``consume``)
    state.py      the pure core: a forwarded message read and checked, the latest document per VM,
                  ordering, duplicates, expiry, the per-partition state as bytes and back
    collector.py  the metrics: state families built per scrape, and the consumer's counters
    blobstate.py  the per-partition state kept in Blob Storage beside the SDK's checkpoints
    consumer.py   the official async consumer client with the Blob checkpoint store; wiring, HTTP, signals

Replicas in one consumer group split the hub's partitions through the SDK's load balancing over the
checkpoint store. A replica shows only the VMs of the partitions it owns right now, so the sum over
replicas counts every VM once.
"""
