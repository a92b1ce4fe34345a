"""Event Hubs: documents are spooled on accept; a forwarder thread drains the spool in order.

Facts about azure-eventhub (5.15) this module is built around:

* the sync client can hang for ever on a peer that accepts TCP and never answers, so the forwarder
  uses the async client, where every call can be cancelled with ``asyncio.wait_for``;
* a send without ``timeout=`` never fails when the server does not settle, so every send has one,
  and an outer watchdog besides;
* default retries make a refused connection fail only after ~12 s, so retries are explicit and few:
  the forwarder's own loop retries, with backoff, for as long as it takes;
* a timed-out send may have been delivered: the documents stay spooled and are sent again with the
  same ``message_id`` (at-least-once; consumers drop duplicates by message id);
* ``EventDataBatch.add`` raises ``ValueError`` both when the batch is full and when a property cannot be
  encoded (an ``int`` outside 32 bits, a string that is not UTF-8). Properties are made carriable first
  (``envelope.carriable``, again here for envelopes spooled by older versions), so a ``ValueError`` on an
  empty batch means the document alone is larger than a message may be: the only document ever refused.

The poll loop only ever appends to the spool; it never waits on Event Hubs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

from se_exporter.core.retry import Health, backoff
from se_exporter.infra.azure.clients import ProducerFactory, classify, describe
from se_exporter.sidecar.sinks.envelope import CONTENT_TYPE, Envelope, carriable
from se_exporter.sidecar.sinks.forward import ForwardMetrics
from se_exporter.sidecar.sinks.spool import Spool

log = logging.getLogger("se_exporter.eventhubs")


class EventHubsTarget:
    name = "eventhubs"

    def __init__(self, spool: Spool, make_producer: ProducerFactory, metrics: ForwardMetrics,
                 batch_size: int = 100, send_timeout: float = 10.0, max_retry_wait: float = 30.0) -> None:
        self._spool = spool
        self._make_producer = make_producer
        self._metrics = metrics
        self._batch_size = batch_size
        self._send_timeout = send_timeout
        self._watchdog = send_timeout * 1.5 + 1.0
        self._max_retry_wait = max_retry_wait
        self._stop = threading.Event()
        self._health = Health()
        # The forwarder's event loop, made by start() before the thread runs it and never replaced: accept() (the
        # poll thread) and close() reach into it only through call_soon_threadsafe. The forwarder sleeps on the
        # loop itself, woken by accept(), with no helper thread (waiting through asyncio.to_thread kept two
        # executor threads and woke twice a second when idle).
        self._loop = asyncio.new_event_loop()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._task = task = self._loop.create_task(self._main())
        self._thread = threading.Thread(target=self._run, args=(task,), name="eventhubs", daemon=True)
        self._thread.start()

    def accept(self, envelope: Envelope) -> None:
        self._spool.append(envelope)  # fsynced: from here on the document survives anything
        with contextlib.suppress(RuntimeError):  # the loop has just ended: the next start drains it
            self._loop.call_soon_threadsafe(self._wakeup.set)

    def close(self, timeout: float) -> None:
        """Stop now: a send in flight is cancelled and, maybe delivered, stays spooled for the next start."""
        self._stop.set()
        task, thread = self._task, self._thread
        if task is None or thread is None:  # never started
            self._loop.close()
            self._spool.close()
            return
        with contextlib.suppress(RuntimeError):  # RuntimeError: the loop has ended already
            self._loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout)
        if not thread.is_alive():  # a send still running after the timeout may yet read the spool
            self._spool.close()

    async def _main(self) -> None:
        try:
            await self._drain(self._wakeup)
        except asyncio.CancelledError:
            log.info("Event Hubs forwarder stopped; %d documents stay spooled", self._spool.count)
        finally:
            await self._close_factory()

    def _run(self, task: asyncio.Task[None]) -> None:
        """Run the loop until the forwarder ends, then close it as ``asyncio.run`` would."""
        loop = self._loop
        asyncio.set_event_loop(loop)  # the SDK looks for the thread's loop
        try:
            loop.run_until_complete(task)
        finally:
            try:
                leftovers = asyncio.all_tasks(loop)
                for leftover in leftovers:
                    leftover.cancel()
                loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    async def _drain(self, wakeup: asyncio.Event) -> None:
        producer: Any = None
        failures = 0
        try:
            while not self._stop.is_set():
                wakeup.clear()  # before peeking: an append from now on wakes the wait below
                batch = self._spool.peek(self._batch_size)
                if not batch:
                    await wakeup.wait()
                    continue
                try:
                    if producer is None:
                        producer = self._make_producer()
                    sent, dropped = await self._send(producer, batch)
                except Exception as error:  # every SDK failure is retried; nothing is lost meanwhile
                    self._spool.release()
                    failures += 1
                    self._failed(error)
                    await self._discard(producer)
                    producer = None
                    await asyncio.sleep(backoff(failures, 1.0, self._max_retry_wait))  # close() cancels it
                    continue
                if self._health.recover():  # before the spool shrinks: whoever sees it drained sees this line
                    log.info("Event Hubs reachable again after %d failed attempts", failures)
                failures = 0
                self._spool.remove(envelope.sequence for envelope in (*dropped, *sent))
                self._spool.release()
                if dropped:
                    self._metrics.errors.labels(self.name, "too_large").inc(len(dropped))
                    self._metrics.dropped.inc(len(dropped))
                now = time.time()
                for envelope in sent:
                    self._metrics.latency.observe(max(0.0, now - envelope.observed_at))
                if sent:
                    self._metrics.forwarded.labels(self.name).inc(len(sent))
        finally:  # also when close() cancels: no connection is left behind; a silent peer holds us 2 s at most
            self._spool.release()
            await self._discard(producer, 2.0)

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

    def _failed(self, error: Exception) -> None:
        """Counted every time; logged once per outage (a refused connect may also show up as a timeout)."""
        reason = classify(error)
        self._metrics.errors.labels(self.name, reason).inc()
        first = self._health.failing is None
        if self._health.fail(reason):
            if first:
                log.warning("Event Hubs send failed (%s): %s; %d documents stay spooled and will be retried",
                            reason, describe(error), self._spool.count)
            else:
                log.debug("Event Hubs still failing, now %s: %s", reason, describe(error))

    async def _close_factory(self) -> None:
        closer = getattr(self._make_producer, "aclose", None)
        if closer is None:
            return
        try:
            await asyncio.wait_for(closer(), 5.0)
        except Exception:  # shutting down: nothing to retry, nothing to lose
            log.debug("closing the Event Hubs credential failed", exc_info=True)

    async def _discard(self, producer: Any, timeout: float = 5.0) -> None:
        if producer is None:
            return
        try:
            await asyncio.wait_for(producer.close(), timeout)
        except Exception:  # a peer that never answers must not block us: abandon the client
            log.debug("closing the Event Hubs client failed", exc_info=True)


def event_data(envelope: Envelope) -> Any:
    """The Event Hubs message of one envelope: its body, content type, message id and properties."""
    from azure.eventhub import EventData

    event = EventData(envelope.body)
    event.content_type = CONTENT_TYPE
    event.message_id = envelope.message_id
    event.properties = {name: carriable(value) for name, value in envelope.properties.items()}
    return event
