"""The one batching processor (order, retries, drop-oldest, flush, shutdown), with an exporter of plain items."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from se_exporter.infra.batching import BatchProcessor, Deliverer, MemoryQueue
from tests.support.helpers import wait_until


class Flaky(Deliverer[int]):
    """Refuses while ``refusing`` is set; records what it took."""

    name = "flaky"

    def __init__(self) -> None:
        self.refusing = threading.Event()
        self.taken: list[int] = []

    def deliver(self, batch: Sequence[int]) -> int:
        if self.refusing.is_set():
            raise OSError("refused")
        self.taken.extend(batch)
        return len(batch)


def processor(exporter: Deliverer[int], max_items: int = 100) -> tuple[BatchProcessor[int], list[str], list[int]]:
    errors: list[str] = []
    dropped: list[int] = []
    queue: MemoryQueue[int] = MemoryQueue(max_items, lambda item: 1, dropped.append)
    return BatchProcessor(queue, exporter, lambda error: "io", errors.append, retry_first=0.01,
                          retry_max=0.02), errors, dropped


def test_refused_items_are_retried_in_order_and_counted() -> None:
    """While the exporter refuses, every attempt is counted and nothing is lost; once it accepts, all arrive in
    the order emitted."""
    exporter = Flaky()
    exporter.refusing.set()
    batching, errors, _ = processor(exporter)
    for item in range(5):
        batching.emit(item)
    wait_until(lambda: len(errors) >= 3, what="three refusals counted")
    exporter.refusing.clear()
    wait_until(lambda: batching.force_flush(1_000), what="the queue flushed")  # a refusal under way ends one flush
    assert exporter.taken == [0, 1, 2, 3, 4] and set(errors) == {"io"}
    batching.shutdown(1)


def test_a_full_queue_drops_the_oldest_and_counts_it() -> None:
    """Past its bound the queue gives up its oldest items (each counted), never the newest."""
    exporter = Flaky()
    exporter.refusing.set()
    batching, _, dropped = processor(exporter, max_items=3)
    for item in range(10):
        batching.emit(item)
    exporter.refusing.clear()
    wait_until(lambda: batching.force_flush(1_000), what="the queue flushed")  # a refusal under way ends one flush
    assert exporter.taken[-2:] == [8, 9] and len(exporter.taken) + len(dropped) == 10
    assert exporter.taken == sorted(exporter.taken) and not set(exporter.taken) & set(dropped)
    batching.shutdown(1)


def test_shutdown_keeps_its_deadline_and_counts_what_is_lost() -> None:
    """An exporter that refuses for good delays shutdown by one last try, not by its backoff: what is left is
    counted as lost."""
    exporter = Flaky()
    exporter.refusing.set()
    lost: list[int] = []
    batching = BatchProcessor(MemoryQueue(100, lambda item: 1, lambda item: None), exporter, lambda error: "io",
                              lambda reason: None, on_lost=lost.append, retry_first=30.0, retry_max=30.0)
    batching.emit(1)
    batching.emit(2)
    started = time.monotonic()
    batching.shutdown(5)
    assert time.monotonic() - started < 4 and lost == [2]


class Slow(Deliverer[int]):
    """Accepts one item every 20 ms: a hub slower than what is queued for it."""

    name = "slow"

    def __init__(self) -> None:
        self.taken: list[int] = []

    def deliver(self, batch: Sequence[int]) -> int:
        time.sleep(0.02)  # the exporter's own pace, not a wait for something to happen
        self.taken.extend(batch[:1])
        return 1


def test_shutdown_stops_exporting_at_its_deadline() -> None:
    """With 100 items queued for an exporter that takes 2 s to accept them all, shutdown(0.1) ends the last try at
    its deadline: the worker starts no export after it, and what it did not take is counted as lost."""
    exporter = Slow()
    lost: list[int] = []
    batching = BatchProcessor(MemoryQueue(1000, lambda item: 1, lambda item: None), exporter, lambda error: "io",
                              lambda reason: None, on_lost=lost.append, batch_size=1)
    for item in range(100):
        batching.emit(item)
    batching.shutdown(0.1)
    [worker] = [t for t in threading.enumerate() if t.name == "slow-export"] or [None]
    if worker is not None:  # still in the export under way at the deadline
        worker.join(1.0)
        assert not worker.is_alive()
    assert len(exporter.taken) < 100 and exporter.taken == list(range(len(exporter.taken)))
    assert sum(lost) in (0, 100 - len(exporter.taken))


def test_force_flush_does_not_wait_on_a_refusing_exporter() -> None:
    """A flush (as at shutdown) returns False as soon as the exporter refuses, not after its whole timeout."""
    exporter = Flaky()
    exporter.refusing.set()
    batching, _, _ = processor(exporter)
    batching.emit(1)
    started = time.monotonic()
    assert batching.force_flush(20_000) is False
    assert time.monotonic() - started < 10
    batching.shutdown(1)
