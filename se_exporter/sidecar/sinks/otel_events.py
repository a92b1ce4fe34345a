"""OpenTelemetry events: each lifecycle transition as a log record with ``event.name``, in the event's trace.

OpenTelemetry deprecates span events in favour of log records that carry ``event.name`` and the current span's
context (OTEP 4430). So every transition (``scheduled``, ``started``, ``rescheduled``, ``completed``,
``canceled``) is emitted as one record named ``azure.scheduled_event.<transition>``, with the attributes the spans
carry, in the trace of the event (``spans.trace_id_for``) and the context of its ``scheduled_event`` root span
(``spans.span_id_for(..., "root")``): a backend shows the records under the span, which ends when the event does.
The spans and their span events stay as they are.

Exported by OpenTelemetry's OTLP log exporters (HTTP or gRPC) through the sidecar's batching processor, as spans are
(``tracing.Batched``: ``OTEL_BLRP_*`` as the settings resolved them); headers, certificates and compression are read
by the SDK from the standard variables. The logs signal of the
Python SDK and its OTLP exporters lives in modules named ``_logs`` and ``_log_exporter``: that is where
OpenTelemetry publishes it while the signal's Python API is marked in development, and the only way to it.
Imported only when ``--otel-logs-exporter`` is not ``none``.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client import CollectorRegistry, Counter

from se_exporter.core.lifecycle import SCHEDULED, STARTED, Transition
from se_exporter.core.model import VmIdentity
from se_exporter.core.retry import Health
from se_exporter.sidecar.metrics import NAMESPACE
from se_exporter.sidecar.settings import TracingSettings
from se_exporter.sidecar.sinks import DocumentChange, Sink
from se_exporter.sidecar.sinks.spans import PREFIX, attributes, span_id_for, trace_id_for, transition_extras
from se_exporter.sidecar.sinks.tracing import (
    EXPORT_TIMEOUT_SECONDS,
    MAX_RESPONSE_BYTES,
    Batched,
    exporter_reason,
    quiet_exporters,
    resource_attributes,
)

log = logging.getLogger("se_exporter.otel_events")
EVENT_PREFIX = "azure.scheduled_event."
_WARN = (SCHEDULED, STARTED)  # what a person acts on, as the log sink's levels


def make_log_exporter(settings: TracingSettings) -> Any:
    """The exporter ``--otel-logs-exporter`` names: console, or OTLP over HTTP (``/v1/logs`` is added to a general
    endpoint) or gRPC, bounded as the span exporters are (``tracing.make_exporter``)."""
    if settings.otel_logs_exporter == "console":
        from opentelemetry.sdk._logs.export import ConsoleLogRecordExporter

        return ConsoleLogRecordExporter()
    if settings.otel_logs_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcExporter

        endpoint = settings.otel_logs_endpoint or settings.otel_endpoint
        options: dict[str, Any] = {"timeout": EXPORT_TIMEOUT_SECONDS,
                                   "channel_options": (("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),)}
        return GrpcExporter(endpoint=endpoint, **options) if endpoint else GrpcExporter(**options)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpExporter

    from se_exporter.sidecar.sinks.otlp_http import BoundedSession

    endpoint = settings.otel_logs_endpoint or (
        settings.otel_endpoint.rstrip("/") + "/v1/logs" if settings.otel_endpoint else None)
    session = BoundedSession()
    return HttpExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_SECONDS, session=session) if endpoint \
        else HttpExporter(timeout=EXPORT_TIMEOUT_SECONDS, session=session)


class CountingLogExporter(LogRecordExporter):
    """Counts exported and failed records, and logs once per change of health, saying why in the exporter's own
    words (its per-batch lines are kept out of the log, as the span exporters' are)."""

    def __init__(self, inner: Any, exported: Counter, failed: Counter) -> None:
        self._inner, self._exported, self._failed = inner, exported, failed
        self._health = Health()
        quiet_exporters()

    def export(self, batch: Any) -> LogRecordExportResult:
        exporter_reason(clear=True)
        try:
            result: LogRecordExportResult = self._inner.export(batch)
        except Exception as error:  # an exporter bug must not kill the batch thread
            log.warning("log record export raised: %s", error)
            result = LogRecordExportResult.FAILURE
        if result == LogRecordExportResult.SUCCESS:
            self._exported.inc(len(batch))
            if self._health.recover():
                log.info("log record export recovered")
        else:
            self._failed.inc(len(batch))
            if self._health.fail("export"):
                log.warning("log record export failing (%s): transition records are dropped until the endpoint "
                            "answers", exporter_reason() or type(self._inner).__name__)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


class EventLogSink(Sink):
    """Builds the logger provider at the first document (the resource needs the identity), then emits one record
    per transition."""

    name = "otel_events"

    def __init__(self, settings: TracingSettings, registry: CollectorRegistry, exporter: Any = None) -> None:
        """``exporter``: the one to wrap instead of the one ``settings`` name (tests pass an in-memory one)."""
        self._settings = settings
        exported = Counter(f"{NAMESPACE}_log_records_exported", "Transition log records accepted by the OTLP log "
                           "exporter.", registry=registry)
        failed = Counter(f"{NAMESPACE}_log_record_export_errors", "Transition log records the log exporter failed "
                         "to deliver.", registry=registry)
        # Built at start-up, so a bad exporter setting fails there and not at the first event.
        inner = exporter if exporter is not None else make_log_exporter(settings)
        self._exporter = Batched(CountingLogExporter(inner, exported, failed), "log records", settings.log_batch)
        self._provider: LoggerProvider | None = None
        self._logger: Any = None

    def _build(self, identity: VmIdentity | None) -> None:
        provider = LoggerProvider(resource=Resource.create(resource_attributes(self._settings, identity)))
        provider.add_log_record_processor(SimpleLogRecordProcessor(self._exporter))  # type: ignore[arg-type]
        self._provider = provider
        self._logger = provider.get_logger("se_exporter")
        log.info("exporting lifecycle transitions as log records with %s", self._settings.otel_logs_exporter)

    def export(self, change: DocumentChange) -> None:
        if self._provider is None:  # at the first document, as the span sink: its cost shows from the start
            self._build(change.identity)
        if not change.transitions:
            return
        identity = change.identity
        vm_key = f"{identity.vm_id if identity else ''}/{change.vm_name or ''}"  # as SpanSink's
        for transition in change.transitions:
            self._emit(transition, vm_key, change)

    def _emit(self, transition: Transition, vm_key: str, change: DocumentChange) -> None:
        event, kind = transition.event, transition.kind
        attrs = {**attributes(event, change.document.incarnation, change.vm_name),
                 PREFIX + "transition": kind.value, **transition_extras(transition, change)}
        context = trace.set_span_in_context(NonRecordingSpan(SpanContext(
            trace_id=trace_id_for(event.event_id), span_id=span_id_for(event.event_id, vm_key, "root"),
            is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))))
        warn = kind in _WARN
        self._logger.emit(
            timestamp=int(change.observed_at * 1e9), context=context, event_name=EVENT_PREFIX + kind.value,
            severity_number=SeverityNumber.WARN if warn else SeverityNumber.INFO,
            severity_text="WARN" if warn else "INFO", body=f"{event.event_type} {event.event_id} {kind.value}",
            attributes=attrs)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._exporter.force_flush(min(timeout_millis, 3000))

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()  # its processor shuts the batching processor down
        else:
            self._exporter.shutdown()


def make_event_logs(settings: TracingSettings, registry: CollectorRegistry) -> EventLogSink:
    """Called only when the logs exporter is on: importing this module is what loads the logs SDK."""
    return EventLogSink(settings, registry)
