"""Span and log record batching: OpenTelemetry's exporters behind the sidecar's batching processor, OTEL_BSP_* and
OTEL_BLRP_* checked at start-up with the defaults where unset, drops on a full queue counted and logged once per run,
and a worker that sleeps while nothing is queued."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry, Counter

from se_exporter.cli import build_parser
from se_exporter.core.errors import ConfigError
from se_exporter.sidecar.settings import LOG_BATCHING, Settings, SpanBatching, run_settings
from se_exporter.sidecar.sinks.tracing import Batched, CountingExporter, TracingSink
from tests.support.helpers import wait_until

TRACING_ON = {"OTEL_TRACES_EXPORTER": "console"}


class Recording(SpanExporter):
    """Keeps every batch; can be held inside export (``hold``)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.hold.wait(10)
        self.batches.append([span.name for span in spans])
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.hold.set()

    @property
    def names(self) -> list[str]:
        return [name for batch in self.batches for name in batch]


def batching(env: dict[str, str]) -> SpanBatching:
    return run_settings(build_parser().parse_args(["run"]), {**TRACING_ON, **env}).otel_batch


def log_batching(env: dict[str, str]) -> SpanBatching:
    return run_settings(build_parser().parse_args(["run"]), {"OTEL_LOGS_EXPORTER": "console", **env}).otel_log_batch


def test_unset_otel_bsp_variables_take_the_project_defaults() -> None:
    """Without OTEL_BSP_*, spans go out every half second (the SDK's default is 5 s), 512 at a time, 2,048 queued."""
    assert batching({}) == SpanBatching(schedule_delay_millis=500, max_queue_size=2048, max_export_batch_size=512)


def test_otel_bsp_variables_are_honoured() -> None:
    """Each OTEL_BSP_* variable set replaces its default; the others keep theirs."""
    assert batching({"OTEL_BSP_SCHEDULE_DELAY": "5000", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64"}) == SpanBatching(
        schedule_delay_millis=5000, max_queue_size=2048, max_export_batch_size=64)
    assert batching({"OTEL_BSP_MAX_QUEUE_SIZE": "4096"}).max_queue_size == 4096


@pytest.mark.parametrize(("env", "message"), [
    ({"OTEL_BSP_SCHEDULE_DELAY": "soon"}, "OTEL_BSP_SCHEDULE_DELAY='soon': give a positive whole number"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE='0': give a positive whole number"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "100"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE 512 exceeds the queue (100"),
])
def test_a_bad_otel_bsp_variable_stops_start_up_in_one_line(env: dict[str, str], message: str) -> None:
    """A value the SDK would log and replace at the first span stops start-up instead, saying what to fix."""
    with pytest.raises(ConfigError) as caught:
        batching(env)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_otel_blrp_variables_batch_the_log_records() -> None:
    """Log records keep the SDK's defaults (a one-second schedule), OTEL_BLRP_* replacing them; checked as OTEL_BSP_*
    are."""
    assert log_batching({}) == LOG_BATCHING == SpanBatching(schedule_delay_millis=1000)
    assert log_batching({"OTEL_BLRP_SCHEDULE_DELAY": "100"}).schedule_delay_millis == 100
    with pytest.raises(ConfigError, match="OTEL_BLRP_MAX_QUEUE_SIZE='none': give a positive whole number"):
        log_batching({"OTEL_BLRP_MAX_QUEUE_SIZE": "none"})


def test_otel_bsp_variables_mean_nothing_with_tracing_off() -> None:
    """With no span exporter the batching variables are not read, so a stale one cannot stop the sidecar."""
    settings = run_settings(build_parser().parse_args(["run"]), {"OTEL_BSP_SCHEDULE_DELAY": "soon"})
    assert settings.otel_traces_exporter == "none"


@pytest.mark.parametrize("queue", [2048, 100])
def test_the_drop_counters_help_names_the_queue_bound_in_force(queue: int) -> None:
    """The help of azure_scheduled_events_spans_dropped_total gives the queue's size as configured (the default,
    or OTEL_BSP_MAX_QUEUE_SIZE), not a fixed number."""
    registry = CollectorRegistry()
    batching = SpanBatching(max_queue_size=queue, max_export_batch_size=8)
    sink = TracingSink(Settings(otel_traces_exporter="console", otel_batch=batching), None, registry)
    try:
        [family] = [m for m in registry.collect() if m.name == "azure_scheduled_events_spans_dropped"]
        assert f"queue was full ({queue:,} spans, or 16 MiB)" in family.documentation
    finally:
        sink.shutdown()


def end_spans(provider: TracerProvider, *names: str) -> None:
    tracer = provider.get_tracer("test")
    for name in names:
        tracer.start_span(name).end()


def batched(exporter: SpanExporter, dropped: list[int] | None = None, **batch: int) -> tuple[Batched, TracerProvider]:
    made = Batched(exporter, "spans", SpanBatching(**batch), (dropped if dropped is not None else []).append)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(made))
    return made, provider


