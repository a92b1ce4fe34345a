"""Tracing set-up the OpenTelemetry way, importing only what is configured (what each costs: docs/traces.md).

Imported only when tracing or the log records are on (``Sidecar.start``). The resource (docs/traces.md; names from
the semantic conventions' ``_incubating`` package, where the project publishes them, the ``azure.vm.*`` keys from
opentelemetry-resource-detector-azure) needs the compute metadata: the provider is made at the first document.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.semconv._incubating.attributes import (
    azure_attributes,
    cloud_attributes,
    host_attributes,
    os_attributes,
)
from opentelemetry.semconv.attributes import k8s_attributes, service_attributes
from prometheus_client import CollectorRegistry, Counter

from se_exporter import __version__
from se_exporter.core.model import VmIdentity, vm_name
from se_exporter.core.retry import Health
from se_exporter.infra.batching import BatchProcessor, Deliverer, MemoryQueue
from se_exporter.infra.logs import escape
from se_exporter.sidecar.metrics import NAMESPACE
from se_exporter.sidecar.settings import Settings, SpanBatching
from se_exporter.sidecar.sinks import DocumentChange, PauseFelt, Sink
from se_exporter.sidecar.sinks.spans import PREFIX, EventIdGenerator, SpanSink

log = logging.getLogger("se_exporter.tracing")
# The spans and log records waiting for the collector hold at most this much (and OTEL_BSP_MAX_QUEUE_SIZE of them):
# a collector down costs dropped items, counted, never memory.
MAX_QUEUE_BYTES = 16 * 1024 * 1024
EXPORT_TIMEOUT_SECONDS = 5  # a deadline for each whole export, retries included (both exporters count from its start)
MAX_RESPONSE_BYTES = 64 * 1024  # of a collector's answer, read by either exporter (see otlp_http.py)


def resource_attributes(settings: Settings, identity: VmIdentity | None) -> dict[str, str]:
    """The resource of spans and log records: what backends join on (``cloud.resource_id``, ``host.id``,
    ``k8s.node.name``). In a Kubernetes pod the platform is ``azure.aks`` (the project's Kubernetes deployment is
    for AKS), else ``azure.vm``."""
    platform = cloud_attributes.CloudPlatformValues.AZURE_AKS if settings.kubernetes \
        else cloud_attributes.CloudPlatformValues.AZURE_VM
    values = {service_attributes.SERVICE_NAME: settings.otel_service_name,
              service_attributes.SERVICE_VERSION: __version__,
              cloud_attributes.CLOUD_PROVIDER: cloud_attributes.CloudProviderValues.AZURE.value,
              cloud_attributes.CLOUD_PLATFORM: platform.value,
              k8s_attributes.K8S_NODE_NAME: settings.k8s_node_name or ""}
    if identity is not None:
        values.update({
            cloud_attributes.CLOUD_REGION: identity.location, cloud_attributes.CLOUD_RESOURCE_ID: identity.resource_id,
            cloud_attributes.CLOUD_ACCOUNT_ID: identity.subscription_id,
            cloud_attributes.CLOUD_AVAILABILITY_ZONE: identity.zone,
            azure_attributes.AZURE_RESOURCE_GROUP_NAME: identity.resource_group,
            host_attributes.HOST_ID: identity.vm_id,
            host_attributes.HOST_NAME: vm_name(settings.vm_name, identity) or "",
            host_attributes.HOST_TYPE: identity.vm_size,
            os_attributes.OS_TYPE: identity.os_type.lower(), os_attributes.OS_VERSION: identity.os_version,
            service_attributes.SERVICE_INSTANCE_ID: identity.vm_id, "azure.vm.scaleset.name": identity.vmss_name,
            "azure.vm.sku": identity.sku,
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
    duration = _lasted(span)
    trace_id = f"{span.context.trace_id:032x}" if span.context is not None else ""
    parts = [stamp, "span", f"{span.name:<24}", str(attributes.get(PREFIX + "type", "")),
             str(attributes.get(PREFIX + "id", "")), str(what), duration, f"trace {trace_id}"]
    return escape(" ".join(part for part in parts if part)) + "\n"


def _lasted(span: ReadableSpan) -> str:
    """How long a span lasted, for ``span_line``; nothing for a zero-length update span."""
    if span.name == "scheduled_event.update" or span.start_time is None or span.end_time is None:
        return ""
    return f"{(span.end_time - span.start_time) / 1e9:.1f}s"


def make_exporter(settings: Settings) -> Any:
    if settings.otel_traces_exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        if settings.log_format == "json":  # the SDK's JSON, one object per line, for machines
            return ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
        return ConsoleSpanExporter(formatter=span_line)
    if settings.otel_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return bounded(GrpcExporter, settings.otel_traces_endpoint or settings.otel_endpoint, grpc=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return bounded(HttpExporter, settings.otel_traces_endpoint or signal_url(settings.otel_endpoint, "traces"))


def signal_url(endpoint: str | None, signal: str) -> str | None:
    """OTLP/HTTP's URL for one signal under a general endpoint, as the exporters make it from the variable."""
    return f"{endpoint.rstrip('/')}/v1/{signal}" if endpoint else None


