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
        # Always the text format, for nothing OpenMetrics adds is used (docs/http.md says why); ``name[]`` selects
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
