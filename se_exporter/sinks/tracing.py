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
import warnings
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry, Counter

from se_exporter import __version__
from se_exporter.config import TracingSettings
from se_exporter.metrics import NAMESPACE
from se_exporter.model import VmIdentity, vm_name
from se_exporter.retry import Health
from se_exporter.sinks import DocumentChange, Sink
from se_exporter.sinks.spans import PREFIX, EventIdGenerator, SpanSink

log = logging.getLogger("se_exporter.tracing")
EXPORT_TIMEOUT_SECONDS = 5


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
    return " ".join(part for part in parts if part) + "\n"


def make_exporter(settings: TracingSettings) -> Any:
    if settings.otel_traces_exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        if settings.log_format == "json":  # the SDK's JSON, one object per line, for machines
            return ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
        return ConsoleSpanExporter(formatter=span_line)
    if settings.otel_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        endpoint = settings.otel_traces_endpoint or settings.otel_endpoint
        return GrpcExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_SECONDS) if endpoint \
            else GrpcExporter(timeout=EXPORT_TIMEOUT_SECONDS)
    with _without_charset_detection():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        endpoint = settings.otel_traces_endpoint or (
            settings.otel_endpoint.rstrip("/") + "/v1/traces" if settings.otel_endpoint else None)
        return HttpExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_SECONDS) if endpoint \
            else HttpExporter(timeout=EXPORT_TIMEOUT_SECONDS)


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


class CountingExporter(SpanExporter):
    """Wraps the real exporter: counts exported and failed spans, logs once per change of health.

    The OTLP exporters log every failed batch themselves; one line when export starts failing and one when it
    recovers is what an operator needs, so their own loggers are turned down to errors at set-up.
    """

    def __init__(self, inner: Any, exported: Any, failed: Any) -> None:
        self._inner, self._exported, self._failed = inner, exported, failed
        self._health = Health()

    def export(self, spans: Any) -> SpanExportResult:
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
        return str(endpoint) if endpoint else type(self._inner).__name__

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


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
        for name in ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                     "opentelemetry.exporter.otlp.proto.grpc.exporter", "opentelemetry.sdk.trace.export"):
            logging.getLogger(name).setLevel(logging.ERROR)
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
        provider.add_span_processor(BatchSpanProcessor(self._exporter, schedule_delay_millis=500,
                                                       export_timeout_millis=EXPORT_TIMEOUT_SECONDS * 1000))
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
