"""The platform copy's Event Hubs output (``--platform-eventhub-*``), one of ``publish``'s outputs.

An exporter on the one batching processor (``infra/batching.py``: at most ``capacity`` messages queued, the oldest
dropped and counted past it, a worker thread, retries with backoff, at least once and in order, as Event Grid
delivers). Each message is sent alone with the azure-eventhub SDK's async producer: the sync client can hang for ever
on a peer that accepts TCP and never answers, the async one can be cancelled, so every send has a timeout and a
watchdog. The producer is the sidecar's forwarder's own (``infra.azure.clients.producer_factory``); ``publish``
imports this module, and so the SDK, only when a hub is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from azure.eventhub import EventData

from se_exporter.infra.azure.clients import ProducerFactory, classify, describe
from se_exporter.infra.batching import BatchProcessor, Deliverer, MemoryQueue
from se_exporter.simulator.platform import Published

log = logging.getLogger("se_exporter.simulator.platform")
QUEUE_CAPACITY = 10_000  # messages waiting for the hub; about 1.5 KB each


class EventHubOutput(Deliverer[Published]):
    """``--platform-eventhub-*``: ``offer`` queues, the processor's worker sends (see the module)."""

    name = "eventhub"
    noun = "messages"

    def __init__(self, make_producer: ProducerFactory, capacity: int = QUEUE_CAPACITY, send_timeout: float = 10.0,
                 max_retry_wait: float = 30.0) -> None:
        self._make_producer, self._capacity, self._send_timeout = make_producer, capacity, send_timeout
        self._loop = asyncio.new_event_loop()  # run by the processor's worker thread only
        self._producer: Any = None
        self._lock = threading.Lock()  # the counts: a drop is counted on the publisher's thread or the worker's
        self._sent = self._failed = self._dropped = 0
        self._failing: str | None = None
        self._queue: MemoryQueue[Published] = MemoryQueue(capacity, lambda message: 1, self._drop)
        self._processor = BatchProcessor(self._queue, self, classify, on_error=self._count_failure,
                                         on_lost=self._count_lost, batch_size=1, retry_max=max_retry_wait)

    def offer(self, message: Published) -> None:
        self._processor.emit(message)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"sent": self._sent, "failed": self._failed, "dropped": self._dropped, "queued": len(self._queue),
                    "failing": self._failing}

    def close(self, timeout: float) -> None:
        """Stop within ``timeout``: what the hub has not taken by then is lost (the simulator is stopping; a hub
        already refusing gets one last try, not a flush), and a send still under way is left to the daemon worker."""
        deadline = time.monotonic() + timeout
        if self._failing is None:
            self._processor.force_flush(int(timeout * 1000))
        self._processor.shutdown(max(0.0, deadline - time.monotonic()))

    def deliver(self, batch: Sequence[Published]) -> int:
        try:
            self._producer = self._producer or self._make_producer()
            self._loop.run_until_complete(asyncio.wait_for(self._send(self._producer, batch[0]),
                                                           self._send_timeout * 1.5 + 1))
        except Exception:
            self._close(self._producer, "close")  # a producer that failed is not used again
            self._producer = None
            raise
        with self._lock:
            self._sent += 1
        return 1

    def label(self, item: Published) -> str:
        return f"message {item.grid_id}"

    def failed(self, error: Exception, reason: str, item: Published, first: bool, queued: int) -> None:
        self._failing = reason
        log.error("platform copy: sending to the event hub failed (%s: %s); retrying with backoff, newer messages "
                  "queue (at most %d)", reason, describe(error), self._capacity)

    def recovered(self, failures: int) -> None:
        self._failing = None
        log.info("platform copy: sending to the event hub works again")

    def shutdown(self) -> None:
        """Close the producer and the shared credential (``SharedCredential``), unless a send is still under way."""
        if self._loop.is_running():
            return
        self._close(self._producer, "close")
        self._close(self._make_producer, "aclose")
        self._loop.close()

    def _count_failure(self, reason: str) -> None:
        with self._lock:
            self._failed += 1

    def _count_lost(self, count: int) -> None:
        """Messages the hub never took before the simulator stopped count as dropped too."""
        with self._lock:
            self._dropped += count

    def _drop(self, message: Published) -> None:
        with self._lock:
            self._dropped += 1
            dropped = self._dropped
        if dropped == 1 or dropped % 1000 == 0:
            log.warning("platform copy: %d messages wait for the event hub already; %d dropped so far",
                        self._capacity, dropped)

    def _close(self, closable: Any, method: str) -> None:
        """Close a producer or the credential, bounded, whatever it raises."""
        close = getattr(closable, method, None)
        if close is not None:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.wait_for(close(), self._send_timeout))

    async def _send(self, producer: Any, message: Published) -> None:
        event = EventData(message.body)
        event.content_type = "application/json"
        batch = await producer.create_batch()
        batch.add(event)
        await producer.send_batch(batch, timeout=self._send_timeout)
