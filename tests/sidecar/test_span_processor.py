"""Span batching: OpenTelemetry's own BatchSpanProcessor, OTEL_BSP_* checked at start-up with the project's
defaults where unset, and its drops on a full queue counted and logged once per run."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry, Counter

from se_exporter.cli import build_parser
from se_exporter.core.errors import ConfigError
from se_exporter.sidecar.settings import SpanBatching, TracingSettings, run_settings
from se_exporter.sidecar.sinks.tracing import CountingExporter, TracingSink, _QueueDrops
from tests.helpers import wait_until

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
    return run_settings(build_parser().parse_args(["run"]), {**TRACING_ON, **env}).tracing.batch


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


def test_otel_bsp_variables_mean_nothing_with_tracing_off() -> None:
    """With no span exporter the batching variables are not read, so a stale one cannot stop the sidecar."""
    settings = run_settings(build_parser().parse_args(["run"]), {"OTEL_BSP_SCHEDULE_DELAY": "soon"})
    assert settings.otel_traces_exporter == "none"


@pytest.mark.parametrize("queue", [2048, 100])
def test_the_drop_counters_help_names_the_queue_bound_in_force(queue: int) -> None:
    """The help of azure_scheduled_events_spans_dropped_total gives the queue's size as configured (the default,
    or OTEL_BSP_MAX_QUEUE_SIZE), not a fixed number."""
    registry = CollectorRegistry()
    sink = TracingSink(TracingSettings(otel_traces_exporter="console", batch=SpanBatching(max_queue_size=queue,
                                                                                          max_export_batch_size=8)),
                       None, registry)
    try:
        [family] = [m for m in registry.collect() if m.name == "azure_scheduled_events_spans_dropped"]
        assert f"queue was full ({queue:,} spans)" in family.documentation
    finally:
        sink.shutdown()


@pytest.fixture
def processor() -> Iterator[tuple[BatchSpanProcessor, TracerProvider, Recording, list[int]]]:
    exporter, dropped = Recording(), []
    drops = _QueueDrops(dropped.append)
    drops.install()
    made = BatchSpanProcessor(exporter, max_queue_size=3, schedule_delay_millis=60_000, max_export_batch_size=1)
    provider = TracerProvider()
    provider.add_span_processor(made)
    yield made, provider, exporter, dropped
    exporter.hold.set()
    made.shutdown()
    logging.getLogger(_QueueDrops.LOGGER).removeFilter(drops)


def end_spans(provider: TracerProvider, *names: str) -> None:
    tracer = provider.get_tracer("test")
    for name in names:
        tracer.start_span(name).end()


def test_a_full_queue_drops_the_oldest_counted_and_logged_once(
        processor: tuple[BatchSpanProcessor, TracerProvider, Recording, list[int]],
        caplog: pytest.LogCaptureFixture) -> None:
    """Past OTEL_BSP_MAX_QUEUE_SIZE the SDK drops the oldest queued span: each drop is counted, one warning says
    so for the run of them, and the SDK's own line per span stays out of the log."""
    made, provider, exporter, dropped = processor
    exporter.hold.clear()
    end_spans(provider, "held")
    assert exporter.entered.wait(10)  # the worker is inside export with "held"; the queue is empty
    with caplog.at_level(logging.INFO):
        end_spans(provider, *"abcde")
    assert sum(dropped) == 2
    assert [r.getMessage() for r in caplog.records if "dropping" in r.getMessage().lower()
            or "queue full" in r.getMessage().lower()] == [
        "dropping spans: the span queue is full (azure_scheduled_events_spans_dropped_total counts them)"]
    exporter.hold.set()
    assert made.force_flush() is True
    assert exporter.names == ["held", "c", "d", "e"]


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
    """At SIGTERM the SDK's force_flush exports every queued batch whatever its timeout: once one has failed, the
    rest are failed and counted without reaching the exporter, so stopping waits for one export's timeout at most;
    outside a stop, every batch is tried."""
    inner, registry = Refusing(), CollectorRegistry()
    exporter = CountingExporter(inner, Counter("ok_spans", "", registry=registry),
                                Counter("failed_spans", "", registry=registry))
    made = BatchSpanProcessor(exporter, max_queue_size=16, schedule_delay_millis=60_000, max_export_batch_size=2)
    provider = TracerProvider()
    provider.add_span_processor(made)
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
