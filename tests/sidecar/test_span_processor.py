"""The span processor: batches like OpenTelemetry's BatchSpanProcessor, but its thread sleeps until a span is queued."""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from se_exporter.sidecar.sinks.tracing import QuietBatchSpanProcessor
from tests.helpers import wait_until

T = TypeVar("T")


class Recording(SpanExporter):
    """Keeps every batch; can be held inside export (``hold``) or made to raise (``fail``)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail = False
        self.shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.hold.wait(10)
        if self.fail:
            raise RuntimeError("collector on fire")
        self.batches.append([span.name for span in spans])
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True

    @property
    def names(self) -> list[str]:
        return [name for batch in self.batches for name in batch]


@pytest.fixture
def exporter() -> Recording:
    return Recording()


def processor_for(exporter: Recording, **options: object) -> tuple[QuietBatchSpanProcessor, TracerProvider]:
    processor = QuietBatchSpanProcessor(exporter, **options)  # type: ignore[arg-type]
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return processor, provider


def started_thread_of(make: Callable[[], T]) -> tuple[T, threading.Thread]:
    """What ``make`` returns, and the one thread it started (the processor's worker)."""
    before = set(threading.enumerate())
    result = make()
    (thread,) = set(threading.enumerate()) - before
    return result, thread


@pytest.fixture
def made() -> Iterator[list[QuietBatchSpanProcessor]]:
    processors: list[QuietBatchSpanProcessor] = []
    yield processors
    for processor in processors:
        processor.shutdown()


def end_spans(provider: TracerProvider, *names: str) -> None:
    tracer = provider.get_tracer("test")
    for name in names:
        tracer.start_span(name).end()


def voluntary_switches(native_id: int) -> int:
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    match = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)
    assert match is not None
    return int(match.group(1))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_the_thread_does_not_wake_while_no_span_is_queued(exporter: Recording,
                                                          made: list[QuietBatchSpanProcessor]) -> None:
    """Over ten schedule delays without a span the worker is not woken once (the SDK's processor wakes every
    delay); a span then wakes it and is exported."""
    (processor, provider), thread = started_thread_of(lambda: processor_for(exporter, schedule_delay_millis=20))
    made.append(processor)
    end_spans(provider, "first")
    wait_until(lambda: exporter.names == ["first"], what="the first span exported")
    assert thread.native_id is not None
    before = voluntary_switches(thread.native_id)
    threading.Event().wait(0.2)  # the window observed: ten schedule delays of 20 ms
    assert voluntary_switches(thread.native_id) - before <= 1  # at most its going to sleep after the export
    end_spans(provider, "second")
    wait_until(lambda: exporter.names == ["first", "second"], what="the second span exported")


def test_spans_ended_together_go_out_in_batches_of_the_batch_size(exporter: Recording,
                                                                  made: list[QuietBatchSpanProcessor]) -> None:
    """Spans queued within the schedule delay are exported together, at most max_export_batch_size at a time."""
    processor, provider = processor_for(exporter, schedule_delay_millis=60_000, max_export_batch_size=3)
    made.append(processor)
    end_spans(provider, *"abcdefg")
    wait_until(lambda: len(exporter.names) >= 6, what="two full batches exported without waiting for the delay")
    assert exporter.batches[:2] == [["a", "b", "c"], ["d", "e", "f"]]
    processor.force_flush()
    assert exporter.batches == [["a", "b", "c"], ["d", "e", "f"], ["g"]]


def test_a_full_queue_drops_the_oldest_and_counts(exporter: Recording, made: list[QuietBatchSpanProcessor],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The queue is bounded: past max_queue_size the oldest queued span is dropped, counted and logged once."""
    dropped: list[int] = []
    processor, provider = processor_for(exporter, schedule_delay_millis=0, max_queue_size=3,
                                        dropped=dropped.append)
    made.append(processor)
    exporter.hold.clear()
    end_spans(provider, "held")
    assert exporter.entered.wait(10)  # the worker is inside export with "held"; the queue is empty
    with caplog.at_level(logging.WARNING, logger="se_exporter.tracing"):
        end_spans(provider, *"abcde")
    assert sum(dropped) == 2
    assert len([r for r in caplog.records if "dropping spans" in r.getMessage()]) == 1
    exporter.hold.set()
    processor.force_flush()
    assert exporter.names == ["held", "c", "d", "e"]


def test_force_flush_exports_at_once(exporter: Recording, made: list[QuietBatchSpanProcessor]) -> None:
    """force_flush does not wait for the schedule delay: every queued span is exported when it returns."""
    processor, provider = processor_for(exporter, schedule_delay_millis=60_000)
    made.append(processor)
    end_spans(provider, "a", "b")
    assert processor.force_flush() is True
    assert exporter.names == ["a", "b"]


def test_shutdown_exports_what_is_left_and_stops(exporter: Recording) -> None:
    """shutdown does not wait for the schedule delay either: queued spans are exported, then the thread and the
    exporter stop, and later spans are not queued."""
    (processor, provider), thread = started_thread_of(lambda: processor_for(exporter, schedule_delay_millis=60_000))
    end_spans(provider, "a")
    processor.shutdown()
    assert exporter.names == ["a"]
    assert exporter.shut and not thread.is_alive()
    end_spans(provider, "late")
    assert processor.force_flush() is False
    assert exporter.names == ["a"]


def test_an_exporter_that_raises_is_logged_and_the_processor_goes_on(
        exporter: Recording, made: list[QuietBatchSpanProcessor], caplog: pytest.LogCaptureFixture) -> None:
    """An exception from the exporter is logged, never raised to the caller or fatal to the thread."""
    processor, provider = processor_for(exporter, schedule_delay_millis=0)
    made.append(processor)
    exporter.fail = True
    with caplog.at_level(logging.ERROR, logger="se_exporter.tracing"):
        end_spans(provider, "lost")
        wait_until(lambda: any("span export raised" in r.getMessage() for r in caplog.records),
                   what="the failure logged")
        assert processor.force_flush() is True
    exporter.fail = False
    end_spans(provider, "kept")
    wait_until(lambda: exporter.names == ["kept"], what="the next span exported")


def test_force_flush_gives_up_on_an_export_that_does_not_end(exporter: Recording,
                                                             made: list[QuietBatchSpanProcessor]) -> None:
    """A collector that never answers cannot hold force_flush (and so SIGTERM) past its timeout: it returns False."""
    processor, provider = processor_for(exporter, schedule_delay_millis=0)
    made.append(processor)
    exporter.hold.clear()
    end_spans(provider, "stuck")
    assert exporter.entered.wait(10)
    assert processor.force_flush(timeout_millis=50) is False
    exporter.hold.set()
    assert processor.force_flush() is True
    assert exporter.names == ["stuck"]
