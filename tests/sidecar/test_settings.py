"""Settings: flag over environment over default, and one clear line for every bad value."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from se_exporter.cli import build_parser, main
from se_exporter.core.errors import ConfigError
from se_exporter.infra.options import Bounded, Listen, parse_endpoint, parse_listen
from se_exporter.sidecar.settings import DEFAULT_IMDS_URL, DOCUMENT_BYTES, RUN_OPTIONS, Settings, run_settings
from se_exporter.simulator.settings import simulator_settings
from tests.conftest import Reliability


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return run_settings(build_parser().parse_args(["run", *argv]), env or {})


def test_defaults() -> None:
    """Without flags or environment, the documented defaults apply."""
    s = settings([])
    assert (s.imds_url, s.api_version, s.poll_interval, s.first_call_timeout) == (
        DEFAULT_IMDS_URL, "auto", 1.0, 120.0)
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
    (["--poll-interval", "abc"], {}, "--poll-interval: 'abc' is not a duration (e.g. 30s, 5m, 1.5)"),
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
    (["--poll-interval", "1e-9"], {}, "--poll-interval: '1e-9' is out of range: 50ms to 1h"),
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
    (["--imds-url", "http://user:pw@127.0.0.1:9"], {}, "--imds-url: holds a user name or password"),
    (["--otel-endpoint", "tempo"], {}, "--otel-endpoint: 'tempo' is not an http(s) URL with a host, e.g. http://127"),
    ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "tempo"}, "e.g. http://127.0.0.1:4318"),
    (["--eventhub-connection-string", "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=s;EntityPath=h",
      "--eventhub-ca-file", "/dev/null"], {}, "--eventhub-ca-file: '/dev/null' is not a regular file"),
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
    assert (s.effective_max_backoff, s.effective_first_call_timeout) == (10.0, 200.0)
    assert settings([]).effective_max_backoff == 5.0 and settings([]).effective_first_call_timeout == 120.0


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
    assert DOCUMENT_BYTES("4096") == 4096
    assert DOCUMENT_BYTES("4MiB") == 4 * 1024 * 1024
    assert DOCUMENT_BYTES("2k") == 2048


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--max-events", "0.5"], "--max-events: '0.5' is out of range: 1 to 1000000000000"),
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
    assert "[range 50ms to 1h]" in flat
    assert "--simulate" in result.stdout


CONN = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=TOPSECRETKEY="


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--eventhub-connection-string", "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=TOPSECRETKEY="],
     "--eventhub-name is required: the connection string has no EntityPath"),
    (["--eventhub-connection-string", "TOPSECRETKEY="], "has no Endpoint=sb://"),
    (["--eventhub-connection-string", "Endpoint=sb://ns/;SharedAccessKey=TOPSECRETKEY="], "needs SharedAccessKeyName"),
    (["--eventhub-connection-string", CONN + ";EntityPath=h", "--eventhub-namespace", "ns.servicebus.windows.net"],
     "exclude each other"),
    (["--eventhub-name", "a/b"], "--eventhub-name: 'a/b' is not an event hub name"),
    (["--eventhub-namespace", "ns.servicebus.windows.net"], "--eventhub-name is required with --eventhub-namespace"),
    (["--eventhub-namespace", "not a host", "--eventhub-name", "h"], "is not a namespace host name"),
    (["--eventhub-client-id", "abc"], "--eventhub-client-id needs --eventhub-namespace"),
    (["--spool-max-bytes", "tiny"], "--spool-max-bytes"),
    (["--eventhub-connection-string", CONN + ";SharedAccessKey=TOPSECRETKEY2=;EntityPath=h"],
     "gives SharedAccessKey more than once"),
    (["--eventhub-connection-string", CONN + ";EntityPath=h;entitypath=h"], "gives EntityPath more than once"),
    (["--eventhub-connection-string", CONN + ";EntityPath="], "has an empty EntityPath="),
    (["--eventhub-connection-string", CONN + ";EntityPath= "], "has an empty EntityPath="),
    (["--eventhub-connection-string", "Endpoint=sb://[::1/;SharedAccessKeyName=k;SharedAccessKey=TOPSECRETKEY="],
     "has an Endpoint that is not a URL ('sb://[::1/'"),
    (["--eventhub-connection-string", "Endpoint=sb://ns:port/;SharedAccessKeyName=k;SharedAccessKey=TOPSECRETKEY="],
     "has an Endpoint that is not a URL ('sb://ns:port/'"),
    (["--eventhub-connection-string", "Endpoint=sb://ns:70000/;SharedAccessKeyName=k;SharedAccessKey=TOPSECRETKEY="],
     "has an Endpoint that is not a URL"),
    (["--eventhub-connection-string", "Endpoint=sb:///;SharedAccessKeyName=k;SharedAccessKey=TOPSECRETKEY="],
     "has an Endpoint without a host"),
])
def test_bad_forwarding_configuration(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each mistake is one line naming the setting, and never repeats the key."""
    assert main(["run", *argv], env={}) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
    assert "TOPSECRETKEY" not in err


