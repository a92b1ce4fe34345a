"""Settings: flag over environment over default, and one clear line for every bad value."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from se_exporter.cli import build_parser, main
from se_exporter.config import (
    DEFAULT_IMDS_URL,
    RUN_OPTIONS,
    Bounded,
    Listen,
    Settings,
    parse_bytes,
    parse_endpoint,
    parse_listen,
    run_settings,
)
from tests.conftest import Reliability


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return run_settings(build_parser().parse_args(["run", *argv]), env or {})


def test_defaults() -> None:
    """Without flags or environment, the documented defaults apply."""
    s = settings([])
    assert (s.imds_url, s.api_version, s.poll_interval, s.first_call_timeout) == (
        DEFAULT_IMDS_URL, "2020-07-01", 1.0, 120.0)
    assert DEFAULT_IMDS_URL == "http://169.254.169.254"  # the documented address; never contacted by tests
    assert s.listen == Listen("", 10169)


def test_flag_beats_environment_beats_default() -> None:
    """A flag wins over SE_EXPORTER_*, which wins over the default."""
    env = {"SE_EXPORTER_POLL_INTERVAL": "0.5", "SE_EXPORTER_VM_NAME": "from-env",
           "SE_EXPORTER_API_VERSION": "2019-08-01"}
    s = settings(["--poll-interval", "2", "--max-backoff", "10"], env)
    assert (s.poll_interval, s.vm_name, s.api_version) == (2.0, "from-env", "2019-08-01")


def test_every_option_has_an_environment_variable(capsys: pytest.CaptureFixture[str]) -> None:
    """Each flag maps to SE_EXPORTER_<FLAG> and the mapping is shown in `run --help`."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["run", "--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    for option in RUN_OPTIONS:
        if option.flag.startswith("--otel-"):
            assert option.env.startswith("OTEL_")  # the OpenTelemetry standard variable, not our own
        else:
            assert option.env == "SE_EXPORTER_" + option.flag[2:].upper().replace("-", "_")
        assert option.env in help_text.replace("\n", "").replace(" ", "")


BAD_CONFIGURATION = [
    (["--poll-interval", "abc"], {}, "--poll-interval: 'abc' is not a number of seconds"),
    (["--poll-interval", "0"], {}, "--poll-interval: '0' must be a positive"),
    ([], {"SE_EXPORTER_POLL_INTERVAL": "-1"}, "SE_EXPORTER_POLL_INTERVAL: '-1' must be a positive"),
    (["--imds-url", "imds.example"], {}, "--imds-url: 'imds.example' is not an http(s) URL"),
    (["--imds-url", "ftp://x"], {}, "--imds-url"),
    (["--imds-url", "http://x/?a=1"], {}, "without query"),
    (["--api-version", "latest"], {}, "--api-version: 'latest' is not an api-version"),
    (["--listen", "10169"], {}, "--listen: '10169' is not HOST:PORT"),
    (["--listen", ":99999"], {}, "above 65535"),
    (["--log-format", "xml"], {}, "--log-format: 'xml' is not one of text, json"),
    (["--log-level", "loud"], {}, "--log-level"),
    (["--max-document-bytes", "12"], {}, "--max-document-bytes: '12' is out of range: 1KiB to 64MiB"),
    (["--vm-name", " "], {}, "--vm-name: must not be empty"),
    (["--speed", "0"], {}, "--speed"),
    (["--poll-interval", "1e-9"], {}, "--poll-interval: '1e-9' is out of range: 0.05 to 3600 seconds"),
    (["--first-call-timeout", "1e308"], {}, "--first-call-timeout: '1e308' is out of range"),
    (["--imds-timeout", "nan"], {}, "--imds-timeout: 'nan' must be a positive number"),
    (["--max-backoff", "inf"], {}, "--max-backoff: 'inf' is out of range"),
    (["--max-document-bytes", "1TiB"], {}, "--max-document-bytes: '1TiB' is out of range: 1KiB to 64MiB"),
    ([], {"SE_EXPORTER_SPOOL_MAX_BYTES": "999999999999999TiB"}, "SE_EXPORTER_SPOOL_MAX_BYTES: '999999999999999TiB' is"),
    (["--speed", "1e300"], {}, "--speed: '1e300' is out of range"),
    (["--eventhub-send-timeout", "0.001"], {}, "--eventhub-send-timeout: '0.001' is out of range"),
    (["--simulate", "no-such-scenario"], {}, "scenario 'no-such-scenario' is neither a built-in"),
    (["--eventhub-endpoint", "https://gw.internal/eh"], {}, "--eventhub-endpoint: 'https://gw.internal/eh' is not an"),
    (["--eventhub-ca-file", "/no/such/ca.pem"], {}, "--eventhub-ca-file: '/no/such/ca.pem' is not a readable file"),
    (["--eventhub-endpoint", "sb://10.1.2.3"], {}, "--eventhub-endpoint needs --eventhub-namespace or"),
]


