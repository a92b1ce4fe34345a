"""Security: never approve, never proxy or redirect, never leak a secret, bind only where told, run unprivileged."""

from __future__ import annotations

import io
import logging
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from se_exporter import cli
from se_exporter.infra import logs, processwide
from tests.conftest import Reliability, SimulatorFactory
from tests.support.eventhubs_server import EventHubsTestServer
from tests.support.helpers import Sidecar, free_port, http_get, wait_until

pytestmark = pytest.mark.integration
KEY = "S3cr3tK3yThatMustNeverShow/x+Q="
TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzZS1leHBvcnRlciJ9.c2lnbmF0dXJl"  # noqa: S105 - a fake token to hunt for
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")


def _connection_string(hub: EventHubsTestServer) -> str:
    return hub.connection_string().replace("SharedAccessKey=c2VjcmV0a2V5", f"SharedAccessKey={KEY}")


def test_secrets_never_show(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                            hubs: Callable[..., EventHubsTestServer], tmp_path: Path, reliability: Reliability) -> None:
    """The SharedAccessKey is absent from debug logs (text and JSON), metrics, spans, --help and error messages."""
    sim, server = simulator("host-failure")
    hub = hubs()
    env = {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": _connection_string(hub)}
    outputs = []
    for log_format in ("text", "json"):
        process = sidecar("--imds-url", server.url, *FAST, "--log-level", "debug", "--log-format", log_format,
                          "--otel-traces-exporter", "console", "--state-dir", str(tmp_path / log_format), env=env)
        sim.advance(3 if log_format == "text" else 400)
        wait_until(lambda p=process: (p.value("azure_scheduled_events_forwarded_documents_total",
                                              sink="eventhubs") or 0) >= 1, timeout=30, what="a document forwarded")
        outputs.append(http_get(process.metrics_url)[1])
        process.stop()
        outputs.append(process.log())
    spans_and_stdout = "".join(outputs)
    help_text = subprocess.run([sys.executable, "-m", "se_exporter", "run", "--help"], capture_output=True,
                               text=True, timeout=60, env={**env, "PATH": "/usr/bin:/bin"}, check=True).stdout
    refused = subprocess.run([sys.executable, "-m", "se_exporter", "run", "--eventhub-connection-string",
                              f"Endpoint=nowhere;SharedAccessKey={KEY}"], capture_output=True, text=True, timeout=60,
                             check=False)
    assert refused.returncode == 2
    for text in (spans_and_stdout, help_text, refused.stderr, refused.stdout):
        assert KEY not in text
        assert KEY.split("/", maxsplit=1)[0] not in text
    reliability("Security", "SharedAccessKey in the environment; debug logs (text and JSON), metrics, console spans, "
                            "--help, a refused configuration",
                "the key appears nowhere")


def test_a_password_in_the_otlp_endpoint_never_shows(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                                      reliability: Reliability) -> None:
    """An OTLP endpoint given as ``http://user:password@host`` (basic auth to a collector): when exports fail, the
    log line naming the endpoint shows the user and host, never the password; nor do the metrics."""
    sim, server = simulator("live-migration")
    password = "Pa55wordThatMustNeverShow"  # noqa: S105 - a fake password to hunt for
    endpoint = f"http://collector:{password}@127.0.0.1:{free_port()}"  # nothing listens there: every export fails
    process = sidecar("--imds-url", server.url, *FAST, env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                                            "OTEL_BSP_SCHEDULE_DELAY": "50"})
    sim.advance(3)  # a Scheduled event: an update span to export
    wait_until(lambda: "span export failing" in process.log(), timeout=30, what="the export failure logged")
    metrics = http_get(process.metrics_url)[1]
    process.stop()
    text = process.log()
    assert "collector:<redacted>@127.0.0.1" in text
    assert password not in text and password not in metrics
    reliability("Security", "an OTLP endpoint holding user:password@ while the collector is down",
                "the failure line names the endpoint with the password redacted; metrics never hold it")


def test_crash_output_is_redacted(reliability: Reliability) -> None:
    """An uncaught exception carrying a key or a token is reported through the redacting formatter."""
    stream = io.StringIO()
    with processwide.restored():  # logs.setup's handler and logger levels end with the test
        logs.setup("info", "text")
        logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
        try:
            raise RuntimeError(f"boom: Endpoint=sb://x/;SharedAccessKey={KEY}; Authorization: Bearer {TOKEN}")
        except RuntimeError as error:
            cli.report_crash(type(error), error, error.__traceback__)
    text = stream.getvalue()
    assert "se-exporter crashed" in text and "Traceback" in text
    assert KEY not in text and TOKEN not in text
    reliability("Security", "a crash whose message carries a key and a bearer token", "both redacted in the report")


def test_listener_binds_exactly_where_configured(simulator: SimulatorFactory,
                                                 sidecar: Callable[..., Sidecar], reliability: Reliability) -> None:
    """Bound to 127.0.0.1, the port is closed on 127.0.0.2 (another loopback address)."""
    _, server = simulator("live-migration")
    process = sidecar("--imds-url", server.url, *FAST)
    port = int(process.base_url.rsplit(":", 1)[1])
    assert http_get(process.base_url + "/healthz")[0] == 200
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.2", port))
    reliability("Security", "--listen 127.0.0.1:PORT, connecting to 127.0.0.2:PORT", "refused: bound only where told")


def test_writes_only_to_the_state_directory(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                            hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                            reliability: Reliability) -> None:
    """With forwarding, spooling and tracing on, nothing is written outside --state-dir: a read-only root works."""
    sim, server = simulator("host-failure")
    hub = hubs()
    elsewhere = {name: tmp_path / name for name in ("cwd", "home", "tmp")}
    for folder in elsewhere.values():
        folder.mkdir()
    process = sidecar("--imds-url", server.url, *FAST, "--state-dir", str(tmp_path / "state"),
                      "--otel-traces-exporter", "console",
                      env={"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": hub.connection_string(),
                           "HOME": str(elsewhere["home"]), "TMPDIR": str(elsewhere["tmp"]),
                           "PYTHONDONTWRITEBYTECODE": "1"}, cwd=elsewhere["cwd"])
    sim.advance(3)
    wait_until(lambda: (process.value("azure_scheduled_events_forwarded_documents_total", sink="eventhubs") or 0)
               >= 1, timeout=30, what="a document forwarded")
    assert process.stop() == 0
    assert {name: sorted(p.name for p in folder.rglob("*")) for name, folder in elsewhere.items()} == {
        "cwd": [], "home": [], "tmp": []}
    assert (tmp_path / "state" / "lifecycle.json").exists()
    reliability("Security", "forwarding, spooling and tracing on; cwd, HOME and TMPDIR watched",
                "nothing written outside --state-dir (a read-only root filesystem works)")