def test_a_full_queue_drops_the_oldest_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Past the queue's bound (which counts the spans being exported) the oldest queued span is dropped: each drop is
    counted and one warning says so for the run of them."""
    exporter, dropped = Recording(), []
    made, provider = batched(exporter, dropped, max_queue_size=3, schedule_delay_millis=60_000,
                             max_export_batch_size=1)
    try:
        exporter.hold.clear()
        end_spans(provider, "held")
        assert exporter.entered.wait(10)  # the worker is inside export with "held"
        with caplog.at_level(logging.INFO):
            end_spans(provider, *"abcde")
        assert sum(dropped) == 3
        assert [r.getMessage() for r in caplog.records if "dropping" in r.getMessage()] == [
            "dropping spans: the queue is full (3 of them, or 16 MiB)"]
        exporter.hold.set()
        assert made.force_flush() is True
        assert exporter.names == ["held", "d", "e"]
    finally:
        exporter.hold.set()
        made.shutdown()


def test_the_queue_is_bounded_in_bytes_too() -> None:
    """A collector stuck while spans of 1 MiB each are ended (attributes no sink of ours writes, so the queue's own
    bound is what holds): at most 16 MiB of them stay queued, well within the 2,048 spans allowed; the rest are
    dropped, oldest first, and counted."""
    exporter, dropped = Recording(), []
    made, provider = batched(exporter, dropped, max_queue_size=2048, schedule_delay_millis=60_000,
                             max_export_batch_size=1)
    tracer = provider.get_tracer("test")
    try:
        exporter.hold.clear()
        end_spans(provider, "held")
        assert exporter.entered.wait(10)
        for n in range(40):
            tracer.start_span(f"big{n}", attributes={"blob": "x" * (1 << 20)}).end()
        assert 40 - 16 <= sum(dropped) < 40
        exporter.hold.set()
        assert made.force_flush() is True
        assert exporter.names[-1] == "big39" and len(exporter.names) == 1 + 40 - sum(dropped)
    finally:
        exporter.hold.set()
        made.shutdown()


def test_spans_gather_for_the_schedule_delay_and_a_full_batch_goes_at_once() -> None:
    """Spans ended together go out in one export after the schedule delay; a full batch does not wait for it."""
    exporter = Recording()
    made, provider = batched(exporter, schedule_delay_millis=200, max_export_batch_size=512)
    try:
        end_spans(provider, *"abc")
        wait_until(lambda: exporter.batches, what="the batch exported")
        assert exporter.batches == [["a", "b", "c"]]
    finally:
        made.shutdown()
    exporter = Recording()
    made, provider = batched(exporter, schedule_delay_millis=600_000, max_export_batch_size=2)
    try:
        end_spans(provider, *"de")
        wait_until(lambda: exporter.batches, what="the full batch exported within the 10-minute delay")
        assert exporter.batches == [["d", "e"]]
    finally:
        made.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the thread's wake-ups from /proc")
def test_the_worker_sleeps_while_nothing_is_queued() -> None:
    """With nothing queued the worker is never woken (the SDK's batch processors wake every schedule delay): over
    ten schedule delays after an export, its thread makes at most the two voluntary context switches that can end
    the flush inside the window (its last block on the empty queue, one hand-over of the interpreter lock), where a
    timer would add ten."""
    exporter = Recording()
    made, provider = batched(exporter, schedule_delay_millis=50)
    try:
        end_spans(provider, "a")
        assert made.force_flush() is True
        [worker] = [t for t in threading.enumerate() if t.name == "spans-export" and t.is_alive()]

        def wakeups() -> int:
            status = Path(f"/proc/self/task/{worker.native_id}/status").read_text()
            return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt")))

        before = wakeups()
        time.sleep(0.5)  # the span of time measured, not a wait for something to happen
        assert wakeups() - before <= 2
    finally:
        made.shutdown()


class Refusing(SpanExporter):
    """A collector that is down: every export fails (as after the exporter's timeout)."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        return None


def test_while_stopping_batches_after_a_failed_export_fail_at_once() -> None:
    """At SIGTERM the queued batches are flushed: once one has failed, the rest are failed and counted without
    reaching the exporter, so stopping waits for one export's timeout at most; outside a stop, every batch is
    tried, and a failed batch is dropped, not retried (as OpenTelemetry's processors do)."""
    inner, registry = Refusing(), CollectorRegistry()
    exporter = CountingExporter(inner, Counter("ok_spans", "", registry=registry),
                                Counter("failed_spans", "", registry=registry))
    made, provider = batched(exporter, max_queue_size=16, schedule_delay_millis=60_000, max_export_batch_size=2)
    try:
        end_spans(provider, *"ab")  # one full batch: the worker exports it at once (and fails)
        wait_until(lambda: inner.calls == 1, what="the first batch tried")
        with exporter.failing_fast():
            end_spans(provider, *"cdef")
            made.force_flush()
        assert (inner.calls, registry.get_sample_value("failed_spans_total")) == (1, 6)
        end_spans(provider, "g")
        made.force_flush()
        assert inner.calls == 2
    finally:
        made.shutdown()
