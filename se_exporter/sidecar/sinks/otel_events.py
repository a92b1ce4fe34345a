"""OpenTelemetry events: each lifecycle transition as a log record with ``event.name``, in the event's trace.

OpenTelemetry deprecates span events in favour of log records carrying ``event.name`` and the span's context, so
every transition is one record named ``azure.scheduled_event.<transition>`` with the spans' attributes, in the
context of the event's ``scheduled_event`` root span: a backend shows the records under the span.

Exported by OpenTelemetry's OTLP log exporters (HTTP or gRPC) through the sidecar's batching processor, as spans are
(``tracing.Batched``: ``OTEL_BLRP_*`` as the settings resolved them); the exporters' own variables are read by the SDK.
The Python logs signal lives in modules named ``_logs`` and ``_log_exporter``: that is where OpenTelemetry publishes
it while its API is in development, and the only way to it.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, Counter

from se_exporter.core.lifecycle import SCHEDULED, STARTED, Transition
from se_exporter.core.model import VmIdentity
from se_exporter.sidecar.metrics import NAMESPACE
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import DocumentChange, PauseFelt, Sink
from se_exporter.sidecar.sinks.facts import event_facts, pause_facts, transition_facts
from se_exporter.sidecar.sinks.spans import PREFIX, attributes, root_context, vm_key
from se_exporter.sidecar.sinks.tracing import Batched, Counting, bounded, resource_attributes, signal_url

log = logging.getLogger("se_exporter.otel_events")
_WARN = (SCHEDULED, STARTED)  # what a person acts on, as the log sink's levels


def make_log_exporter(settings: Settings) -> Any:
    """The exporter ``--otel-logs-exporter`` names: console, or OTLP over HTTP (``/v1/logs`` is added to a general
    endpoint) or gRPC, bounded as the span exporters are."""
    if settings.otel_logs_exporter == "console":
        from opentelemetry.sdk._logs.export import ConsoleLogRecordExporter

        return ConsoleLogRecordExporter()
    if settings.otel_logs_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcExporter

        return bounded(GrpcExporter, settings.otel_logs_endpoint or settings.otel_endpoint, grpc=True)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpExporter

    return bounded(HttpExporter, settings.otel_logs_endpoint or signal_url(settings.otel_endpoint, "logs"))


class CountingLogExporter(Counting, LogRecordExporter):
    """``Counting`` for transition log records."""

    noun = "log record"
    dropped = "transition records"
    results = LogRecordExportResult


class EventLogSink(Sink):
    """Builds the logger provider at the first document (the resource needs the identity), then emits one record
    per transition."""

    name = "otel_events"

    def __init__(self, settings: Settings, registry: CollectorRegistry, exporter: Any = None) -> None:
        """``exporter``: the one to wrap instead of the one ``settings`` name (tests pass an in-memory one)."""
        self._settings = settings
        exported = Counter(f"{NAMESPACE}_log_records_exported", "Transition log records accepted by the OTLP log "
                           "exporter.", registry=registry)
        failed = Counter(f"{NAMESPACE}_log_record_export_errors", "Transition log records the log exporter failed "
                         "to deliver.", registry=registry)
        # Built at start-up, so a bad exporter setting fails there and not at the first event.
        inner = exporter if exporter is not None else make_log_exporter(settings)
        self._exporter = Batched(CountingLogExporter(inner, exported, failed,
                                                     where=settings.otel_logs_endpoint or settings.otel_endpoint),
                                 "log records", settings.otel_log_batch)
        self._provider: LoggerProvider | None = None
        self._logger: Any = None

    def _build(self, identity: VmIdentity | None) -> None:
        provider = LoggerProvider(resource=Resource.create(resource_attributes(self._settings, identity)))
        provider.add_log_record_processor(SimpleLogRecordProcessor(self._exporter))  # type: ignore[arg-type]
        self._provider = provider
        self._logger = provider.get_logger("se_exporter")
        log.info("exporting lifecycle transitions as log records with %s", self._settings.otel_logs_exporter)

    def on_change(self, change: DocumentChange) -> None:
        if self._provider is None:  # at the first document, as the span sink: its cost shows from the start
            self._build(change.identity)
        for transition in change.transitions:
            self._emit(transition, change)

    def _emit(self, transition: Transition, change: DocumentChange) -> None:
        event, kind = transition.event, transition.kind
        attrs = attributes(event_facts(event, change.document.incarnation, change.vm_name),
                           transition_facts(transition, change))
        warn = kind in _WARN
        self._logger.emit(
            timestamp=int(change.observed_at * 1e9), context=root_context(event.event_id, vm_key(change)),
            event_name=PREFIX + kind.value,
            severity_number=SeverityNumber.WARN if warn else SeverityNumber.INFO,
            severity_text="WARN" if warn else "INFO", body=f"{event.event_type} {event.event_id} {kind.value}",
            attributes=attrs)

    def on_pause(self, felt: PauseFelt) -> None:
        """One record ``azure.scheduled_event.pause`` per pause: in its event's trace, or in none (unannounced)."""
        if self._provider is None:
            self._build(felt.identity)
        record = felt.record
        facts = event_facts(record.event, None, felt.vm_name) if record is not None else {}
        what = f"during {record.event.event_type} {record.event.event_id}" if record is not None else "unannounced"
        self._logger.emit(
            timestamp=int((felt.began_at + felt.pause.seconds) * 1e9),
            context=None if record is None else root_context(record.event.event_id, vm_key(felt)),
            event_name=PREFIX + "pause", severity_number=SeverityNumber.WARN, severity_text="WARN",
            body=f"paused {felt.pause.seconds:.2f} s {what}", attributes=attributes(facts, pause_facts(felt)))

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._exporter.force_flush(min(timeout_millis, 3000))

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()  # its processor shuts the batching processor down
        else:
            self._exporter.shutdown()


def make_event_logs(settings: Settings, registry: CollectorRegistry) -> EventLogSink:
    """Called only when the logs exporter is on: importing this module is what loads the logs SDK."""
    return EventLogSink(settings, registry)
