"""The sidecar's endpoints: /metrics (gzip when asked), /healthz, /readyz and /, served by ``http_server``."""

from __future__ import annotations

from typing import Protocol
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, generate_latest

from se_exporter.infra import http_server
from se_exporter.infra.http_server import Handler, HttpRequest, Page, Response


class Status(Protocol):
    """What /healthz and /readyz report (the poller)."""

    @property
    def healthy(self) -> bool: ...

    @property
    def ready(self) -> bool: ...


def routes(registry: CollectorRegistry, status: Status) -> dict[str, Page]:
    """The pages by path (GET and HEAD only: ``http_server.pages``)."""

    def metrics(request: HttpRequest) -> Response:
        # Always the Prometheus text format, as Go's client_golang serves by default: Prometheus asks for
        # OpenMetrics first, and prometheus-client's OpenMetrics writer takes about twice as long as the text one
        # (docs/performance.md) for nothing we use (no exemplars; _created series are off). ``name[]`` selects
        # families, as prometheus-client's own app does.
        names = parse_qs(request.query).get("name[]")
        source = registry.restricted_registry(names) if names else registry
        return http_server.metrics(request, generate_latest(source))

    def index(request: HttpRequest) -> Response:
        return http_server.html_index("se-exporter")

    def healthz(request: HttpRequest) -> Response:
        return http_server.text(status.healthy, "poll loop running", "poll loop stalled")

    def readyz(request: HttpRequest) -> Response:
        return http_server.text(status.ready, "valid document read", "no valid document read yet")

    return {"/metrics": metrics, "/healthz": healthz, "/readyz": readyz, "/": index}


def make_http_app(registry: CollectorRegistry, status: Status) -> Handler:
    """/metrics from the registry, /healthz and /readyz from the poller's state."""
    return http_server.pages(routes(registry, status))
