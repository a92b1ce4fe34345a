"""``se-exporter consume``: read the forwarded documents back from Event Hubs, to check the pipeline.

Uses the SDK's async consumer (it can be stopped cleanly) and prints each document as it arrives:
``--format timeline`` one line per document grouped by VM, ``--format json`` one object per line.
"""

from __future__ import annotations

import asyncio
import json
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


def record(partition_id: str, event: Any) -> dict[str, Any]:
    """One event as plain values. Total over what any producer may send (a raise in ``on_event`` makes the SDK drop
    the partition and read it again from the starting position, the same message first: consume stalled for good):
    bytes and a body that is not UTF-8 are decoded with U+FFFD, a non-finite AMQP float is spelt as text."""
    properties = {_decoded(k): _property(v) for k, v in (event.properties or {}).items()}
    key = event.partition_key
    return {"partition_id": partition_id, "sequence_number": event.sequence_number,
            "enqueued_time": event.enqueued_time.isoformat() if event.enqueued_time else None,
            "partition_key": _decoded(key) if key is not None else None, "message_id": event.message_id,
            "properties": properties, "body": _body(event)}


def json_line(item: dict[str, Any]) -> str:
    """``--format json``: one strict JSON object (``default``: AMQP decimals, uuids and timestamps as their text),
    with what json leaves raw that can disguise a line escaped as log lines' JSON is (``logs.escape_json``)."""
    return escape_json(json.dumps(item, ensure_ascii=False, default=str))


def timeline_line(item: dict[str, Any]) -> str:
    """``--format timeline``: one line, escaped as log lines are (``logs.escape``). Anyone with Send rights on the hub
    chooses the properties and the body: an ESC, BEL or newline in them must not retitle or clear the terminal nor
    print a second, forged line; it shows as ``\\x1b``, ``\\x07``, ``\\n``."""
    return escape(_timeline(item))


def _timeline(item: dict[str, Any]) -> str:
    props = item["properties"]
    named = props.get("vm_name")
    vm = str(named) if named else item["partition_key"]  # another producer's vm_name may be any AMQP type
    head = f"{props.get('observed_at', item['enqueued_time'])} {vm} #{props.get('sequence', '?')}"
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


def consume(settings: ConsumeSettings, out: TextIO = sys.stdout) -> int:
    position = starting_position(settings.starting_position)
    return asyncio.run(_consume(settings, position, out))


async def _consume(settings: ConsumeSettings, position: Any, out: TextIO) -> int:
    from azure.eventhub.aio import EventHubConsumerClient

    from se_exporter.infra.azure import amqp_types
    from se_exporter.infra.azure.clients import connection_options, consumer_retry_options

    amqp_types.install()  # else one message with an AMQP char property stops the reading for good (as in the fleet)

    connection = {**connection_options(settings.eventhub_endpoint, settings.eventhub_ca_file,
                                       settings.eventhub_connection_string), **consumer_retry_options()}
    if settings.eventhub_connection_string:
        client = EventHubConsumerClient.from_connection_string(
            settings.eventhub_connection_string, consumer_group=settings.consumer_group,
            eventhub_name=settings.eventhub_name, retry_total=3, **connection)
    else:
        from azure.identity.aio import DefaultAzureCredential

        # An operator's machine: their Azure CLI login is the natural credential here (unlike the sidecar's).
        credential = DefaultAzureCredential(managed_identity_client_id=settings.eventhub_client_id) \
            if settings.eventhub_client_id else DefaultAzureCredential()
        client = EventHubConsumerClient(
            fully_qualified_namespace=str(settings.eventhub_namespace), eventhub_name=str(settings.eventhub_name),
            consumer_group=settings.consumer_group, credential=credential, retry_total=3, **connection)
    done = asyncio.Event()
    arrived = asyncio.Event()
    count = 0
    render: Callable[[dict[str, Any]], str] = json_line if settings.output_format == "json" else timeline_line

    async def on_event(context: Any, event: Any) -> None:
        nonlocal count
        if event is None:
            return
        print(render(record(context.partition_id, event)), file=out, flush=True)
        count += 1
        arrived.set()
        if settings.max_events and count >= settings.max_events:
            done.set()

    loop = asyncio.get_running_loop()
    HOST_OS.on_stop_async(loop, done.set)  # SIGINT/SIGTERM/SIGHUP, or Windows' console control events
    receiving = asyncio.create_task(client.receive(on_event, starting_position=position))
    try:
        while not done.is_set():
            arrived.clear()
            waiters = [asyncio.create_task(done.wait()), asyncio.create_task(arrived.wait())]
            finished, pending = await asyncio.wait(waiters, timeout=settings.idle_timeout,
                                                   return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            if not finished or receiving.done():
                break
    finally:
        await asyncio.wait_for(client.close(), 10)
        receiving.cancel()
    return 0


def _decoded(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _property(value: Any) -> Any:
    if isinstance(value, bytes):
        return _decoded(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # NaN and Infinity are not JSON: 'nan', 'inf', '-inf'
    return value


def _body(event: Any) -> str:
    try:
        return str(event.body_as_str(encoding="utf-8"))
    except TypeError:  # the SDK's word for "not UTF-8"
        from azure.eventhub.amqp import AmqpMessageBodyType

        if event.body_type == AmqpMessageBodyType.DATA:
            return b"".join(event.body).decode("utf-8", "replace")
        return repr(event.body)  # an AMQP value or sequence holding bytes that are not UTF-8
