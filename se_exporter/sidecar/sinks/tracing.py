"""Tracing set-up the OpenTelemetry way, importing only what is configured.

This module itself is imported only when tracing is on (``Sidecar.start``), so it may import the SDK.

``none`` imports nothing from OpenTelemetry at all. ``console`` needs only the SDK. ``otlp`` adds the
HTTP exporter, or the gRPC one when ``grpc`` is asked for (grpcio alone costs ~28 MB on import).
Standard variables the exporters read themselves (headers, certificates, compression) keep working.

The resource is built from the compute metadata the sidecar already read through its own IMDS
client, with the keys opentelemetry-resource-detector-azure uses; the provider is therefore created
at the first document, when the identity is known (or known to be unavailable).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, Context, attach, detach, set_value
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry, Counter

from se_exporter import __version__
from se_exporter.core.model import VmIdentity, vm_name
from se_exporter.core.retry import Health
from se_exporter.infra.logs import escape
from se_exporter.sidecar.metrics import NAMESPACE
from se_exporter.sidecar.settings import TracingSettings
from se_exporter.sidecar.sinks import DocumentChange, Sink
from se_exporter.sidecar.sinks.spans import PREFIX, EventIdGenerator, SpanSink

log = logging.getLogger("se_exporter.tracing")
EXPORT_TIMEOUT_SECONDS = 5  # a deadline for each whole export, retries included (both exporters count from its start)
MAX_RESPONSE_BYTES = 64 * 1024  # of a collector's answer, read by either exporter (see otlp_http.py)
SHUTDOWN_TIMEOUT_SECONDS = EXPORT_TIMEOUT_SECONDS  # for the worker's last export; the thread is a daemon anyway


def resource_attributes(settings: TracingSettings, identity: VmIdentity | None) -> dict[str, str]:
    values = {"service.name": settings.otel_service_name, "service.version": __version__,
              "cloud.provider": "azure", "cloud.platform": "azure_vm"}
    if identity is not None:
        values.update({
            "cloud.region": identity.location, "cloud.resource_id": identity.resource_id,
            "host.id": identity.vm_id, "host.name": vm_name(settings.vm_name, identity) or "",
            "host.type": identity.vm_size,
            "os.type": identity.os_type.lower(), "os.version": identity.os_version,
            "service.instance.id": identity.vm_id, "azure.vm.scaleset.name": identity.vmss_name,
            "azure.vm.sku": identity.sku, "cloud.availability_zone": identity.zone,
        })
    return {key: value for key, value in values.items() if value}


def span_line(span: ReadableSpan) -> str:
    """A span as one short line for people (``console`` with ``--log-format text``): when it ended, its name, the
    event, what happened, how long it lasted, and the trace id to look it up by, e.g.

    ``2026-11-22T03:10:46.262Z span scheduled_event.update  Freeze C7061BAC-... started  trace c9f28525...``

    Event strings come from IMDS, so they are escaped the way log lines are (``logs.escape``): a newline, an
    ANSI escape or U+2028 in an EventId shows as ``\\n``, ``\\x1b``, ``\\u2028`` and cannot forge a line.
    """
    attributes = span.attributes or {}
    end = (span.end_time or span.start_time or 0) / 1e9
    stamp = datetime.fromtimestamp(end, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    what = attributes.get(PREFIX + "transition") or attributes.get(PREFIX + "outcome") or ""
    duration = ""
    if span.name != "scheduled_event.update" and span.start_time is not None and span.end_time is not None:
        duration = f"{(span.end_time - span.start_time) / 1e9:.1f}s"
    trace_id = f"{span.context.trace_id:032x}" if span.context is not None else ""
    parts = [stamp, "span", f"{span.name:<24}", str(attributes.get(PREFIX + "type", "")),
             str(attributes.get(PREFIX + "id", "")), str(what), duration, f"trace {trace_id}"]
    return escape(" ".join(part for part in parts if part)) + "\n"


def make_exporter(settings: TracingSettings) -> Any:
    if settings.otel_traces_exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        if settings.log_format == "json":  # the SDK's JSON, one object per line, for machines
            return ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
        return ConsoleSpanExporter(formatter=span_line)
    if settings.otel_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        endpoint = settings.otel_traces_endpoint or settings.otel_endpoint
        # gRPC's timeout is a deadline for the whole call; the answer is capped by the channel, like HTTP's below.
        options: dict[str, Any] = {
            "timeout": EXPORT_TIMEOUT_SECONDS,
            "channel_options": (("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),)}
        return GrpcExporter(endpoint=endpoint, **options) if endpoint else GrpcExporter(**options)
    with _without_charset_detection():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        from se_exporter.sidecar.sinks.otlp_http import BoundedSession

        endpoint = settings.otel_traces_endpoint or (
            settings.otel_endpoint.rstrip("/") + "/v1/traces" if settings.otel_endpoint else None)
        # The session bounds the whole exchange by the timeout and the answer's bytes (otlp_http.py).
        session = BoundedSession()
        return HttpExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_SECONDS, session=session) if endpoint \
            else HttpExporter(timeout=EXPORT_TIMEOUT_SECONDS, session=session)


@contextlib.contextmanager
def _without_charset_detection() -> Iterator[None]:
    """Import requests (the OTLP/HTTP exporter's HTTP client) without a character-set detector.

    requests loads charset_normalizer (and with it every CJK codec) only to guess the encoding of a
    body that names no charset: for the exporter, an error body it logs. Since requests 2.32 the
    detector is optional (the guess becomes UTF-8). Leaving it out saves ~2.9 MB of the sidecar's RSS,
    a tenth of its Python heap. Only requests' first import is affected: the names are put back at
    once, so any other library can still import the detector if it needs it.
    """
    names = [] if "requests" in sys.modules else [
        name for name in ("chardet", "charset_normalizer") if name not in sys.modules]
    for name in names:
        sys.modules[name] = None  # type: ignore[assignment]  # "import" now raises ImportError
    try:
        with warnings.catch_warnings():
            # requests' own words when it finds no detector; it then decodes bodies without a charset as UTF-8.
            warnings.filterwarnings("ignore", message="Unable to find acceptable character detection dependency")
            yield
    finally:
        for name in names:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]


class _ExporterReasons(logging.Filter):
    """Keeps the OTLP exporters' own log lines out of the log, remembering the latest: why an export failed.

    The exporters log every failed batch (and every retry); one line when export starts failing, saying why, and
    one when it recovers is what an operator needs (``CountingExporter``)."""

    LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
               "opentelemetry.exporter.otlp.proto.grpc.exporter", "opentelemetry.exporter.otlp.common.http")

    def __init__(self) -> None:
        super().__init__()
        self.last: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self.last = escape(record.getMessage())[:300]
        return False

    def install(self) -> None:
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            if self not in logger.filters:
                logger.addFilter(self)


_REASONS = _ExporterReasons()  # loggers are process-wide: one filter on them, whichever sink installed it


class CountingExporter(SpanExporter):
    """Wraps the real exporter: counts exported and failed spans, logs once per change of health, saying why
    (the exporter's own words, which ``_ExporterReasons`` keeps out of the log)."""

    def __init__(self, inner: Any, exported: Any, failed: Any) -> None:
        self._inner, self._exported, self._failed = inner, exported, failed
        self._health = Health()
        _REASONS.install()

    def export(self, spans: Any) -> SpanExportResult:
        _REASONS.last = None
        try:
            result: SpanExportResult = self._inner.export(spans)
        except Exception as error:  # an exporter bug must not kill the batch thread
            log.warning("span export raised: %s", error)
            result = SpanExportResult.FAILURE
        if result == SpanExportResult.SUCCESS:
            self._exported.inc(len(spans))
            if self._health.recover():
                log.info("span export recovered")
        else:
            self._failed.inc(len(spans))
            if self._health.fail("export"):
                log.warning("span export failing (%s): spans are dropped until the endpoint answers",
                            self._describe())
        return result

    def _describe(self) -> str:
        endpoint = getattr(self._inner, "_endpoint", None)
        where = str(endpoint) if endpoint else type(self._inner).__name__
        return f"{where}: {_REASONS.last}" if _REASONS.last else where

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


class QuietBatchSpanProcessor(SpanProcessor):
    """Batches ended spans to an exporter, like OpenTelemetry's ``BatchSpanProcessor``, but its thread sleeps until
    a span is queued.

    The SDK's processor wakes every schedule delay to look for spans whether there are any or not: 2 wake-ups and
    ~0.2 ms of CPU a second at our 0.5 s, in a sidecar that otherwise sleeps between polls (issue 14). Here the
    thread waits on a condition with no timeout; the first span queued wakes it, it then lets a batch gather for
    the schedule delay (or until a batch is full, a flush or shutdown), exports, and sleeps again. The same
    guarantees as the SDK's: a bounded queue (when full, the oldest span is dropped, counted and logged once per
    run of drops), exports in batches of at most ``max_export_batch_size``, an exporter's exception logged and
    never raised, ``force_flush`` exporting everything queued before it returns, ``shutdown`` exporting what is
    left, then stopping the thread and the exporter. Both are bounded, so SIGTERM stays prompt with a collector
    that never answers: each export by the exporter's own timeout (5 s), the wait for an export under way by
    ``force_flush``'s timeout and by one export's time at shutdown.
    """

    def __init__(self, exporter: SpanExporter, schedule_delay_millis: float = 500, max_queue_size: int = 2048,
                 max_export_batch_size: int = 512, dropped: Callable[[int], None] | None = None) -> None:
        self._exporter = exporter
        self._delay = schedule_delay_millis / 1000
        self._max_queue, self._max_batch = max_queue_size, max_export_batch_size
        self._dropped = dropped
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Condition()
        self._export_lock = threading.Lock()  # one export at a time: the worker's or a flush's
        self._stopping = False
        self._flushing = 0  # flushes waiting: the worker stops gathering and exports at once
        self._dropping = False
        self._thread = threading.Thread(target=self._run, name="spans", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return
        with self._wake:
            if self._stopping:
                self._drop(1, "after shutdown")
                return
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self._drop(1, "the span queue is full")
            else:
                self._dropping = False
            self._queue.append(span)
            if len(self._queue) == 1 or len(self._queue) >= self._max_batch:
                self._wake.notify()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every span queued so far, in this thread, before returning (as the SDK's does); False if an export
        already under way did not end within ``timeout_millis`` (the SDK's would wait for it however long)."""
        with self._wake:
            if self._stopping:
                return False
            self._flushing += 1
            self._wake.notify()
        try:
            if not self._export_lock.acquire(timeout=timeout_millis / 1000):
                return False
            try:
                self._export_batches()
            finally:
                self._export_lock.release()
        finally:
            with self._wake:
                self._flushing -= 1
        return True

    def shutdown(self) -> None:
        with self._wake:
            if self._stopping:
                return
            self._stopping = True
            self._wake.notify()
        self._thread.join(SHUTDOWN_TIMEOUT_SECONDS)  # the worker exports what is left before it ends
        self._exporter.shutdown()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stopping:
                    self._wake.wait()  # no timeout: nothing to do, so nothing wakes this thread
                if self._stopping:
                    break
                gather_until = time.monotonic() + self._delay
                while len(self._queue) < self._max_batch and not self._stopping and not self._flushing:
                    left = gather_until - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
            self._export_queued()
        self._export_queued()

    def _export_queued(self) -> None:
        with self._export_lock:
            self._export_batches()

    def _export_batches(self) -> None:
        while True:
            with self._wake:
                batch = [self._queue.popleft() for _ in range(min(self._max_batch, len(self._queue)))]
            if not batch:
                return
            token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))  # no spans about exporting spans
            try:
                self._exporter.export(batch)
            except Exception:  # an exporter's failure is logged; the thread and the caller go on
                log.exception("span export raised")
            finally:
                detach(token)

    def _drop(self, count: int, why: str) -> None:
        if self._dropped is not None:
            self._dropped(count)
        if not self._dropping:
            log.warning("dropping spans: %s (azure_scheduled_events_spans_dropped_total counts them)", why)
        self._dropping = True


class TracingSink(Sink):
    """Builds the provider and the span sink at the first document, then delegates to it."""

    name = "spans"

    def __init__(self, settings: TracingSettings, state_dir: Path | None, registry: CollectorRegistry) -> None:
        self._settings = settings
        self._state_dir = state_dir
        self._sink: SpanSink | None = None
        exported = Counter(f"{NAMESPACE}_spans_exported", "Spans accepted by the trace exporter.", registry=registry)
        failed = Counter(f"{NAMESPACE}_span_export_errors", "Spans the trace exporter failed to deliver.",
                         registry=registry)
        self._spans_dropped = Counter(f"{NAMESPACE}_spans_dropped", "Spans dropped before export because the span "
                                      "queue was full (2,048 spans).", registry=registry)
        logging.getLogger("opentelemetry.sdk.trace.export").setLevel(logging.ERROR)
        # Built at start-up, so a bad exporter setting fails there and not at the first event.
        self._exporter = CountingExporter(make_exporter(settings), exported, failed)

    def export(self, change: DocumentChange) -> None:
        if self._sink is None:
            self._sink = self._build(change.identity)
        self._sink.export(change)

    def _build(self, identity: VmIdentity | None) -> SpanSink:
        ids = EventIdGenerator()
        provider = TracerProvider(resource=Resource.create(resource_attributes(self._settings, identity)),
                                  id_generator=ids)
        # A half-second schedule: an update span reaches the backend within about half a second of the change.
        provider.add_span_processor(QuietBatchSpanProcessor(self._exporter, schedule_delay_millis=500,
                                                            dropped=self._spans_dropped.inc))
        log.info("exporting spans with %s (%s)", self._settings.otel_traces_exporter,
                 self._settings.otel_protocol if self._settings.otel_traces_exporter == "otlp" else "stdout")
        return SpanSink(provider, ids, self._state_dir)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._sink.force_flush(min(timeout_millis, 3000))) if self._sink is not None else True

    def shutdown(self) -> None:
        if self._sink is not None:
            self._sink.shutdown()
        else:
            self._exporter.shutdown()


def make_tracing(settings: TracingSettings, state_dir: Path | None, registry: CollectorRegistry) -> TracingSink:
    """Called only when tracing is on: importing this module is what loads the SDK."""
    return TracingSink(settings, state_dir, registry)
