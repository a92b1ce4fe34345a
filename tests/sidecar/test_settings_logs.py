"""Settings of the transition log records and the api-version: OTEL_LOGS_EXPORTER and the OTLP logs variables as the
OpenTelemetry specification reads them, --api-version auto, and the AKS environment."""

from __future__ import annotations

import subprocess
import sys

import pytest

from se_exporter.cli import build_parser
from se_exporter.sidecar.settings import Settings, run_settings


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return run_settings(build_parser().parse_args(["run", *argv]), env or {})


def test_logs_follow_the_otlp_endpoint_unless_told_otherwise() -> None:
    """An OTLP endpoint turns log records on (as spans); OTEL_LOGS_EXPORTER=none or console overrides it; without
    an endpoint they are off."""
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert settings([]).otel_logs_exporter == "none"
    assert settings([], endpoint).otel_logs_exporter == "otlp"
    assert settings([], {**endpoint, "OTEL_LOGS_EXPORTER": "none"}).otel_logs_exporter == "none"
    assert settings([], {"OTEL_LOGS_EXPORTER": "console"}).otel_logs_exporter == "console"
    assert settings(["--otel-logs-exporter", "none"], endpoint).otel_logs_exporter == "none"


def test_the_signal_specific_logs_variables_win() -> None:
    """OTEL_EXPORTER_OTLP_LOGS_ENDPOINT alone turns them on and is used as given; _LOGS_PROTOCOL beats the general
    protocol; an empty value counts as unset."""
    s = settings([], {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://logs:4318/v1/logs",
                      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "grpc"})
    assert (s.otel_logs_exporter, s.otel_logs_endpoint, s.otel_logs_protocol, s.otel_protocol) == (
        "otlp", "http://logs:4318/v1/logs", "grpc", "http/protobuf")
    assert settings([], {"OTEL_LOGS_EXPORTER": ""}).otel_logs_exporter == "none"
    assert settings([], {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}).otel_logs_protocol == "grpc"


@pytest.mark.parametrize(("env", "fragment"), [
    ({"OTEL_LOGS_EXPORTER": "zipkin"}, "OTEL_LOGS_EXPORTER"),
    ({"OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "thrift"}, "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"),
    ({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "not a url"}, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"),
])
def test_a_bad_logs_setting_stops_start_up_with_one_line(env: dict[str, str], fragment: str) -> None:
    """The CLI exits 2 with one line naming the variable."""
    result = subprocess.run([sys.executable, "-m", "se_exporter", "run", "--listen", "127.0.0.1:0"],
                            capture_output=True, text=True, env={**env, "PATH": ""}, timeout=30, check=False)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr


def test_api_version_auto_is_the_default_and_a_pinned_one_is_kept() -> None:
    """auto (any case) and a dated version are accepted; auto asks for 2024-07-09 first."""
    assert (settings([]).api_version, settings([]).first_api_version) == ("auto", "2024-07-09")
    assert settings(["--api-version", "AUTO"]).api_version == "auto"
    pinned = settings(["--api-version", "2019-08-01"])
    assert (pinned.api_version, pinned.first_api_version) == ("2019-08-01", "2019-08-01")


def test_aks_is_read_from_the_pod_environment() -> None:
    """KUBERNETES_SERVICE_HOST marks a pod; K8S_NODE_NAME (the downward API) names the node."""
    s = settings([], {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "K8S_NODE_NAME": " aks-a-1 "})
    assert (s.kubernetes, s.k8s_node_name) == (True, "aks-a-1")
    assert (settings([]).kubernetes, settings([]).k8s_node_name) == (False, None)
