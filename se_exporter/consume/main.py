"""``se-exporter consume``: read the forwarded documents back from Event Hubs, to check the pipeline.

Uses the SDK's async consumer (it can be stopped cleanly) and prints each document as it arrives:
``--format timeline`` one line per document grouped by VM, ``--format json`` one object per line. A check that
could not read is not a quiet hub: a hub it cannot reach, or a partition it is refused (another reader holds the
consumer group), ends it with exit 1 and one line on stderr saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sys
from collections.abc import Callable
from typing import Any, TextIO

from se_exporter.consume.settings import ConsumeSettings
from se_exporter.core.errors import InvalidDocument
from se_exporter.core.model import affects_vm, parse_document
from se_exporter.infra.host_os import HOST_OS
from se_exporter.infra.logs import escape, escape_json
from se_exporter.infra.options import starting_position

# The SDK calls on_event with None when a partition's receiver has run this long without a message or an error: the
# sign an idle stop waits for, that the partition can be read. A receiver refused at attach (another reader holds the
# consumer group) fails sooner: 1.7 s after it starts on the suite's AMQP server, well under a second on Azure.
READABLE_AFTER = 3.0


def record(partition_id: str, event: Any) -> dict[str, Any]:
    """One event as plain values. Total over what any producer may send (a raise in ``on_event`` makes the SDK drop
    the partition and read it again from the starting position, the same message first: consume stalled for good):
    every property value, at any depth, through ``plain``; a body that is not UTF-8 is decoded with U+FFFD."""
    key = event.partition_key
    return {"partition_id": partition_id, "sequence_number": event.sequence_number,
            "enqueued_time": event.enqueued_time.isoformat() if event.enqueued_time else None,
            "partition_key": _decoded(key) if key is not None else None, "message_id": plain(event.message_id),
            "properties": plain(event.properties or {}), "body": _body(event)}


def plain(value: Any) -> Any:
    """An AMQP value as what strict JSON holds: maps with text keys, lists, text, finite numbers, booleans, null.
    Binary as UTF-8 (U+FFFD where it is not), a NaN or infinite double as ``nan``/``inf``/``-inf``, any other type
    (decimal, uuid, timestamp, char) as its text; a map key that is not text (binary, a number, null) as its text
    too, and a key that two spell the same way (``"a"`` and binary ``a``) keeps both values, the second as ``a (2)``.
    Iterative, so a value nested as deep as the SDK could decode it cannot exhaust the stack here."""
    root: list[Any] = [None]
    todo: list[tuple[Any, Any, Any]] = [(value, root, 0)]  # (value, container, key or index to write it at)
    while todo:
        item, into, at = todo.pop()
        if isinstance(item, dict):
            made: dict[str, Any] = {}
            for key, inner in item.items():
                text = _key(key)
                name, n = text, 1
                while name in made:
                    n += 1
                    name = f"{text} ({n})"
                made[name] = None
                todo.append((inner, made, name))
            into[at] = made
        elif isinstance(item, (list, tuple)):
            listed: list[Any] = [None] * len(item)
            todo.extend((inner, listed, index) for index, inner in enumerate(item))
            into[at] = listed
        else:
            into[at] = _scalar(item)
    return root[0]


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # NaN and Infinity are not JSON: 'nan', 'inf', '-inf'
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _key(key: Any) -> str:
    text = _scalar(key)
    return text if isinstance(text, str) else json.dumps(text)  # 1 -> "1", True -> "true", None -> "null"


def json_line(item: dict[str, Any]) -> str:
    """``--format json``: one strict JSON object, with what json leaves raw that can disguise a line escaped as log
    lines' JSON is (``logs.escape_json``)."""
    return escape_json(dumps(item))


class _Text(str):
    """Punctuation ``dumps`` writes as it is, told apart from the string values it quotes."""


