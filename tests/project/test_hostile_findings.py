"""Hostile-tester findings, each a reproduction of a gap between the README's promises and the build.

Every test here names the behaviour the README or the project brief promises. Those that the build does not keep
yet are marked ``xfail(strict=True)``: they run, fail today, and turn into an error the day the gap is closed, so
whoever fixes it removes the mark. No test starts a long-running process: settings are parsed in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from se_exporter.cli import build_parser
from se_exporter.core.errors import ConfigError
from se_exporter.fleet.settings import fleet_settings
from se_exporter.sidecar.settings import run_settings
from se_exporter.sidecar.sinks.spans import PREFIX
from se_exporter.sidecar.sinks.tracing import span_line

HUB = "Endpoint=sb://localhost/;SharedAccessKeyName=s;SharedAccessKey=c2VjcmV0;EntityPath=hub"
STORAGE = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=c2VjcmV0;"
           "BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;")


def run(argv: list[str], env: dict[str, str] | None = None) -> object:
    return run_settings(build_parser().parse_args(["run", *argv]), env or {})


def fleet(argv: list[str], env: dict[str, str]) -> object:
    return fleet_settings(build_parser().parse_args(["fleet", *argv]), env)


def test_console_span_line_stays_one_line_whatever_the_event_id() -> None:
    """docs/architecture.md 'Log lines stay lines': an EventId with a newline or an ANSI escape cannot forge a
    console span line."""
    context = SpanContext(trace_id=1, span_id=2, is_remote=False, trace_flags=TraceFlags(1))
    span = ReadableSpan(name="scheduled_event.update", context=context, start_time=1, end_time=2,
                        attributes={PREFIX + "id": "BAD\n2026-01-01T00:00:00.000Z span forged\x1b[31m\u2028",
                                    PREFIX + "type": "Freeze\r", PREFIX + "transition": "scheduled"})
    line = span_line(span)
    assert line.endswith("\n")
    body = line[:-1]
    assert not any(ch in body for ch in "\n\r\x1b\u2028"), repr(line)


def test_imds_url_with_a_password_is_refused_or_dropped() -> None:
    """No secret in logs: a password in --imds-url (never sent: IMDS takes none) is refused or not kept."""
    try:
        settings = run(["--imds-url", "http://user:s3cretpw@127.0.0.1:18169"])
    except ConfigError:
        return
    assert "s3cretpw" not in str(settings)


def test_imds_url_port_out_of_range_is_refused() -> None:
    """Bad configuration stops start-up: a port above 65535 in --imds-url, as it does in --listen (fixed on main
    by the standard-library URL check; kept as a guard)."""
    with pytest.raises(ConfigError):
        run(["--imds-url", "http://127.0.0.1:99999"])


@pytest.mark.parametrize("command", ["run", "fleet"])
def test_eventhub_ca_file_without_a_certificate_is_refused(command: str, tmp_path: Path) -> None:
    """A CA file holding no PEM certificate stops start-up (today: every send fails NO_CERTIFICATE_OR_CRL_FOUND)."""
    empty = tmp_path / "ca.pem"
    empty.write_text("")
    with pytest.raises(ConfigError):
        if command == "run":
            run(["--eventhub-ca-file", str(empty)], {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": HUB})
        else:
            fleet(["--eventhub-ca-file", str(empty)], {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": HUB,
                                                        "SE_EXPORTER_CHECKPOINT_CONNECTION_STRING": STORAGE})


@pytest.mark.parametrize("connection_string", [
    "Endpoint=sb://[::1/;SharedAccessKeyName=s;SharedAccessKey=k;EntityPath=x",
    "Endpoint=sb://localhost:notaport/;SharedAccessKeyName=s;SharedAccessKey=k;EntityPath=x",
    "Endpoint=sb://localhost/;SharedAccessKeyName=s;SharedAccessKey=k;SharedAccessKey=k2;EntityPath=x",
    "Endpoint=sb://localhost/;SharedAccessKeyName=s;SharedAccessKey=k;EntityPath=",
])
def test_malformed_eventhub_connection_string_is_refused(connection_string: str) -> None:
    """Bad configuration stops start-up with one line (today: 'send failed (other): ...' retried forever)."""
    with pytest.raises(ConfigError):
        run([], {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": connection_string})


@pytest.mark.parametrize("storage", [
    "AccountName=a;AccountKey=c2VjcmV0;BlobEndpoint=http://[::1/x",
    "AccountName=a;AccountKey=c2VjcmV0;BlobEndpoint=ftp://127.0.0.1:1/x",
    "AccountName=a;AccountKey=STOR!!notbase64;BlobEndpoint=http://127.0.0.1:1/x",
])
def test_malformed_checkpoint_connection_string_is_refused(storage: str) -> None:
    """Bad configuration stops start-up with one line, never a traceback or a run that can never checkpoint."""
    with pytest.raises(ConfigError):
        fleet([], {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": HUB, "SE_EXPORTER_CHECKPOINT_CONNECTION_STRING": storage})


@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER"])
def test_empty_otel_variable_counts_as_unset(name: str) -> None:
    """OpenTelemetry's environment-variable spec: an empty value is interpreted as if the variable were unset."""
    run([], {name: ""})
