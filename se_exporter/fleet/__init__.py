"""``se-exporter fleet``: the other end of forwarding, one live picture of every VM from the Event Hub.

Replicas in one consumer group split the hub's partitions through the SDK's load balancing over the checkpoint
store; a replica shows the VMs of the partitions it owns (docs/fleet.md: count distinct VMs over replicas).
"""
