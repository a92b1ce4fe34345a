"""The platform copy's Event Hubs output (``--platform-eventhub-*``), one of ``publish``'s outputs.

A bounded queue (at most ``capacity`` messages, the one being sent among them; past it the newest are dropped and
counted) and a thread of its own that sends them in order with the azure-eventhub SDK's async producer: the sync
client can hang for ever on a peer that accepts TCP and never answers, the async one can be cancelled, so every
send has a timeout and a watchdog. A failed send is counted, logged when sending starts failing and when it
recovers, and retried with backoff (at least once, as Event Grid delivers). The producer is the sidecar's
forwarder's own (``infra.azure.clients.producer_factory``); ``publish`` imports this module, and so the SDK, only
when a hub is configured.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from typing import Any

from azure.eventhub import EventData

from se_exporter.core.retry import Health, backoff
from se_exporter.infra.azure.clients import ProducerFactory, classify, describe
from se_exporter.simulator.platform import Published

log = logging.getLogger("se_exporter.simulator.platform")
QUEUE_CAPACITY = 10_000  # messages waiting for the hub; about 1.5 KB each


class EventHubOutput:
    """``--platform-eventhub-*``: a bounded queue and a sending thread (see the module)."""

    name = "eventhub"

    def __init__(self, make_producer: ProducerFactory, capacity: int = QUEUE_CAPACITY, send_timeout: float = 10.0,
                 max_retry_wait: float = 30.0) -> None:
        self._make_producer = make_producer
        self._capacity, self._send_timeout, self._max_retry_wait = capacity, send_timeout, max_retry_wait
        self._queue: collections.deque[Published] = collections.deque()
        self._ready = threading.Condition()
        self._stop = threading.Event()
        self._health = Health()
        self.sent = self.failed = self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="platform-eventhub", daemon=True)
        self._thread.start()

    def offer(self, message: Published) -> None:
        with self._ready:
            if len(self._queue) >= self._capacity:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("platform copy: %d messages wait for the event hub already; %d dropped so far",
                                self._capacity, self.dropped)
                return
            self._queue.append(message)
            self._ready.notify()

    def stats(self) -> dict[str, Any]:
        with self._ready:
            queued = len(self._queue)
        return {"sent": self.sent, "failed": self.failed, "dropped": self.dropped, "queued": queued,
                "failing": self._health.failing}

    def close(self, timeout: float) -> None:
        """Stop within ``timeout``: what is still queued then is not sent (the simulator is stopping), and a send
        still under way is left to its daemon thread."""
        deadline = time.monotonic() + timeout
        with self._ready:
            while self._queue and not self._health.failing and time.monotonic() < deadline:
                self._ready.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            self._stop.set()
            self._ready.notify_all()
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _next(self) -> Published | None:
        with self._ready:
            while not self._queue and not self._stop.is_set():
                self._ready.wait()
            return self._queue[0] if self._queue and not self._stop.is_set() else None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        producer: Any = None
        attempt = 0
        try:
            while (message := self._next()) is not None:
                try:
                    producer = producer or self._make_producer()
                    loop.run_until_complete(asyncio.wait_for(self._send(producer, message),
                                                             self._send_timeout * 1.5 + 1))
                except Exception as exc:  # any SDK failure is counted, logged and retried
                    self.failed += 1
                    attempt += 1
                    if self._health.fail(classify(exc)):
                        log.error("platform copy: sending to the event hub failed (%s: %s); retrying with backoff, "
                                  "newer messages queue (at most %d)", classify(exc), describe(exc), self._capacity)
                    self._close(loop, producer)
                    producer = None
                    self._stop.wait(backoff(attempt, 0.5, self._max_retry_wait))
                    continue
                attempt = 0
                with self._ready:
                    self._queue.popleft()
                    self._ready.notify_all()
                self.sent += 1
                if self._health.recover():
                    log.info("platform copy: sending to the event hub works again")
        finally:
            self._close(loop, producer)
            self._close(loop, self._make_producer, "aclose")  # a shared credential's (``SharedCredential``)
            loop.close()

    def _close(self, loop: asyncio.AbstractEventLoop, closable: Any, method: str = "close") -> None:
        """Close a producer (a failed one is not used again) or the credential, bounded, whatever it raises."""
        close = getattr(closable, method, None)
        if close is not None:
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.wait_for(close(), self._send_timeout))

    async def _send(self, producer: Any, message: Published) -> None:
        event = EventData(message.body)
        event.content_type = "application/json"
        batch = await producer.create_batch()
        batch.add(event)
        await producer.send_batch(batch, timeout=self._send_timeout)
