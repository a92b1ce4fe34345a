"""Forwarding: every changed document (and heartbeat) as one envelope to every target in ``targets.py`` (the file,
Event Hubs through the spool), each fed by the sinks' batching processor."""
