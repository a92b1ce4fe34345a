"""What the fleet reads of a received event straight from its raw AMQP message is what the SDK's EventData says."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from azure.eventhub import EventData
from azure.eventhub.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType, AmqpMessageProperties

from se_exporter.fleet.message import read_message
from se_exporter.fleet.received import delivery, enqueued_at
from tests.fleet.test_vms import EMPTY, VM_ID, props


def received(message_id: Any = b"inst:1", enqueued_ms: Any = 1_795_316_668_024, with_properties: bool = True,
             application: Any = None, without: tuple[bytes, ...] = ()) -> EventData:
    given: dict[str | bytes, Any] = {b"x-opt-sequence-number": 7, b"x-opt-partition-key": b"vm-1"}
    annotations = {key: value for key, value in given.items() if key not in without}
    if enqueued_ms is not None:
        annotations[b"x-opt-enqueued-time"] = enqueued_ms
    event = EventData(EMPTY)  # a received event's parts set through the public raw message the SDK reads them from
    raw = event.raw_amqp_message
    raw.annotations = annotations
    raw.application_properties = props(1) if application is None else application
    raw.properties = AmqpMessageProperties(message_id=message_id) if with_properties else None
    return event


@pytest.mark.parametrize("enqueued_ms", [1_795_316_668_024, 1_795_316_668_999, 1, 0, None])
def test_the_enqueued_time_is_the_sdks_to_the_last_bit(enqueued_ms: Any) -> None:
    """The annotation's milliseconds over 1000 are exactly ``enqueued_time.timestamp()`` (None where the SDK has
    no time)."""
    event = received(enqueued_ms=enqueued_ms)
    expected = event.enqueued_time.timestamp() if event.enqueued_time else None
    assert enqueued_at(event) == expected
    assert repr(enqueued_at(event)) == repr(expected)


@pytest.mark.parametrize("sent", [b"inst:1", "inst:1", b"\xff\xfeinst:1", 42, None])
def test_the_message_id_reads_as_the_sdks_once_bounded(sent: Any) -> None:
    """Raw or through ``EventData.message_id``, a message id (text, bytes that are not UTF-8, a number, none) reads
    the same once the reader has bounded it: the same document, or the same refusal."""
    for event in (received(message_id=sent), received(message_id=sent, with_properties=sent is not None)):
        def read(identifier: Any) -> Any:
            try:
                return read_message(EMPTY, props(1), identifier, VM_ID.encode(), 1.0, 1 << 20).message_id
            except Exception as error:  # the same refusal either way
                return type(error), str(error)

        assert read(delivery(event).message_id) == read(event.message_id)
        if isinstance(sent, (str, bytes)):  # a document read (a number is no '<installation>:<sequence>')
            assert read(delivery(event).message_id) == (sent.decode(errors="replace") if isinstance(sent, bytes)
                                                        else str(sent))


@pytest.mark.parametrize("event", [
    received(), received(enqueued_ms=None, with_properties=False), received(application={}),
    received(without=(b"x-opt-sequence-number", b"x-opt-partition-key"))])
def test_a_delivery_says_what_the_sdks_event_data_says(event: EventData) -> None:
    """Each part of an event read once from its raw message is what the SDK's own properties give (application
    properties: empty where the SDK says none)."""
    read = delivery(event)
    assert read.sequence_number == event.sequence_number
    assert read.enqueued_at == enqueued_at(event)
    assert read.body_type == event.body_type
    if event.body_type == AmqpMessageBodyType.DATA:
        sent: Any = event.body  # the SDK types a body as any primitive; a data body is bytes sections
        assert b"".join(read.body) == b"".join(sent)
    assert read.properties == (event.properties or {})
    assert read.message_id == (event.raw_amqp_message.properties.message_id
                               if event.raw_amqp_message.properties is not None else None)
    assert read.partition_key == event.partition_key


def test_a_value_body_is_read_as_one() -> None:
    """An AMQP value body (not a data body) reads as the value it is, numbered as annotated."""
    raw = AmqpAnnotatedMessage(value_body={"not": "data"}, annotations={b"x-opt-sequence-number": 9})
    read = delivery(SimpleNamespace(raw_amqp_message=raw))
    assert (read.sequence_number, read.body_type, read.body) == (9, AmqpMessageBodyType.VALUE, {"not": "data"})