def dumps(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)`` for what ``plain`` returns, written without recursion: json's own
    encoder recurses once per level, and the SDK decodes values nested nearly as deep as the stack allows.
    ``allow_nan=False``: a value that slipped past ``plain`` is an error here, never a bare ``NaN`` on the line."""
    out: list[str] = []
    todo: list[Any] = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, _Text):
            out.append(item)
        elif isinstance(item, dict):
            parts: list[Any] = [_Text("{")]
            for n, (key, inner) in enumerate(item.items()):
                parts += [_Text((", " if n else "") + json.dumps(str(key), ensure_ascii=False) + ": "), inner]
            todo.extend(reversed([*parts, _Text("}")]))
        elif isinstance(item, list):
            parts = [_Text("[")]
            for n, inner in enumerate(item):
                parts += [_Text(", ")] * bool(n) + [inner]
            todo.extend(reversed([*parts, _Text("]")]))
        else:
            out.append(json.dumps(item, ensure_ascii=False, allow_nan=False))
    return "".join(out)


def timeline_line(item: dict[str, Any]) -> str:
    """``--format timeline``: one line, escaped as log lines are (``logs.escape``). Anyone with Send rights on the hub
    chooses the properties and the body: an ESC, BEL or newline in them must not retitle or clear the terminal nor
    print a second, forged line; it shows as ``\\x1b``, ``\\x07``, ``\\n``."""
    return escape(_timeline(item))


def _timeline(item: dict[str, Any]) -> str:
    props = item["properties"]
    named = props.get("vm_name")
    vm = _text(named) if named else item["partition_key"]
    head = f"{_text(props.get('observed_at', item['enqueued_time']))} {vm} #{_text(props.get('sequence', '?'))}"
    try:
        document = parse_document(item["body"])
    except InvalidDocument as error:
        return f"{head} invalid document: {error}"
    if not document.events:
        return f"{head} incarnation {document.incarnation}: no events"
    parts = []
    for event in document.events:
        when = f" NotBefore {event.not_before.isoformat()}" if event.not_before else ""
        affects = affects_vm(event, vm)
        mine = "" if affects is None else " (this VM)" if affects else " (other VMs)"
        parts.append(f"{event.event_type} {event.event_id} {event.event_status}{when}{mine}")
    return f"{head} incarnation {document.incarnation}: " + "; ".join(parts)


def consume(settings: ConsumeSettings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """0 once it stopped as asked (``--max-events``, ``--idle-timeout``, a stop signal); 1 with one line on ``err``
    when it could not read."""
    position = starting_position(settings.starting_position)
    failure = asyncio.run(_consume(settings, position, out))
    if failure is None:
        return 0
    print(f"se-exporter: error: {failure}", file=err, flush=True)
    return 1


async def _consume(settings: ConsumeSettings, position: Any, out: TextIO) -> str | None:
    """What stopped the reading when it could not read, else None."""
    from se_exporter.infra.azure import amqp_types
    from se_exporter.infra.azure.clients import describe

    amqp_types.install()  # else one message with an AMQP char property stops the reading for good (as in the fleet)
    # Every error the SDK could not retry away reaches on_error, which ends the run with one line: its own warnings
    # about the same error would be raw lines beside it (main() puts the level back).
    logging.getLogger("azure").setLevel(logging.CRITICAL)
    client = _client(settings)
    hub = f"Event Hub {client.eventhub_name!r}"
    try:
        # The hub answers (address, credential, hub name) before anything else: the SDK's receive would otherwise
        # retry a hub it cannot reach every load-balancing round, quietly, until --idle-timeout read as "no news".
        partitions = set(await client.get_partition_ids())
    except Exception as error:  # whatever the SDK or its credential raised is why it cannot read
        await asyncio.wait_for(client.close(), 10)
        return f"consume could not reach {hub}: {describe(error)}"
    reading = _Reading(settings, hub, out)
    HOST_OS.on_stop_async(asyncio.get_running_loop(), reading.stop)  # SIGINT/SIGTERM/SIGHUP, or Windows' own
    receiving = asyncio.create_task(client.receive(reading.on_event, on_error=reading.on_error,
                                                   starting_position=position, max_wait_time=READABLE_AFTER))
    try:
        await reading.until_done(partitions, receiving)
    finally:
        await asyncio.wait_for(client.close(), 10)
        receiving.cancel()
    if not reading.failures and receiving.done() and not receiving.cancelled() and receiving.exception():
        reading.failures.append(refused(hub, settings.consumer_group, None, receiving.exception()))  # type: ignore[arg-type]
    return reading.failures[0] if reading.failures else None


def _client(settings: ConsumeSettings) -> Any:
    from azure.eventhub.aio import EventHubConsumerClient

    from se_exporter.infra.azure.clients import connection_options, consumer_retry_options

    connection = {**connection_options(settings.eventhub_endpoint, settings.eventhub_ca_file,
                                       settings.eventhub_connection_string), **consumer_retry_options()}
    if settings.eventhub_connection_string:
        return EventHubConsumerClient.from_connection_string(
            settings.eventhub_connection_string, consumer_group=settings.consumer_group,
            eventhub_name=settings.eventhub_name, retry_total=3, **connection)
    from azure.identity.aio import DefaultAzureCredential

    # An operator's machine: their Azure CLI login is the natural credential here (unlike the sidecar's).
    credential = DefaultAzureCredential(managed_identity_client_id=settings.eventhub_client_id) \
        if settings.eventhub_client_id else DefaultAzureCredential()
    return EventHubConsumerClient(
        fully_qualified_namespace=str(settings.eventhub_namespace), eventhub_name=str(settings.eventhub_name),
        consumer_group=settings.consumer_group, credential=credential, retry_total=3, **connection)


class _Reading:
    """The SDK's callbacks and what they tell the loop that decides when to stop."""

    def __init__(self, settings: ConsumeSettings, hub: str, out: TextIO) -> None:
        self.settings, self.hub, self.out = settings, hub, out
        self.render: Callable[[dict[str, Any]], str] = \
            json_line if settings.output_format == "json" else timeline_line
        self.changed = asyncio.Event()  # any callback, or a stop: the loop looks again
        self.stopping = False
        self.failures: list[str] = []
        self.readable: set[str] = set()
        self.count = 0
        self.last_document = asyncio.get_running_loop().time()

    async def on_event(self, context: Any, event: Any) -> None:
        self.readable.add(context.partition_id)
        self.changed.set()
        if event is None:
            return
        print(self.render(record(context.partition_id, event)), file=self.out, flush=True)
        self.count += 1
        self.last_document = asyncio.get_running_loop().time()
        if self.settings.max_events and self.count >= self.settings.max_events:
            self.stopping = True

    async def on_error(self, context: Any, error: Exception) -> None:
        self.failures.append(refused(self.hub, self.settings.consumer_group, context and context.partition_id, error))
        self.changed.set()

    def stop(self) -> None:
        self.stopping = True
        self.changed.set()

    async def until_done(self, partitions: set[str], receiving: asyncio.Task[Any]) -> None:
        """Until a stop, a failure, the receiving's end, or --idle-timeout with every partition readable."""
        loop = asyncio.get_running_loop()
        idle = self.settings.idle_timeout
        while not (self.stopping or self.failures or receiving.done()):
            wait = None
            if idle is not None:
                left = self.last_document + idle - loop.time()
                if left <= 0 and partitions <= self.readable:
                    return  # idle, and every partition was read: a quiet hub, not one it cannot read
                wait = left if left > 0 else None  # idle: wait for the partitions not yet read, or their error
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), wait)


