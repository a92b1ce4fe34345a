"""`se-exporter consume` against the AMQP test server through the official SDK."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from proton import Message, char, decimal32

from tests.eventhubs_server import EventHubsTestServer, Store
from tests.fleet_helpers import EMPTY, envelope_for, event_data, send, vm_identity

pytestmark = pytest.mark.integration


def test_a_message_with_amqp_char_and_decimal_properties_does_not_stop_consume(
        hubs: Callable[..., EventHubsTestServer]) -> None:
    """A message whose properties are AMQP char and decimal32 (the SDK's decoder has no entry for them) is printed
    like any other, and the message after it too: consume installs the same decoders as the fleet."""
    hub = hubs(Store(partition_count=1))
    odd = envelope_for(vm_identity(1), EMPTY, 1, "char")
    message = Message(body=EMPTY, id=odd.message_id,
                      properties={**odd.properties, "shard": char("a"), "weight": decimal32(0x3280007B)})
    message.annotations = {"x-opt-partition-key": odd.partition_key}
    hub.store.append("0", message, odd.partition_key)
    send(hub.connection_string(), [event_data(envelope_for(vm_identity(2), EMPTY, 1, "after"))])

    result = consume_two(hub)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 2, result.stderr[-2000:]  # before the fix: none, the link failed on the char for ever
    assert lines[0]["message_id"] == odd.message_id
    assert lines[0]["properties"]["shard"] == "a"
    assert lines[1]["properties"]["vm_name"] == vm_identity(2).name


def test_a_message_that_is_not_utf8_with_a_nan_property_does_not_stop_consume(
        hubs: Callable[..., EventHubsTestServer]) -> None:
    """Another producer's message, its body not UTF-8 and a property a NaN double, is one strict JSON line, and the
    message after it is printed too (a raise in on_event made the SDK read the partition again from the start)."""
    hub = hubs(Store(partition_count=1))
    odd = envelope_for(vm_identity(1), EMPTY, 1, "odd")
    message = Message(body=b"\xff\xfe not UTF-8", id=odd.message_id, properties={**odd.properties, "w": float("nan")})
    message.annotations = {"x-opt-partition-key": odd.partition_key}
    hub.store.append("0", message, odd.partition_key)
    send(hub.connection_string(), [event_data(envelope_for(vm_identity(2), EMPTY, 1, "after"))])

    result = consume_two(hub)
    lines = [json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
             for line in result.stdout.splitlines()]
    assert len(lines) == 2, result.stderr[-2000:]
    assert lines[0]["body"] == "\ufffd\ufffd not UTF-8" and lines[0]["properties"]["w"] == "nan"
    assert lines[1]["properties"]["vm_name"] == vm_identity(2).name


def test_a_hostile_message_prints_one_visibly_escaped_timeline_line(
        hubs: Callable[..., EventHubsTestServer]) -> None:
    """A message whose vm_name holds ESC/BEL sequences and a newline (anyone with Send rights can send it) prints
    one timeline line with those characters spelt out, and the next message its own line: the terminal is neither
    retitled nor cleared, and no line is forged for a VM that sent nothing."""
    hub = hubs(Store(partition_count=1))
    odd = envelope_for(vm_identity(1), EMPTY, 1, "odd")
    forged = "web_1\x1b]0;owned\x07\x1b[2J\n2026-01-01T00:00:00.000Z web_9 #1 incarnation 1: no events"
    message = Message(body=EMPTY, id=odd.message_id, properties={**odd.properties, "vm_name": forged})
    message.annotations = {"x-opt-partition-key": odd.partition_key}
    hub.store.append("0", message, odd.partition_key)
    send(hub.connection_string(), [event_data(envelope_for(vm_identity(2), EMPTY, 1, "after"))])

    lines = consume_two(hub, "timeline").stdout.splitlines()
    assert len(lines) == 2 and not any(char in "".join(lines) for char in "\x1b\x07")
    assert " web_1\\x1b]0;owned\\x07\\x1b[2J\\n2026-01-01T00:00:00.000Z web_9 #1 incarnation 1: no events #" in lines[0]
    assert f" {vm_identity(2).name} #" in lines[1]


def consume_two(hub: EventHubsTestServer, form: str = "json") -> subprocess.CompletedProcess[str]:
    """``se-exporter consume`` of the hub's first two messages, JSON lines unless ``form`` says; it exits 0."""
    result = subprocess.run([sys.executable, "-m", "se_exporter", "consume", "--format", form, "--max-events", "2",
                             "--idle-timeout", "20", "--eventhub-connection-string", hub.connection_string()],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result
