"""``se-exporter fleet``: the other end of forwarding, one live picture of every VM from the Event Hub.

    settings.py    the command's options (the Event Hubs ones come from ``infra/options.py``)
    message.py     a forwarded message read and checked: every property by type and range, the body by the
                   sidecar's parser, the partition-key rule, the bounds on what is kept per VM
    picture.py     the pure core: the latest document per VM, ordering, duplicates, expiry, bounds per partition
    stateformat.py the per-partition state as bytes and back, every field checked on the way in
    collector.py   the metrics: state families built per scrape, and the consumer's counters
    statestore.py  where each partition's state lives between owners: the interface, and an in-memory store
    blobstate.py   the state store in Blob Storage, beside the SDK's checkpoints
    partition.py   one owned partition: made whole on claim, dropped whole on loss
    persistence.py a partition's state restored before it is read, written before its checkpoint
    report.py      counters and log lines throttled per kind
    consumer.py    the SDK's callbacks, the periodic tasks, what the endpoints report
    main.py        the official async consumer client with the Blob checkpoint store; wiring, HTTP, signals

Replicas in one consumer group split the hub's partitions through the SDK's load balancing over the
checkpoint store. A replica shows only the VMs of the partitions it owns right now, so the sum over
replicas counts every VM once.
"""