def refused(hub: str, group: str, partition: str | None, error: BaseException) -> str:
    """The one line for an error the SDK reported to on_error. A receiver refused or taken over by one with an owner
    level (``amqp:link:stolen``: a fleet replica reads so, or another consume with one) says what to do about it."""
    from se_exporter.infra.azure.clients import causes, describe

    where = f"partition {partition} of {hub}" if partition is not None else hub
    if any("amqp:link:stolen" in str(cause) for cause in causes(error)):
        return (f"consume could not read {where}: another reader holds consumer group {group!r} (a reader with an "
                "owner level, as se-exporter fleet is, takes a partition from every other reader of its group); "
                "read with a consumer group of your own: --consumer-group NAME")
    return f"consume could not read {where}: {describe(error)}"


def _text(value: Any) -> str:
    """A property another producer may have sent as any AMQP type, in the timeline: text as it is, else its JSON."""
    return value if isinstance(value, str) else dumps(value)


def _decoded(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _body(event: Any) -> str:
    try:
        return str(event.body_as_str(encoding="utf-8"))
    except TypeError:  # the SDK's word for "not UTF-8"
        from azure.eventhub.amqp import AmqpMessageBodyType

        if event.body_type == AmqpMessageBodyType.DATA:
            return b"".join(event.body).decode("utf-8", "replace")
        return repr(event.body)  # an AMQP value or sequence holding bytes that are not UTF-8
