"""The suite's Event Hubs test server does what the SDK's load balancing relies on: exclusive receivers, positions
that stay right however full a partition is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from azure.eventhub.aio import EventHubConsumerClient
from proton import Message

from tests.support.eventhubs_server import EventHubsTestServer, Store, start_index
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration


def test_offsets_and_selectors_stay_exact_as_a_partition_fills() -> None:
    """Offsets are the running byte total, and a selector by offset, sequence number or time finds its event."""
    store = Store(partition_count=1)
    bodies = [b"x" * (index % 50) for index in range(3000)]
    for body in bodies:
        store.append("0", Message(body=body, inferred=True), None)
    events = store.events["0"]
    expected = 0
    for index, event in enumerate(events):
        assert (event.sequence_number, int(event.offset)) == (index, expected)
        expected += len(bodies[index]) + 1
    assert [e.enqueued_time_ms for e in events] == sorted(e.enqueued_time_ms for e in events)
    for selector, index in ((f"amqp.annotation.x-opt-offset > '{events[1234].offset}'", 1235),
                            (f"amqp.annotation.x-opt-offset >= '{events[1234].offset}'", 1234),
                            ("amqp.annotation.x-opt-sequence-number >= '2999'", 2999),
                            ("amqp.annotation.x-opt-offset > '-1'", 0),
                            ("amqp.annotation.x-opt-offset > '@latest'", 3000),
                            (f"amqp.annotation.x-opt-enqueued-time > '{events[-1].enqueued_time_ms}'", 3000)):
        assert start_index(events, selector) == index, selector


def test_a_receiver_with_an_owner_level_steals_the_partition(hubs: Callable[..., EventHubsTestServer]) -> None:
    """As on Event Hubs: the newer exclusive receiver wins and the older one is closed with amqp:link:stolen,
    which the SDK reports to on_error; a lower owner level is refused."""
    hub = hubs(Store(partition_count=1))

    async def run() -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {"old": [], "new": [], "low": []}
        clients = [EventHubConsumerClient.from_connection_string(hub.connection_string(), consumer_group="$Default",
                                                                 retry_total=0) for _ in range(3)]

        def on_error(name: str) -> Callable[[Any, Exception], Any]:
            async def record(context: Any, error: Exception) -> None:
                errors[name].append(str(error))
            return record

        async def on_event(context: Any, event: Any) -> None:
            return None

        tasks = [asyncio.create_task(clients[0].receive(on_event, on_error=on_error("old"), partition_id="0",
                                                        owner_level=1, starting_position="-1"))]
        await asyncio.sleep(0)
        await _until(lambda: hub.open_receivers("$default", "0") == 1)
        tasks.append(asyncio.create_task(clients[1].receive(on_event, on_error=on_error("new"), partition_id="0",
                                                            owner_level=1, starting_position="-1")))
        await _until(lambda: bool(errors["old"]))
        tasks.append(asyncio.create_task(clients[2].receive(on_event, on_error=on_error("low"), partition_id="0",
                                                            owner_level=0, starting_position="-1")))
        await _until(lambda: bool(errors["low"]))
        for client in clients:
            await client.close()
        for task in tasks:
            task.cancel()
        return errors

    errors = asyncio.run(run())
    assert "amqp:link:stolen" in errors["old"][0]
    assert "amqp:link:stolen" in errors["low"][0]
    assert errors["new"] == []
    assert hub.links_stolen == 1


async def _until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(predicate, timeout=timeout))
