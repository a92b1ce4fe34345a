"""What the fleet reads of a received event straight from its raw AMQP message is what the SDK's EventData says."""

from __future__ import annotations

from typing import Any

import pytest
from azure.eventhub import EventData
from azure.eventhub._pyamqp.message import Message, Properties  # the SDK's received message, as its receiver builds it

from se_exporter.fleet.message import read_message
from se_exporter.fleet.received import enqueued_at, message_id
from tests.fleet.test_picture import EMPTY, VM_ID, props


def received(message_id: Any = b"inst:1", enqueued_ms: Any = 1_795_316_668_024, with_properties: bool = True,
             ) -> EventData:
    annotations = {b"x-opt-sequence-number": 7, b"x-opt-partition-key": b"vm-1"}
    if enqueued_ms is not None:
        annotations[b"x-opt-enqueued-time"] = enqueued_ms
    message = Message(data=[EMPTY], application_properties=props(1), message_annotations=annotations,
                      properties=Properties(message_id=message_id) if with_properties else None)
    return EventData._from_message(message)


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

        assert read(message_id(event)) == read(event.message_id)
        if isinstance(sent, (str, bytes)):  # a document read (a number is no '<installation>:<sequence>')
            assert read(message_id(event)) == (sent.decode(errors="replace") if isinstance(sent, bytes) else str(sent))
