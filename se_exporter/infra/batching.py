"""The one batching processor of every program's outputs, on OpenTelemetry's model (its ``BatchSpanProcessor``).

A deliverer (``Deliverer``) says how to deliver a batch; the processor owns everything else, once for every output:
a bounded queue, a worker thread, a capped backoff (``core/retry.py``) while the deliverer refuses, one log line per
change of its health, drop-oldest counted, ``force_flush`` and a ``shutdown`` with a deadline. ``emit`` only puts an
item in the queue, so whoever emits (the sidecar's poll loop, the simulator's platform copy) never waits on a
deliverer.

The SDK's own class lives in a private module (``opentelemetry.sdk._shared_internal``) and drops a batch its exporter
fails, where forwarding must keep it, in order, until it is delivered; hence this mirror of it. Two kinds of queue:
``MemoryQueue`` (drop-oldest, counted) and a durable one, the sidecar's Event Hubs spool (``append`` returns once on
disk).

Items are exported oldest first and removed only once the exporter says they are done with (at-least-once, in order).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Generic, Protocol, TypeVar

from se_exporter.core.retry import Health, backoff

log = logging.getLogger("se_exporter.forward")
T = TypeVar("T")


class Queue(Protocol[T]):
    durable: bool

    def append(self, item: T) -> None:
        """Take the item, or raise and keep nothing of it."""

    def peek(self, limit: int) -> list[T]:
        """The oldest ``limit`` items, which stay queued (being exported) until ``remove``."""

    def remove(self, items: Sequence[T]) -> None:
        """The first items of the last ``peek``: done with."""

    def release(self) -> None:
        """The export of what ``peek`` handed out is over."""

    def __len__(self) -> int: ...


class Deliverer(Generic[T]):
    """Delivers batches; ``deliver`` is the one method a deliverer must write (named apart from an OpenTelemetry
    exporter's ``export`` and a sink's ``on_change``). The hooks say what the log says."""

    name = "deliverer"
    noun = "documents"  # what the items are called in the line that counts those lost at shutdown

    def deliver(self, batch: Sequence[T]) -> int:
        """Deliver the batch from its start: how many of it are done with (at least one), or raise to retry."""
        raise NotImplementedError

    def label(self, item: T) -> str:
        return "an item"

    def failed(self, error: Exception, reason: str, item: T, first: bool, queued: int) -> None:
        """The exporter refused ``item`` anew (a first failure, or a new reason): one log line."""
        text = (error.strerror if isinstance(error, OSError) else None) or str(error) or type(error).__name__
        log.error("%s refused %s (%s: %s); it is kept in memory and retried, later documents queue behind it",
                  self.name, self.label(item), reason, text[:300])

    def recovered(self, failures: int) -> None:
        log.info("%s accepts documents again; the refused ones are written", self.name)

    def interrupt(self) -> None:
        """Called from another thread at shutdown: cut short an export in progress, if the exporter can."""

    def shutdown(self) -> None:
        """Release what the exporter holds; called once, after the worker ended (or was given up on)."""


class MemoryQueue(Generic[T]):
    """A deque bounded by bytes: past ``max_bytes`` the oldest item not being exported goes to ``on_drop``."""

    durable = False

    def __init__(self, max_bytes: int, size: Callable[[T], int], on_drop: Callable[[T], None]) -> None:
        self._items: deque[T] = deque()
        self._max_bytes, self._size, self._on_drop = max_bytes, size, on_drop
        self._bytes = 0
        self._leased = 0  # the first items, handed out by peek and being exported
        self._lock = threading.Lock()

    def append(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
            self._bytes += self._size(item)
        self._trim()

    def _trim(self) -> None:
        """Within the bound again, dropping the oldest not being exported; with more than one left, never the
        newest."""
        dropped = []
        with self._lock:
            while self._bytes > self._max_bytes and len(self._items) - self._leased > 1:
                victim = self._items[self._leased]
                del self._items[self._leased]
                self._bytes -= self._size(victim)
                dropped.append(victim)
        for victim in dropped:
            self._on_drop(victim)

    def peek(self, limit: int) -> list[T]:
        with self._lock:
            batch = list(islice(self._items, limit))
            self._leased = len(batch)
            return batch

    def remove(self, items: Sequence[T]) -> None:
        with self._lock:
            for _ in items:
                self._bytes -= self._size(self._items.popleft())
            self._leased = max(0, self._leased - len(items))

    def release(self) -> None:
        with self._lock:
            self._leased = 0
        self._trim()  # what arrived during the export may have been held over the bound

    def drain(self) -> list[T]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._bytes = self._leased = 0
            return items

    def __len__(self) -> int:
        return len(self._items)


class BatchProcessor(Generic[T]):
    """Feeds ``queue`` to ``exporter`` from a worker thread of its own (see the module docstring).

    ``classify`` names the reason of a failure (the ``reason`` label), ``on_error`` counts it, ``on_lost`` counts
    items dropped from a full queue or left at shutdown. The backoff goes from ``retry_first`` to ``retry_max``.
    ``linger``: seconds the first item after a quiet spell waits for a batch to gather (OpenTelemetry's schedule
    delay); a full batch, a flush or a stop cuts it short. The worker sleeps with no timeout while nothing is queued.
    """

    def __init__(self, queue: Queue[T], deliverer: Deliverer[T], classify: Callable[[Exception], str],
                 on_error: Callable[[str], None], on_lost: Callable[[int], None] = lambda count: None,
                 batch_size: int = 64, retry_first: float = 0.5, retry_max: float = 5.0, linger: float = 0.0) -> None:
        self._queue, self._deliverer = queue, deliverer
        self._classify, self._on_error, self._on_lost = classify, on_error, on_lost
        self._batch_size, self._retry_first, self._retry_max = batch_size, retry_first, retry_max
        self._linger = linger
        self._health = Health()
        self._wake = threading.Event()
        self._hurry = threading.Event()  # ends a linger early
        self._stop = threading.Event()
        self._deadline = float("inf")  # set by shutdown: no export starts after it
        self._flushed = threading.Condition()
        self._refusals = 0  # failed exports so far: a flush ends at the first one after it began
        self._worker = threading.Thread(target=self._run, name=f"{deliverer.name}-export", daemon=True)
        self._worker.start()

    def emit(self, item: T) -> None:
        """Queue the item for the worker; raises only if a durable queue cannot take it (nothing of it kept)."""
        self._queue.append(item)
        self._wake.set()
        if len(self._queue) >= self._batch_size:
            self._hurry.set()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """True once the queue is empty (for a durable queue at once: what it holds is safe on disk); False as soon
        as the exporter refuses meanwhile (its backoff, not this call, decides when to try again)."""
        if self._queue.durable:
            return True
        self._hurry.set()
        self._wake.set()
        with self._flushed:
            refused = self._refusals
            self._flushed.wait_for(lambda: len(self._queue) == 0 or self._refusals != refused, timeout_millis / 1000)
            return len(self._queue) == 0

    def shutdown(self, timeout: float = 8.0) -> None:
        """Stop within ``timeout`` seconds: a memory queue gets one last try until then (what is left is counted and
        logged as lost), a durable one stops at once, its export cut short, and keeps what it holds for the next
        start."""
        self._deadline = time.monotonic() + timeout
        self._stop.set()
        self._hurry.set()
        self._wake.set()
        if self._queue.durable:
            self._deliverer.interrupt()
        self._worker.join(timeout)
        if isinstance(self._queue, MemoryQueue) and not self._worker.is_alive():
            lost = self._queue.drain()
            if lost:
                log.error("%s never accepted %d %s (%s to %s); they are lost at shutdown", self._deliverer.name,
                          len(lost), self._deliverer.noun, self._deliverer.label(lost[0]),
                          self._deliverer.label(lost[-1]))
                self._on_lost(len(lost))
        self._deliverer.shutdown()

    def _run(self) -> None:
        failures = 0
        while True:
            self._wake.clear()  # before peeking: an emit from now on wakes the wait below
            stopping = self._stop.is_set() and (self._queue.durable or time.monotonic() >= self._deadline)
            batch = [] if stopping else self._queue.peek(self._batch_size)
            if not batch:
                with self._flushed:
                    self._refusals += 1
                    self._flushed.notify_all()
                if self._stop.is_set():
                    return
                self._wake.wait()
                if self._linger:
                    self._hurry.wait(self._linger)
                    self._hurry.clear()
                continue
            try:
                done = max(1, self._deliverer.deliver(batch))
            except Exception as error:  # whatever an exporter raises is a refusal: counted, kept, retried
                self._queue.release()
                if self._stop.is_set() and self._queue.durable:
                    return  # cut short by shutdown: the batch stays queued for the next start
                failures += 1
                self._failed(error, batch[0])
                with self._flushed:
                    self._refusals += 1
                    self._flushed.notify_all()
                if self._stop.is_set():
                    return  # that was the last try
                stopped = self._stop.wait(backoff(failures, self._retry_first, self._retry_max))
                if stopped and self._queue.durable:
                    return
                continue  # stopped with a memory queue: one last try
            if self._health.recover():  # before the queue shrinks: whoever sees it flushed sees this line
                self._deliverer.recovered(failures)
            failures = 0
            self._queue.remove(batch[:done])
            self._queue.release()

    def _failed(self, error: Exception, item: T) -> None:
        """Counted every time; logged once per change of the exporter's health, without a traceback."""
        reason = self._classify(error)
        self._on_error(reason)
        first = self._health.failing is None
        if self._health.fail(reason):
            self._deliverer.failed(error, reason, item, first, len(self._queue))

