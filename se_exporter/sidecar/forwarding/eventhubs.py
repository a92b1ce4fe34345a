"""Event Hubs: documents are spooled on accept; the batching processor drains the spool to Event Hubs in order.

Facts about azure-eventhub (5.15) this module is built around:

* the sync client can hang for ever on a peer that accepts TCP and never answers, so the forwarder uses the async
  client, where every call can be cancelled with ``asyncio.wait_for``;
* a send without ``timeout=`` never fails when the server does not settle, so every send has one, and an outer
  watchdog besides;
* default retries make a refused connection fail only after ~12 s, so retries are explicit and few: the batching
  processor (``infra/batching.py``, the spool as its durable queue) retries, with backoff, for as long as it takes;
* ``EventDataBatch.add`` raises ``ValueError`` both when the batch is full and when a property cannot be encoded (an
  ``int`` outside 32 bits, a string that is not UTF-8). Properties are made carriable first (``envelope.carriable``),
  so a ``ValueError`` on an empty batch means the document alone is larger than a message may be: the only document
  ever refused.

What it guarantees (at least once, in order; a resend keeps its ``message_id``): docs/forwarding.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from se_exporter.infra.azure.clients import ProducerFactory, classify, describe
from se_exporter.infra.batching import BatchProcessor, Deliverer
from se_exporter.sidecar.forwarding.envelope import CONTENT_TYPE, Envelope, carriable
from se_exporter.sidecar.forwarding.forward import ForwardMetrics
from se_exporter.sidecar.forwarding.spool import Spool

log = logging.getLogger("se_exporter.eventhubs")


class EventHubsTarget:
    """The forwarding target: ``accept`` spools the envelope, and from then on it survives anything."""

    name = "eventhubs"

    def __init__(self, spool: Spool, make_producer: ProducerFactory, metrics: ForwardMetrics,
                 batch_size: int = 100, send_timeout: float = 10.0, max_retry_wait: float = 30.0) -> None:
        self._sender = EventHubsSender(spool, make_producer, metrics, send_timeout)
        self._processor = BatchProcessor(spool, self._sender, classify,
                                         on_error=lambda reason: metrics.errors.labels(self.name, reason).inc(),
                                         batch_size=batch_size, retry_first=1.0, retry_max=max_retry_wait)

    def accept(self, envelope: Envelope) -> None:
        self._processor.emit(envelope)

    def close(self, timeout: float) -> None:
        """Stop now: a send in flight is cancelled and, maybe delivered, stays spooled for the next start."""
        self._processor.shutdown(timeout)


class EventHubsSender(Deliverer[Envelope]):
    """Sends the oldest spooled envelopes, on an event loop of its own run by the processor's worker thread."""

    name = "eventhubs"

    def __init__(self, spool: Spool, make_producer: ProducerFactory, metrics: ForwardMetrics,
                 send_timeout: float) -> None:
        self._spool = spool
        self._make_producer = make_producer
        self._metrics = metrics
        self._send_timeout = send_timeout
        self._watchdog = send_timeout * 1.5 + 1.0
        self._loop = asyncio.new_event_loop()
        self._producer: Any = None
        self._task: asyncio.Task[int] | None = None
        self._interrupted = False

    def deliver(self, batch: Sequence[Envelope]) -> int:
        if self._interrupted:
            raise RuntimeError("stopping")
        asyncio.set_event_loop(self._loop)  # the SDK looks for the thread's loop
        self._task = self._loop.create_task(self._export(batch))
        try:
            return self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            raise RuntimeError("stopping") from None
        finally:
            self._task = None

    async def _export(self, batch: Sequence[Envelope]) -> int:
        try:
            if self._producer is None:
                self._producer = self._make_producer()
            sent, dropped = await self._send(self._producer, list(batch))
        except BaseException:  # every SDK failure is retried; nothing is lost meanwhile
            producer, self._producer = self._producer, None
            await _close(producer.close if producer is not None else None, 2.0,  # a silent peer: 2 s at most
                         "the Event Hubs client")
            raise
        if dropped:
            self._metrics.errors.labels(self.name, "too_large").inc(len(dropped))
            self._metrics.dropped.inc(len(dropped))
        now = time.time()
        for envelope in sent:
            self._metrics.latency.observe(max(0.0, now - envelope.observed_at))
        if sent:
            self._metrics.forwarded.labels(self.name).inc(len(sent))
        return len(sent) + len(dropped)

    def label(self, item: Envelope) -> str:
        return f"document {item.sequence}"

    def failed(self, error: Exception, reason: str, item: Envelope, first: bool, queued: int) -> None:
        """Logged once per outage (a refused connect may also show up as a timeout)."""
        if first:
            log.warning("Event Hubs send failed (%s): %s; %d documents stay spooled and will be retried",
                        reason, describe(error), queued)
        else:
            log.debug("Event Hubs still failing, now %s: %s", reason, describe(error))

    def recovered(self, failures: int) -> None:
        log.info("Event Hubs reachable again after %d failed attempts", failures)

    def interrupt(self) -> None:
        self._interrupted = True
        task = self._task
        if task is not None:
            with contextlib.suppress(RuntimeError):  # the loop has just ended
                self._loop.call_soon_threadsafe(task.cancel)

    def shutdown(self) -> None:
        """Close the client and the loop; the spool keeps what was not acknowledged for the next start."""
        if self._loop.is_running():  # the worker was given up on, still inside a send: leave it be
            return
        log.info("Event Hubs forwarder stopped; %d documents stay spooled", len(self._spool))
        try:
            producer = self._producer.close if self._producer is not None else None
            self._loop.run_until_complete(_close(producer, 2.0, "the Event Hubs client"))
            closer = getattr(self._make_producer, "aclose", None)
            self._loop.run_until_complete(_close(closer, 5.0, "the Event Hubs credential"))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
        finally:
            self._loop.close()
            self._spool.close()

    async def _send(self, producer: Any, spooled: list[Envelope]) -> tuple[list[Envelope], list[Envelope]]:
        """Send the oldest run of envelopes sharing a partition key: (acknowledged by Event Hubs, too large to send).

        A document too large for a message is dropped (it can never be sent, and must not block the rest);
        it is returned apart so that nobody counts it as delivered.
        """
        key = spooled[0].partition_key
        run: list[Envelope] = []
        for envelope in spooled:  # only the oldest run: order per partition key must hold
            if envelope.partition_key != key:
                break
            run.append(envelope)
        batch = await asyncio.wait_for(producer.create_batch(partition_key=str(carriable(key))), self._watchdog)
        added: list[Envelope] = []
        for envelope in run:
            try:
                batch.add(event_data(envelope))
            except ValueError:
                break  # the batch is full; the rest goes next time
            added.append(envelope)
        if not added:
            log.error("document %d (%d bytes) is larger than an Event Hubs message may be (%d bytes) and is dropped",
                      run[0].sequence, len(run[0].body), batch.max_size_in_bytes)
            return [], [run[0]]
        await asyncio.wait_for(producer.send_batch(batch, timeout=self._send_timeout), self._watchdog)
        return added, []


async def _close(close: Callable[[], Awaitable[Any]] | None, timeout: float, what: str) -> None:
    """Close ``what``, if there is one, within ``timeout``: a peer that never answers must not block us (the client
    is abandoned), and shutting down there is nothing to retry, nothing to lose."""
    if close is None:
        return
    try:
        await asyncio.wait_for(close(), timeout)
    except Exception:
        log.debug("closing %s failed", what, exc_info=True)


def event_data(envelope: Envelope) -> Any:
    """The Event Hubs message of one envelope: its body, content type, message id and properties."""
    from azure.eventhub import EventData

    event = EventData(envelope.body)
    event.content_type = CONTENT_TYPE
    event.message_id = envelope.message_id
    event.properties = {name: carriable(value) for name, value in envelope.properties.items()}
    return event
