"""What the fleet reads of a received event besides its body and properties, taken from the SDK's raw AMQP message.

``EventData``'s accessors rebuild their values on every access (a datetime per ``enqueued_time``; ``message_id``
first lists every AMQP property), a measurable share of the batch handler's CPU at one heartbeat per VM every few
minutes (``scripts/fleet_scale_bench.py``): read here from the public ``EventData.raw_amqp_message`` instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

ENQUEUED_TIME = b"x-opt-enqueued-time"  # milliseconds since the epoch, as Event Hubs annotates every event
SEQUENCE_NUMBER = b"x-opt-sequence-number"
PARTITION_KEY = b"x-opt-partition-key"
# What the receiver learns of the partition's newest event with each delivery (the SDK's
# ``track_last_enqueued_event_properties``), as delivery annotations of the message received.
NEWEST_SEQUENCE = b"last_enqueued_sequence_number"
NEWEST_TIME = b"last_enqueued_time_utc"  # milliseconds since the epoch


class Delivery(NamedTuple):
    """One received event as the batch handler reads it, each part read once (``delivery``)."""

    sequence_number: int | None
    enqueued_at: float | None  # unix time, as ``enqueued_at``
    body_type: Any  # ``AmqpMessageBodyType``
    body: Any  # for a data body, its sections (bytes, or an iterable of bytes)
    properties: Mapping[Any, Any]  # the application properties, empty when none
    message_id: Any  # as sent (bytes, text or another AMQP type; None without one): ``read_message`` decodes and
    # bounds it as the SDK's ``EventData.message_id`` would, which first asks the properties for their length
    partition_key: Any


def delivery(event: Any) -> Delivery:
    """What ``EventData``'s properties say (``sequence_number``, ``enqueued_time``, ``body_type``, ``body``,
    ``properties``, ``message_id``, ``partition_key``), read from the raw message at once."""
    raw = event.raw_amqp_message
    annotations = raw.annotations or {}
    properties = raw.properties
    return Delivery(annotations.get(SEQUENCE_NUMBER), _unix(annotations.get(ENQUEUED_TIME)), raw.body_type,
                    raw.body, raw.application_properties or {},
                    properties.message_id if properties is not None else None, annotations.get(PARTITION_KEY))


def enqueued_at(event: Any) -> float | None:
    """When Event Hubs enqueued the event, as unix time (what ``enqueued_time.timestamp()`` gives); None unknown."""
    return _unix((event.raw_amqp_message.annotations or {}).get(ENQUEUED_TIME))


def newest(event: Any) -> tuple[int, float | None] | None:
    """The partition's newest sequence number and its enqueue time (unix time; None unknown) as delivered with
    ``event``; None when not known. ``PartitionContext.last_enqueued_event_properties`` says the same, but builds a
    dict and two datetimes from them at every batch: read from the raw message's delivery annotations."""
    annotations = event.raw_amqp_message.delivery_annotations
    sequence = annotations.get(NEWEST_SEQUENCE) if annotations else None
    if sequence is None:
        return None
    return int(sequence), _unix(annotations.get(NEWEST_TIME))


def _unix(stamp: Any) -> float | None:
    """An annotation's milliseconds since the epoch as unix time (None: absent or zero)."""
    return float(stamp) / 1000 if stamp else None