def bounded(exporter: Callable[..., Any], endpoint: str | None, grpc: bool = False) -> Any:
    """An OTLP exporter (spans or log records) with a deadline for each whole export and a cap on the answer read:
    gRPC's timeout is a deadline for the call and its channel caps the answer; HTTP's session does both."""
    options: dict[str, Any] = {"timeout": EXPORT_TIMEOUT_SECONDS}
    if endpoint:
        options["endpoint"] = endpoint
    if grpc:
        options["channel_options"] = (("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),)
    else:
        from se_exporter.sidecar.sinks.otlp_http import BoundedSession

        options["session"] = BoundedSession()
    return exporter(**options)


class _ExporterReasons(logging.Filter):
    """Keeps the OTLP exporters' own log lines out of the log, remembering the latest: why an export failed.

    The exporters log every failed batch (and every retry); one line when export starts failing, saying why, and
    one when it recovers is what an operator needs (``CountingExporter``)."""

    LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
               "opentelemetry.exporter.otlp.proto.http._log_exporter",
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


class Counting:
    """Wraps the real exporter: counts what it exported and failed to, logs once per change of health, saying why
    (the exporter's own words, which ``_ExporterReasons`` keeps out of the log). ``where``: the endpoint, as said."""

    noun = "span"
    dropped = "spans"
    results: Any = SpanExportResult  # SUCCESS and FAILURE, of the signal's own enum

    def __init__(self, inner: Any, exported: Any, failed: Any, where: str | None = None) -> None:
        self._inner, self._exported, self._failed = inner, exported, failed
        self._where = where or type(inner).__name__
        self._health = Health()
        self._fail_fast = False
        _REASONS.install()

    def export(self, batch: Any) -> Any:
        _REASONS.last = None
        if self._fail_fast and self._health.failing is not None:  # stopping: one export's timeout is enough
            self._failed.inc(len(batch))
            return self.results.FAILURE
        try:
            result = self._inner.export(batch)
        except Exception as error:  # an exporter bug must not kill the batch thread
            log.warning("%s export raised: %s", self.noun, error)
            result = self.results.FAILURE
        if result == self.results.SUCCESS:
            self._exported.inc(len(batch))
            if self._health.recover():
                log.info("%s export recovered", self.noun)
        else:
            self._failed.inc(len(batch))
            if self._health.fail("export"):
                where = f"{self._where}: {_REASONS.last}" if _REASONS.last else self._where
                log.warning("%s export failing (%s): %s are dropped until the endpoint answers", self.noun, where,
                            self.dropped)
        return result

    @contextlib.contextmanager
    def failing_fast(self) -> Iterator[None]:
        """While stopping: once an export has failed, the batches after it fail at once, counted, instead of each
        waiting out the exporter's timeout: a flush and a shutdown export every queued batch, so this is what keeps
        SIGTERM prompt with a collector that never answers."""
        self._fail_fast = True
        try:
            yield
        finally:
            self._fail_fast = False

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Nothing is held here (``Batched`` holds the queue); the log exporter's interface asks for it."""
        return True


def weight(item: Any) -> int:
    """About the bytes a queued span or log record holds: its attributes' (and its span events') keys and values,
    its body, and 256 for the rest. Public attributes only (``ReadableSpan``, ``LogData.log_record``)."""
    record = getattr(item, "log_record", item)
    groups = [getattr(record, "attributes", None) or {}]
    groups += [event.attributes or {} for event in getattr(record, "events", None) or ()]
    held = sum(len(key) + len(str(value)) for group in groups for key, value in group.items())
    return 256 + held + len(str(getattr(record, "body", None) or ""))


class CountingExporter(Counting, SpanExporter):
    """``Counting`` for spans."""


class Batched(SpanExporter):
    """OpenTelemetry's exporters behind the batching processor (``infra/batching.py``), for spans and log records
    alike: the SDK's ``SimpleSpanProcessor`` and ``SimpleLogRecordProcessor`` hand each ended span or record to
    ``export`` on the poll thread, which only queues it; the processor's worker exports the batches.

    Not the SDK's ``BatchSpanProcessor`` and ``BatchLogRecordProcessor``: their threads wake every schedule delay
    whether anything is queued or not (docs/performance.md has their cost), where this worker sleeps until something
    is queued. The figure it guards is ``make bench``'s CPU per second at 1 Hz with every sink on, against the Go
    peer. As the SDK's processors do, it lets a batch gather for the schedule delay, drops the oldest queued past the
    queue's bound (``dropped`` counts them; one warning per run of drops) and drops a batch its exporter fails (the
    exporter counts those).
    """

    def __init__(self, inner: Any, name: str, batching: SpanBatching,
                 dropped: Callable[[int], None] = lambda count: None) -> None:
        self._inner, self._name, self._dropped, self._dropping = inner, name, dropped, False
        self._bound = batching.max_queue_size
        slot = MAX_QUEUE_BYTES // batching.max_queue_size  # what an item weighs at least: the count bound holds too
        self._processor: BatchProcessor[Any] = BatchProcessor(
            MemoryQueue(MAX_QUEUE_BYTES, lambda item: max(slot, weight(item)), self._drop), _Delivery(name, self),
            classify=lambda error: "export", on_error=lambda reason: None, batch_size=batching.max_export_batch_size,
            linger=batching.schedule_delay_millis / 1000)

    def export(self, items: Any) -> SpanExportResult:
        for item in items:
            self._processor.emit(item)
        return SpanExportResult.SUCCESS

    def deliver(self, batch: Sequence[Any]) -> None:
        """On the worker: the exporter's own failures are counted and said by it (``Counting*Exporter``)."""
        self._dropping = False  # a run of drops ends when an export makes room
        self._inner.export(list(batch))

    def _drop(self, item: Any) -> None:
        self._dropped(1)
        if not self._dropping:
            log.warning("dropping %s: the queue is full (%d of them, or %d MiB)", self._name, self._bound,
                        MAX_QUEUE_BYTES >> 20)
        self._dropping = True

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._processor.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._processor.shutdown()
        self._inner.shutdown()


class _Delivery(Deliverer[Any]):
    def __init__(self, name: str, batched: Batched) -> None:
        self.name, self._batched = name, batched

    def deliver(self, batch: Sequence[Any]) -> int:
        self._batched.deliver(batch)
        return len(batch)


class TracingSink(Sink):
    """Builds the provider and the span sink at the first document, then delegates to it."""

    name = "spans"

    def __init__(self, settings: Settings, state_dir: Path | None, registry: CollectorRegistry) -> None:
        self._settings = settings
        self._state_dir = state_dir
        self._sink: SpanSink | None = None
        exported = Counter(f"{NAMESPACE}_spans_exported", "Spans accepted by the trace exporter.", registry=registry)
        failed = Counter(f"{NAMESPACE}_span_export_errors", "Spans the trace exporter failed to deliver.",
                         registry=registry)
        self._spans_dropped = Counter(
            f"{NAMESPACE}_spans_dropped", "Spans dropped before export because the span queue was full "
            f"({settings.otel_batch.max_queue_size:,} spans, or {MAX_QUEUE_BYTES >> 20} MiB).", registry=registry)
        # Built at start-up, so a bad exporter setting fails there and not at the first event.
        self._exporter = CountingExporter(make_exporter(settings), exported, failed,
                                          where=settings.otel_traces_endpoint or settings.otel_endpoint)
        self._batched = Batched(self._exporter, "spans", settings.otel_batch, self._spans_dropped.inc)

    def on_change(self, change: DocumentChange) -> None:
        if self._sink is None:
            self._sink = self._build(change.identity)
        self._sink.on_change(change)

    def on_pause(self, felt: PauseFelt) -> None:
        if self._sink is None:
            self._sink = self._build(felt.identity)
        self._sink.on_pause(felt)

    def _build(self, identity: VmIdentity | None) -> SpanSink:
        ids = EventIdGenerator()
        provider = TracerProvider(resource=Resource.create(resource_attributes(self._settings, identity)),
                                  id_generator=ids)
        # Queued for the batching processor at once (OTEL_BSP_* as settings.SpanBatching resolved them: a
        # half-second schedule unless set, so an update span reaches the backend within about half a second).
        provider.add_span_processor(SimpleSpanProcessor(self._batched))
        log.info("exporting spans with %s (%s)", self._settings.otel_traces_exporter,
                 self._settings.otel_protocol if self._settings.otel_traces_exporter == "otlp" else "stdout")
        return SpanSink(provider, ids, self._state_dir)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Called when stopping (``FanOut.shutdown``): bounded by one export's timeout (``failing_fast``)."""
        with self._exporter.failing_fast():
            return self._batched.force_flush(min(timeout_millis, 3000))

    def shutdown(self) -> None:
        with self._exporter.failing_fast():
            if self._sink is not None:
                self._sink.shutdown()  # the provider's processor shuts the batching processor down
            else:
                self._batched.shutdown()


def make_tracing(settings: Settings, state_dir: Path | None, registry: CollectorRegistry) -> TracingSink:
    """Called only when tracing is on: importing this module is what loads the SDK."""
    return TracingSink(settings, state_dir, registry)
