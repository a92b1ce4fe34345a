"""OTLP export against hostile collectors: each export ends by its deadline and reads a bounded answer."""

from __future__ import annotations

import logging
import resource
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from prometheus_client import CollectorRegistry, Counter
from urllib3.connection import HTTPConnection

from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks.otel_events import make_log_exporter
from se_exporter.sidecar.sinks.otlp_http import BoundedSession
from se_exporter.sidecar.sinks.tracing import (
    EXPORT_TIMEOUT_SECONDS,
    CountingExporter,
    make_exporter,
)
from tests.support.otlp_receiver import (
    drip_body,
    drip_headers,
    flood_declared,
    flood_undeclared,
    hostile_collector,
    hostile_grpc_collector,
)

DEADLINE = 1.0  # seconds: the exporters' timeout in these tests (the sidecar's is EXPORT_TIMEOUT_SECONDS)
SLACK = 2.0  # seconds past the deadline an export may take on a contended machine


def spans() -> list[ReadableSpan]:
    tracer = TracerProvider().get_tracer("test")
    span = tracer.start_span("scheduled_event.update")
    span.end()
    return [span]  # type: ignore[list-item]  # an ended SDK span is a ReadableSpan


def log_record() -> ReadableLogRecord:
    return ReadableLogRecord(LogRecord(body="Reboot started"), Resource.create({}))


def why(caplog: pytest.LogCaptureFixture) -> str:
    """The reason the one warning gives, as the exporter put it."""
    message = next(r.getMessage() for r in caplog.records if "span export failing" in r.getMessage())
    return message.split(": ", 1)[1].rsplit("): spans are dropped", 1)[0]


def counting(inner: Any, where: str | None = None) -> tuple[CountingExporter, CollectorRegistry]:
    registry = CollectorRegistry()
    return CountingExporter(inner, Counter("exported", "", registry=registry),
                            Counter("failed", "", registry=registry), where=where), registry


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("answer", [flood_declared, flood_undeclared, drip_headers, drip_body])
def test_an_otlp_http_export_ends_by_its_deadline_reading_a_bounded_answer(
        answer: Callable[[Callable[[bytes], None]], None], tls: bool, tls_cert: tuple[Path, Path],
        tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext], caplog: pytest.LogCaptureFixture) -> None:
    """A collector answering 200 with an endless body (4 GB declared, or none) or dripping a byte at a time, over
    http or https: the export fails within the deadline, counted as failed, with one warning; the memory read
    stays bounded."""
    with hostile_collector(answer, tls_contexts[0] if tls else None) as endpoint:
        exporter, registry = counting(HttpExporter(endpoint=endpoint, timeout=DEADLINE, session=BoundedSession(),
                                                   certificate_file=str(tls_cert[0]) if tls else None), endpoint)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.monotonic()
        with caplog.at_level(logging.DEBUG):
            results = [exporter.export(spans()) for _ in range(2)]
        took = time.monotonic() - started
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        exporter.shutdown()
    assert results == [SpanExportResult.FAILURE] * 2
    assert took < 2 * (DEADLINE + SLACK)
    assert registry.get_sample_value("failed_total") == 2 and registry.get_sample_value("exported_total") == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"span export failing ({endpoint}: {why(caplog)}): spans are dropped until the endpoint answers"]
    assert ("deadline" if answer.__name__.startswith("drip") else "bytes") in why(caplog)
    assert grown_kib < 16 * 1024  # peak RSS grew by less than 16 MiB