@pytest.mark.parametrize(("argv", "env", "fragment"), BAD_CONFIGURATION)
def test_bad_configuration_is_one_line_and_exit_2(argv: list[str], env: dict[str, str], fragment: str,
                                                  capsys: pytest.CaptureFixture[str], reliability: Reliability) -> None:
    """Bad values stop start-up with exit 2 and a single stderr line naming the setting."""
    assert main(["run", *argv], env=env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("se-exporter: error: ")
    assert fragment in err
    reliability("Configuration", f"{len(BAD_CONFIGURATION)} kinds of bad flag or environment value",
                "exit 2 with one line naming the setting")


def test_unknown_flag_is_one_line_and_exit_2() -> None:
    """argparse's own errors are one line too (no usage dump)."""
    result = subprocess.run([sys.executable, "-m", "se_exporter", "run", "--poll-intervall", "1"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "--poll-intervall" in result.stderr


def test_listen_address_taken_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """If the metrics port is taken, start-up says so in one line instead of a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["run", "--imds-url", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}",
                     "--state-dir", str(tmp_path)], env={})
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"se-exporter: error: --listen 127.0.0.1:{port}: cannot listen there")


def test_otel_settings_follow_the_specification() -> None:
    """OTLP on when an endpoint is set, none otherwise; signal-specific variables win; flags win over both."""
    assert settings([]).otel_traces_exporter == "none"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "maint"}
    s = settings([], env)
    assert (s.otel_traces_exporter, s.otel_protocol, s.otel_service_name) == ("otlp", "grpc", "maint")
    traces_only = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}
    assert settings([], traces_only).otel_traces_exporter == "otlp"
    assert settings(["--otel-traces-exporter", "console"], env).otel_traces_exporter == "console"
    assert settings(["--otel-protocol", "http/protobuf"], env).otel_protocol == "http/protobuf"
    assert main(["run", "--otel-traces-exporter", "zipkin"], env={}) == 2


def test_derived_bounds_instead_of_refusals() -> None:
    """--poll-interval 10 alone works: the backoff cap and first-call timeout follow the larger value."""
    s = settings(["--poll-interval", "10", "--imds-timeout", "200"])
    assert (s.backoff_cap, s.first_timeout) == (10.0, 200.0)
    assert settings([]).backoff_cap == 5.0 and settings([]).first_timeout == 120.0


@pytest.mark.parametrize(("text", "expected"), [
    (":10169", Listen("", 10169)),
    ("0.0.0.0:80", Listen("0.0.0.0", 80)),  # noqa: S104 - parsing, not binding
    ("127.0.0.1:0", Listen("127.0.0.1", 0)),
    ("[::1]:9000", Listen("::1", 9000)),
    ("localhost:9000", Listen("localhost", 9000)),
])
def test_parse_listen(text: str, expected: Listen) -> None:
    """HOST:PORT, :PORT (all interfaces) and [IPv6]:PORT are understood."""
    assert parse_listen(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("sb://10.1.2.3", "sb://10.1.2.3"),
    ("10.1.2.3:5671", "sb://10.1.2.3:5671"),
    ("amqps://eh-gw.internal:5671/", "sb://eh-gw.internal:5671"),
])
def test_parse_endpoint(text: str, expected: str) -> None:
    """A custom endpoint is normalised to the sb://HOST[:PORT] form the SDK takes."""
    assert parse_endpoint(text) == expected


def test_parse_bytes() -> None:
    """Sizes accept plain bytes and binary units."""
    assert parse_bytes("4096") == 4096
    assert parse_bytes("4MiB") == 4 * 1024 * 1024
    assert parse_bytes("2k") == 2048


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--max-events", "0.5"], "--max-events: '0.5' is out of range: 1 to 1e+12"),
    (["--max-events", "2.5"], "--max-events: '2.5' is not a whole number"),
    (["--idle-timeout", "1e400"], "--idle-timeout: '1e400' is out of range"),
])
def test_consume_numbers_are_bounded(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    """consume's counts and times are checked like run's: one line, exit 2."""
    assert main(["consume", "--eventhub-connection-string",
                 "Endpoint=sb://ns.example/;SharedAccessKeyName=k;SharedAccessKey=s;EntityPath=h", *argv], env={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_help_explains_every_run_option() -> None:
    """--help of run lists every option with its help text, and every numeric one with its range."""
    result = subprocess.run([sys.executable, "-m", "se_exporter", "run", "--help"], capture_output=True,
                            text=True, timeout=30, check=True)
    flat = " ".join(result.stdout.split())
    for option in RUN_OPTIONS:
        assert option.flag in result.stdout
        if isinstance(option.parse, Bounded):
            assert f"[range {option.parse.describe()}]" in flat, option.flag
    assert "[range 0.05 to 3600 seconds]" in flat
    assert "--simulate" in result.stdout
