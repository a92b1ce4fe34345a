"""What the fleet reads of a received event besides its body and properties, taken from the SDK's raw AMQP message.

``EventData.enqueued_time`` makes a datetime from the enqueued-time annotation on every access, and
``EventData.message_id`` first asks the message's AMQP properties for their length (which lists every field);
per event, at the fleet's rate of one heartbeat per VM every few minutes, the two were a tenth of the batch
handler's CPU (``scripts/fleet_scale_bench.py``, steady state). The same values are read here from the raw AMQP
message (``EventData.raw_amqp_message``, public), and from the event's own properties when it has none (a test's
stand-in).
"""

from __future__ import annotations

from typing import Any

ENQUEUED_TIME = b"x-opt-enqueued-time"  # milliseconds since the epoch, as Event Hubs annotates every event
# What the receiver learns of the partition's newest event with each delivery (the SDK's
# ``track_last_enqueued_event_properties``), as delivery annotations of the message received.
NEWEST_SEQUENCE = b"last_enqueued_sequence_number"
NEWEST_TIME = b"last_enqueued_time_utc"  # milliseconds since the epoch


def enqueued_at(event: Any) -> float | None:
    """When Event Hubs enqueued the event, as unix time (what ``enqueued_time.timestamp()`` gives); None unknown."""
    raw = getattr(event, "raw_amqp_message", None)
    if raw is None:
        enqueued = event.enqueued_time
        return float(enqueued.timestamp()) if enqueued else None
    stamp = (raw.annotations or {}).get(ENQUEUED_TIME)
    return float(stamp) / 1000 if stamp else None


def message_id(event: Any) -> Any:
    """The message id as sent (bytes, text or another AMQP type; None without one). Not decoded here: the reader
    decodes it as the SDK would and bounds it (``message.read_message``)."""
    raw = getattr(event, "raw_amqp_message", None)
    if raw is None:
        return event.message_id
    properties = raw.properties
    return properties.message_id if properties is not None else None


def newest(event: Any, context: Any) -> tuple[int, float | None] | None:
    """The partition's newest sequence number and its enqueue time (unix time; None unknown) as delivered with
    ``event``; None when not known. ``PartitionContext.last_enqueued_event_properties`` says the same, but builds a
    dict and two datetimes from them at every batch (which, at one heartbeat a batch, is one event each): read
    from the raw message's delivery annotations, and from the context when the event has no raw message (a test's
    stand-in)."""
    raw = getattr(event, "raw_amqp_message", None)
    if raw is None:
        properties = context.last_enqueued_event_properties
        if not properties or properties.get("sequence_number") is None:
            return None
        stamp = properties.get("enqueued_time")
        return int(properties["sequence_number"]), stamp.timestamp() if stamp is not None else None
    annotations = raw.delivery_annotations
    sequence = annotations.get(NEWEST_SEQUENCE) if annotations else None
    if sequence is None:
        return None
    stamp = annotations.get(NEWEST_TIME)
    return int(sequence), float(stamp) / 1000 if stamp else None