def test_connection_string_is_not_in_the_settings_repr() -> None:
    """A settings object printed in a traceback does not show the key."""
    settings = run_settings(build_parser().parse_args(["run"]), {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING":
                                                                 CONN + ";EntityPath=h"})
    assert settings.eventhubs_enabled
    assert "TOPSECRETKEY" not in repr(settings)


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, None),
    (["--simulate"], {}, "demo"),
    (["--simulate", "host-failure"], {"SE_EXPORTER_SIMULATE": "canceled"}, "host-failure"),
    ([], {"SE_EXPORTER_SIMULATE": "canceled"}, "canceled"),
    ([], {"SE_EXPORTER_SIMULATE": ""}, None),
])
def test_simulate_comes_from_the_option_table(argv: list[str], env: dict[str, str], expected: str | None) -> None:
    """--simulate alone means the demo scenario, the flag wins over SE_EXPORTER_SIMULATE, and an empty variable
    means not set."""
    assert settings(argv, env).simulate == expected


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, ()),
    (["--fault", "throttle", "--fault", "drip,seconds=1"], {"SE_EXPORTER_SIMULATOR_FAULTS": "timeout"},
     ("throttle", "drip,seconds=1")),
    ([], {"SE_EXPORTER_SIMULATOR_FAULTS": "throttle,count=2;;timeout"}, ("throttle,count=2", "timeout")),
    ([], {"SE_EXPORTER_SIMULATOR_FAULTS": ""}, ()),
    ([], {"SE_EXPORTER_SIMULATOR_FAULTS": 'throttle;body,count=2,text={"X":"a;b"};c'},
     ("throttle", 'body,count=2,text={"X":"a;b"};c')),
])
def test_faults_come_from_the_option_table(argv: list[str], env: dict[str, str], expected: tuple[str, ...]) -> None:
    """--fault repeats; SE_EXPORTER_SIMULATOR_FAULTS holds them ';'-separated (empty parts skipped) unless a flag
    gives them; text= takes the rest of the variable, semicolons included (docs/simulator.md: it "takes the rest")."""
    assert simulator_settings(build_parser().parse_args(["simulate", *argv]), env).faults == expected


@pytest.mark.parametrize("url", ["http://user:s3cretpw@127.0.0.1:9", "http://:s3cretpw@127.0.0.1:9/x?q=1",
                                 "https://s3cretpw@[::1"])
