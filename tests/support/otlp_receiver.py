"""A small OTLP trace and log receiver for the tests: OTLP/HTTP (protobuf) and OTLP/gRPC, on loopback.

Built on opentelemetry-proto; the official exporters deliver to it as to a collector. Beside it, hostile
collectors on loopback: ones that flood an endless answer, drip it a byte at a time, or answer gRPC late or large.
"""

from __future__ import annotations

import contextlib
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    resource: dict[str, Any]
    status_code: int
    transport: str


@dataclass(frozen=True)
class ReceivedLog:
    event_name: str
    trace_id: str
    span_id: str
    time_ns: int
    severity_text: str
    body: Any
    attributes: dict[str, Any]
    resource: dict[str, Any]
    transport: str


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attrs(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.logs: list[ReceivedLog] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/logs":
                    logs = logs_service_pb2.ExportLogsServiceRequest()
                    logs.ParseFromString(body)
                    receiver._take_logs(logs, "http")
                    reply = logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(request, "http")
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True).start()

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                receiver._take(request, "grpc")
                return trace_service_pb2.ExportTraceServiceResponse()

        class LogsService(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                receiver._take_logs(request, "grpc")
                return logs_service_pb2.ExportLogsServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._grpc)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(LogsService(), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def _take(self, request: Any, transport: str) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = _attrs(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(ReceivedSpan(
                        span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        span.start_time_unix_nano, span.end_time_unix_nano, _attrs(span.attributes),
                        [(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in span.events], resource,
                        span.status.code, transport))
        with self._lock:
            self.spans.extend(received)

    def _take_logs(self, request: Any, transport: str) -> None:
        received = []
        for resource_logs in request.resource_logs:
            resource = _attrs(resource_logs.resource.attributes)
            for scope_logs in resource_logs.scope_logs:
                for record in scope_logs.log_records:
                    received.append(ReceivedLog(
                        record.event_name, record.trace_id.hex(), record.span_id.hex(), record.time_unix_nano,
                        record.severity_text, _value(record.body), _attrs(record.attributes), resource, transport))
        with self._lock:
            self.logs.extend(received)

    def events(self, prefix: str = "") -> list[ReceivedLog]:
        """The log records received so far whose event.name starts with ``prefix``, in order of arrival."""
        with self._lock:
            return [record for record in self.logs if record.event_name.startswith(prefix)]

    def named(self, name: str) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if span.name == name]

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._grpc.stop(0)


# ---------------------------------------------------------------- hostile collectors


def flood_declared(send: Callable[[bytes], None]) -> None:
    send(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 4000000000\r\n\r\n")
    while True:
        send(b"\0" * 65536)


def flood_undeclared(send: Callable[[bytes], None]) -> None:
    send(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nConnection: close\r\n\r\n")
    while True:
        send(b"\0" * 65536)


def drip_headers(send: Callable[[bytes], None]) -> None:
    send(b"HTTP/1.1 200 OK\r\n")
    for byte in b"X-Slow: " + b"a" * 10_000:
        send(bytes([byte]))
        time.sleep(0.1)  # the collector's pace, one byte at a time: the behaviour under test


def drip_body(send: Callable[[bytes], None]) -> None:
    send(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(100_000):
        send(b"\0")
        time.sleep(0.1)  # the collector's pace, one byte at a time: the behaviour under test


@contextlib.contextmanager
def hostile_collector(answer: Callable[[Callable[[bytes], None]], None],
                      tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """A loopback collector that reads the request's headers and then answers with ``answer``; the endpoint URL
    (https with ``tls``, the server's context)."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            with contextlib.suppress(OSError):
                answer(self.wfile.write)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:  # the handshake then happens in accept(), before the handler's thread: fine for one client
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def hostile_grpc_collector(delay: float, message_bytes: int) -> Iterator[str]:
    """A loopback OTLP/gRPC collector that answers after ``delay`` seconds with a partial-success message of
    ``message_bytes`` bytes."""
    stop = threading.Event()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            stop.wait(delay)  # the collector's pace: the behaviour under test
            reply = trace_service_pb2.ExportTraceServiceResponse()
            reply.partial_success.error_message = "x" * message_bytes
            return reply

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        server.stop(0)
