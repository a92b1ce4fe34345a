"""`se-exporter consume` against the AMQP test server through the official SDK."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from azure.eventhub import EventHubConsumerClient
from proton import Message, char, decimal32

from tests.support.eventhubs_server import EventHubsTestServer, Store
from tests.support.fleet_helpers import EMPTY, envelope_for, event_data, send, vm_identity
from tests.support.helpers import free_port, wait_until

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


def test_a_map_with_a_binary_key_and_a_list_holding_nan_do_not_stop_consume(
        hubs: Callable[..., EventHubsTestServer]) -> None:
    """A message whose properties are a map with a binary key and a list holding a NaN double (any producer may send
    them) is one strict JSON line, and the message after it is printed too: json.dumps raised inside on_event, and
    the SDK read the partition again from the start, the same message first, for ever."""
    hub = hubs(Store(partition_count=1))
    odd = envelope_for(vm_identity(1), EMPTY, 1, "odd")
    message = Message(body=EMPTY, id=odd.message_id, properties={
        **odd.properties, "map": {b"\x00binary": 1, "text": [b"\xff"]}, "list": [1.5, float("nan")]})
    message.annotations = {"x-opt-partition-key": odd.partition_key}
    hub.store.append("0", message, odd.partition_key)
    send(hub.connection_string(), [event_data(envelope_for(vm_identity(2), EMPTY, 1, "after"))])

    result = consume_two(hub)
    lines = [json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
             for line in result.stdout.splitlines()]
    assert len(lines) == 2, result.stderr[-2000:]
    assert lines[0]["properties"]["map"] == {"\x00binary": 1, "text": ["\ufffd"]}
    assert lines[0]["properties"]["list"] == [1.5, "nan"]
    assert lines[1]["properties"]["vm_name"] == vm_identity(2).name
    assert len(consume_two(hub, "timeline").stdout.splitlines()) == 2


def test_a_hub_it_cannot_reach_exits_1_with_one_line_saying_why() -> None:
    """A hub nobody answers for: nothing on stdout, exit 1 and one line naming the hub and the reason, with the
    key redacted, well before --idle-timeout (which it used to wait out, then exit 0 having read nothing)."""
    address = f"Endpoint=sb://127.0.0.1:{free_port()};SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0a2V5;" \
              "UseDevelopmentEmulator=true;EntityPath=nowhere"
    result = run_consume(address, "--idle-timeout", "120")
    assert (result.returncode, result.stdout) == (1, ""), result.stderr[-2000:]
    (line,) = result.stderr.splitlines()
    assert line.startswith("se-exporter: error: consume could not reach Event Hub 'nowhere': ")
    assert "Connect call failed" in line
    assert "c2VjcmV0a2V5" not in line


def test_a_consumer_group_another_reader_holds_exits_1_naming_it(hubs: Callable[..., EventHubsTestServer]) -> None:
    """With a reader that has an owner level (as the fleet's replicas read) holding $Default, consume of $Default
    prints no document and exits 1 with one line naming the consumer group and --consumer-group, instead of two raw
    SDK lines and exit 0 once --idle-timeout passed."""
    hub = hubs(Store(partition_count=2))
    for partition in ("0", "1"):
        send(hub.connection_string(), [event_data(envelope_for(vm_identity(int(partition)), EMPTY, 1, "held"))],
             partition_id=partition)
    holder = EventHubConsumerClient.from_connection_string(hub.connection_string(), consumer_group="$Default")
    read: set[str] = set()
    reading = threading.Thread(target=holder.receive, daemon=True, kwargs={
        "on_event": lambda context, event: read.add(context.partition_id), "owner_level": 1,
        "starting_position": "-1"})
    reading.start()
    try:
        wait_until(lambda: read == {"0", "1"}, timeout=60, what="the holder reading both partitions")
        started = time.monotonic()
        result = run_consume(hub.connection_string(), "--idle-timeout", "100")
        assert time.monotonic() - started < 100
    finally:
        holder.close()
        reading.join(timeout=30)
    assert (result.returncode, result.stdout) == (1, ""), result.stderr[-2000:]
    (line,) = result.stderr.splitlines()
    assert line.startswith("se-exporter: error: consume could not read partition ")
    assert "another reader holds consumer group '$Default'" in line and line.endswith("--consumer-group NAME")


def test_an_empty_hub_stops_at_the_idle_timeout_with_exit_0(hubs: Callable[..., EventHubsTestServer]) -> None:
    """A hub it can read that holds nothing: nothing printed, exit 0 once --idle-timeout passed with every
    partition's receiver open."""
    hub = hubs(Store(partition_count=2))
    result = run_consume(hub.connection_string(), "--idle-timeout", "0.5")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def run_consume(connection_string: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "se_exporter", "consume", "--format", "json", *args,
                           "--eventhub-connection-string", connection_string],
                          capture_output=True, text=True, timeout=150, check=False)


def consume_two(hub: EventHubsTestServer, form: str = "json") -> subprocess.CompletedProcess[str]:
    """``se-exporter consume`` of the hub's first two messages, JSON lines unless ``form`` says; it exits 0."""
    result = subprocess.run([sys.executable, "-m", "se_exporter", "consume", "--format", form, "--max-events", "2",
                             "--idle-timeout", "20", "--eventhub-connection-string", hub.connection_string()],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result