def test_a_password_in_the_imds_url_stops_start_up_without_being_repeated(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """IMDS takes no credentials: a user:password@ part is refused with one line that never shows it, even when
    the URL is wrong in other ways too."""
    assert main(["run", "--imds-url", url], env={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--imds-url: holds a user name or password" in err, err
    assert "s3cretpw" not in err


def test_empty_otel_variables_count_as_unset() -> None:
    """The OpenTelemetry specification: an empty OTEL_* value is treated as unset (Helm writes value: "")."""
    env = {name: "" for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL",
                                 "OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                                 "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")}
    assert settings([], env) == settings([])
    assert settings([], {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}).otel_traces_exporter == "otlp"


def test_bounds_given_below_their_floor_are_raised_and_said() -> None:
    """--max-backoff below --poll-interval and --first-call-timeout below --imds-timeout start (a sidecar that
    refuses to start watches nothing) with the larger value, and say so in one sentence each."""
    raised = settings(["--poll-interval", "10", "--max-backoff", "1", "--imds-timeout", "10",
                       "--first-call-timeout", "1"])
    assert (raised.effective_max_backoff, raised.effective_first_call_timeout) == (10, 10)
    assert raised.raised_bounds == ("--max-backoff 1 is shorter than --poll-interval 10: using 10",
                                    "--first-call-timeout 1 is shorter than --imds-timeout 10: using 10")
    assert settings(["--poll-interval", "2", "--max-backoff", "2"]).raised_bounds == ()


def test_ranges_are_written_as_plain_numbers() -> None:
    """A range in an error or --help reads 2592000 (or 30d), not 2.592e+06."""
    assert Bounded(1, 30 * 86400).describe() == "1s to 30d"
    assert Bounded(0.05, 3600).describe() == "50ms to 1h"
    assert Bounded(1, 10**12, unit="").describe() == "1 to 1000000000000"


OVERLAPS = [
    (["--state-dir", "{d}", "--forward-file", "{d}/lifecycle.json"], "--forward-file {d}/lifecycle.json is inside "
     "--state-dir {d}"),
    (["--state-dir", "{d}", "--forward-file", "{d}/deeper/out.jsonl"], "is inside --state-dir {d}"),
    (["--state-dir", "{d}/state", "--spool-dir", "{d}/spool", "--forward-file", "{d}/spool/seg.jsonl", "--hub"],
     "--forward-file {d}/spool/seg.jsonl is inside --spool-dir {d}/spool"),
    (["--state-dir", "{d}", "--forward-file", "{d}/spool/x.jsonl", "--hub"], "is inside --state-dir {d}"),
    (["--state-dir", "{d}", "--spool-dir", "{d}", "--hub"], "--spool-dir {d} and --state-dir {d} overlap"),
    (["--state-dir", "{d}", "--spool-dir", "{d}/queue", "--hub"], "--spool-dir {d}/queue and --state-dir {d} overlap"),
    (["--state-dir", "{d}/spool/state", "--spool-dir", "{d}/spool", "--hub"], "overlap"),
    (["--state-dir", "{d}", "--spool-dir", "{d}/./", "--hub"], "overlap"),
]


@pytest.mark.parametrize(("argv", "fragment"), OVERLAPS)
def test_files_the_sidecar_would_destroy_stop_start_up(argv: list[str], fragment: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       reliability: Reliability) -> None:
    """A forward file inside the state or spool directory (replaced by state saves, deleted at spool rotation) and
    a spool directory overlapping the state directory stop start-up with one line naming both flags."""
    hub = ["--eventhub-connection-string", CONN + ";EntityPath=h"]
    args = [part.format(d=tmp_path) for arg in argv for part in ([arg] if arg != "--hub" else hub)]
    assert main(["run", *args], env={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment.format(d=tmp_path) in err, err
    reliability("Configuration", f"{len(OVERLAPS)} overlaps of --forward-file, --spool-dir and --state-dir",
                "exit 2 with one line naming both flags; nothing written")


def test_the_default_layout_and_separate_places_are_accepted(tmp_path: Path) -> None:
    """STATE_DIR/spool is the spool's default place and stays allowed, given or not; separate places are fine."""
    hub = ["--eventhub-connection-string", CONN + ";EntityPath=h"]
    state = tmp_path / "state"
    assert settings(["--state-dir", str(state), *hub]).spool_path == state / "spool"
    settings(["--state-dir", str(state), "--spool-dir", str(state / "spool"), *hub])
    settings(["--state-dir", str(state), "--spool-dir", str(tmp_path / "q"), "--forward-file",
              str(tmp_path / "out.jsonl"), *hub])
    settings(["--state-dir", str(state), "--forward-file", str(tmp_path / "state-docs.jsonl")])
    with pytest.raises(ConfigError, match="only used with Event Hubs"):  # no spool without Event Hubs: no overlap
        settings(["--state-dir", str(state), "--spool-dir", str(state), "--forward-file", str(tmp_path / "o.jsonl")])


NOT_ASCII_OR_ORPHAN = [
    (["--listen", "127.0.0.1:\uff11\uff18\uff13\uff11\uff10"], {}, "--listen: '127.0.0.1:"),  # full-width digits
    (["--poll-interval", "\u0663"], {}, "--poll-interval: '\u0663' is not a duration"),  # Arabic-Indic 3
    (["--poll-interval", "1_0"], {}, "--poll-interval: '1_0' is not a duration"),
    ([], {"SE_EXPORTER_IMDS_TIMEOUT": "\uff12"}, "SE_EXPORTER_IMDS_TIMEOUT: '\uff12' is not a duration"),
    (["--poll-interval", "5m\u00a0"], {}, "--poll-interval: '5m\\xa0' is not a duration"),
    (["--poll-interval", "1\u00a0"], {}, "--poll-interval"),  # a no-break space is not ASCII blank
    (["--max-document-bytes", "\uff14MiB"], {}, "--max-document-bytes: '\uff14MiB' is not a size"),
    ([], {"SE_EXPORTER_SPOOL_MAX_BYTES": "6_4MiB"}, "SE_EXPORTER_SPOOL_MAX_BYTES: '6_4MiB' is not a size"),
    (["--api-version", "\uff12020-07-01"], {}, "--api-version"),
    (["--eventhub-namespace", "ns.servicebus.windows.net:\u0665671", "--eventhub-name", "h"], {},
     "--eventhub-namespace"),
    (["--eventhub-name", "hub"], {}, "--eventhub-name needs --eventhub-connection-string or --eventhub-namespace"),
    ([], {"SE_EXPORTER_EVENTHUB_NAME": "hub"}, "--eventhub-name needs"),
    (["--spool-dir", "spool"], {}, "--spool-dir is only used with Event Hubs"),
    ([], {"SE_EXPORTER_SPOOL_DIR": "spool"}, "SE_EXPORTER_SPOOL_DIR is only used with Event Hubs"),
    (["--spool-max-bytes", "1MiB"], {}, "--spool-max-bytes is only used with Event Hubs"),
    (["--eventhub-send-timeout", "5"], {}, "--eventhub-send-timeout is only used with Event Hubs"),
    ([], {"SE_EXPORTER_EVENTHUB_RETRY_MAX": "5"}, "SE_EXPORTER_EVENTHUB_RETRY_MAX is only used with Event Hubs"),
    (["--heartbeat-interval", "60"], {}, "--heartbeat-interval needs a forwarding target"),
    ([], {"SE_EXPORTER_HEARTBEAT_INTERVAL": "60"}, "SE_EXPORTER_HEARTBEAT_INTERVAL needs a forwarding target"),
    (["--speed", "10"], {}, "--speed needs --simulate"),
    ([], {"SE_EXPORTER_SPEED": "10"}, "SE_EXPORTER_SPEED needs --simulate"),
    (["--simulate", "--imds-url", "http://127.0.0.1:9"], {}, "--imds-url and --simulate exclude each other"),
    (["--imds-url", "http://127.0.0.1:9"], {"SE_EXPORTER_SIMULATE": "demo"},
     "--imds-url and SE_EXPORTER_SIMULATE exclude each other"),
]


@pytest.mark.parametrize(("argv", "env", "fragment"), NOT_ASCII_OR_ORPHAN)
def test_non_ascii_numbers_and_orphan_or_conflicting_settings_stop_start_up(
        argv: list[str], env: dict[str, str], fragment: str, capsys: pytest.CaptureFixture[str],
        reliability: Reliability) -> None:
    """Numbers take ASCII digits only; a setting that would be ignored, or two that contradict each other, stop
    start-up with exit 2 and one line naming what was written (flag or environment variable) and what to do."""
    assert main(["run", *argv], env=env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("se-exporter: error: ") and fragment in err, err
    reliability("Configuration", f"{len(NOT_ASCII_OR_ORPHAN)} numbers in non-ASCII digits, orphan settings and "
                                 "conflicting ones, as flags and as environment variables",
                "exit 2 with one line naming what was written and what to do")


@pytest.mark.parametrize(("flag", "hub", "fragment"), [
    ("--state-dir", False, "symbolic links there form a loop"),
    ("--forward-file", False, "symbolic links there form a loop"),
    ("--spool-dir", True, "symbolic links there form a loop"),
])
def test_a_symlink_loop_as_a_path_stops_start_up_with_one_line(tmp_path: Path, flag: str, hub: bool, fragment: str,
                                                               capsys: pytest.CaptureFixture[str],
                                                               reliability: Reliability) -> None:
    """A path option that is a loop of symbolic links (a -> b -> a) is one line naming the flag, not a traceback."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    argv = [flag, str(tmp_path / "a")]
    if flag != "--state-dir":
        argv += ["--state-dir", str(tmp_path / "state")]
    if hub:
        argv += ["--eventhub-connection-string", CONN + ";EntityPath=h"]
    assert main(["run", *argv], env={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} {tmp_path / 'a'}: {fragment}" in err, err
    reliability("Configuration", "a loop of symbolic links as --state-dir, --spool-dir or --forward-file",
                "exit 2 with one line naming the flag, not a traceback")


def test_a_dangling_symlink_as_state_dir_says_where_it_points(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A state directory that is a symbolic link to nothing is named as such, not as "File exists"."""
    (tmp_path / "state").symlink_to(tmp_path / "gone")
    assert main(["run", "--state-dir", str(tmp_path / "state")], env={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"is a symbolic link to {tmp_path / 'gone'}, which does not exist" in err and "File exists" not in err


@pytest.mark.parametrize(("flag", "kind"), [("--forward-file", "fifo"), ("--forward-file", "dir"),
                                            ("--forward-file", "/dev/null"), ("--state-dir", "fifo"),
                                            ("--state-dir", "file"), ("--spool-dir", "fifo"),
                                            ("--spool-dir", "/dev/null")])
def test_a_path_of_the_wrong_kind_stops_start_up_with_one_line(flag: str, kind: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A forward file that is a FIFO made start-up wait for a reader for ever, with nothing logged; a device made
    it fail with "cannot open it for appending (None)". A forward file that exists must be a regular file, a state
    or spool directory that exists a directory: else one line naming the flag, what the path is, and the fix."""
    path = tmp_path / "thing"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "file":
        path.write_bytes(b"")
    else:
        path = Path(kind)
    hub = ["--eventhub-connection-string", CONN + ";EntityPath=h"] if flag == "--spool-dir" else []
    state = [] if flag == "--state-dir" else ["--state-dir", str(tmp_path / "state")]
    assert main(["run", *state, *hub, flag, str(path)], env={}) == 2
    err = capsys.readouterr().err
    what = {"fifo": "a FIFO (named pipe)", "dir": "a directory", "file": "a regular file",
            "/dev/null": "a character device"}[kind]
    assert err.count("\n") == 1 and f"{flag} {path} is {what}, not a " in err, err


def test_metric_groups_are_turned_off_by_flag_or_environment(capsys: pytest.CaptureFixture[str]) -> None:
    """--disable-metrics is repeatable and SE_EXPORTER_DISABLE_METRICS comma-separated, each a group of the one
    table (metrics.METRIC_GROUPS); an unknown group stops start-up with one line naming the groups there are."""
    assert settings(["--disable-metrics", "notice", "--disable-metrics", "Process"]).disable_metrics == (
        "notice", "process")
    assert settings([], {"SE_EXPORTER_DISABLE_METRICS": "impact, poll_duration"}).disable_metrics == (
        "impact", "poll_duration")
    assert settings([]).disable_metrics == ()
    assert main(["run", "--disable-metrics", "histograms"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--disable-metrics: 'histograms' is not one of notice, impact" in err


def test_the_hold_of_a_first_count_is_a_duration_or_0() -> None:
    """--max-scrape-interval: 2m unless given, a duration, 0 for no hold; a negative or huge one is refused."""
    assert settings([]).max_scrape_interval == 120.0
    assert settings(["--max-scrape-interval", "5m"]).max_scrape_interval == 300.0
    assert settings([], {"SE_EXPORTER_MAX_SCRAPE_INTERVAL": "0"}).max_scrape_interval == 0.0
    for bad in ("-1s", "2h"):
        with pytest.raises(ConfigError, match="--max-scrape-interval"):
            settings([f"--max-scrape-interval={bad}"])