def answer_ok(send: Callable[[bytes], None]) -> None:
    send(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n")


def test_the_otlp_certificate_is_trusted_with_a_ca_bundle_variable_set(
        tls_cert: tuple[Path, Path], tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's CA given to the exporter (OTEL_EXPORTER_OTLP_CERTIFICATE) is the one used even where
    REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE names another bundle: the export is delivered."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ssl.get_default_verify_paths().openssl_cafile)
    monkeypatch.setenv("CURL_CA_BUNDLE", ssl.get_default_verify_paths().openssl_cafile)
    with hostile_collector(answer_ok, tls_contexts[0]) as endpoint:
        exporter, registry = counting(HttpExporter(endpoint=endpoint, timeout=DEADLINE, session=BoundedSession(),
                                                   certificate_file=str(tls_cert[0])))
        result = exporter.export(spans())
        exporter.shutdown()
    assert result == SpanExportResult.SUCCESS
    assert registry.get_sample_value("exported_total") == 1


@pytest.mark.parametrize("make", [make_exporter, make_log_exporter], ids=["spans", "log records"])
def test_the_sidecars_otlp_http_exporters_are_built_bounded(make: Callable[[Settings], Any]) -> None:
    """The span and log record exporters the sidecar builds for OTLP/HTTP end an export with a dripping collector
    by the export deadline."""
    with hostile_collector(drip_body) as endpoint:
        settings = Settings(otel_traces_exporter="otlp", otel_logs_exporter="otlp", otel_endpoint=endpoint)
        exporter = make(settings)
        started = time.monotonic()
        result = exporter.export(spans() if make is make_exporter else [log_record()])
        took = time.monotonic() - started
        exporter.shutdown()
    assert result.name == "FAILURE"
    assert EXPORT_TIMEOUT_SECONDS - 0.5 < took < EXPORT_TIMEOUT_SECONDS + SLACK


@pytest.mark.parametrize(("delay", "message_bytes"), [(30.0, 0), (0.0, 1024 * 1024)])
def test_an_otlp_grpc_export_ends_by_its_deadline_reading_a_bounded_answer(delay: float, message_bytes: int) -> None:
    """A gRPC collector that answers too late, or with a 1 MiB answer: the export fails within the deadline."""
    with hostile_grpc_collector(delay, message_bytes) as endpoint:
        settings = Settings(otel_traces_exporter="otlp", otel_endpoint=endpoint, otel_protocol="grpc")
        exporter, registry = counting(make_exporter(settings))
        started = time.monotonic()
        result = exporter.export(spans())
        took = time.monotonic() - started
        exporter.shutdown()
    assert result == SpanExportResult.FAILURE
    assert took < EXPORT_TIMEOUT_SECONDS + SLACK
    assert registry.get_sample_value("failed_total") == 1


def redirect(send: Callable[[bytes], None]) -> None:
    send(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:9/v1/traces?token=secret\r\n"
         b"Content-Length: 0\r\n\r\n")


def not_modified(send: Callable[[bytes], None]) -> None:
    send(b"HTTP/1.1 304 Not Modified\r\n\r\n")


@pytest.mark.parametrize("answer", [redirect, not_modified])
def test_an_otlp_http_answer_that_is_not_2xx_is_an_export_failure(
        answer: Callable[[Callable[[bytes], None]], None], caplog: pytest.LogCaptureFixture) -> None:
    """A collector answering 3xx (a redirect, never followed): the spans count as failed, not exported, with the
    one warning naming the status and not the Location (which may carry a token)."""
    with hostile_collector(answer) as endpoint:
        exporter, registry = counting(HttpExporter(endpoint=endpoint, timeout=DEADLINE, session=BoundedSession()),
                                      endpoint)
        with caplog.at_level(logging.DEBUG):
            results = [exporter.export(spans()) for _ in range(2)]
        exporter.shutdown()
    assert results == [SpanExportResult.FAILURE] * 2
    assert registry.get_sample_value("failed_total") == 2 and registry.get_sample_value("exported_total") == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"span export failing ({endpoint}: {why(caplog)}): spans are dropped until the endpoint answers"]
    assert answer.__name__ != "redirect" or ("HTTP 307" in why(caplog) and "not followed" in why(caplog))
    assert "secret" not in caplog.text


def test_a_watchdog_that_fires_after_its_request_ended_shuts_nothing() -> None:
    """The pool reuses a connection object for the next request: a deadline timer that woke just as its request
    ended (a loaded machine) and fires after ``cancel`` must leave that connection's new socket alone, else the
    next export's answer is cut and a status line alone reads as delivered."""
    from se_exporter.sidecar.sinks import otlp_http  # noqa: PLC0415 - its private timer, driven by hand

    ours, theirs = socket.socketpair()
    with ours, theirs:
        connection = HTTPConnection("127.0.0.1")
        connection.sock = ours
        watchdog = otlp_http._Watchdog(60.0)
        watchdog.watch(connection)
        watchdog.cancel()
        watchdog._fire()  # what the timer's thread does when it passed its check before the cancel
        theirs.sendall(b"HTTP/1.1 200 OK\r\n")
        ours.settimeout(5)
        assert ours.recv(100) == b"HTTP/1.1 200 OK\r\n"  # not shut: a shut socket reads b""
        assert not watchdog.fired.is_set()
