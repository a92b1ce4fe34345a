"""Durations: one parser (``options.parse_duration``) for every duration flag and variable of every program, which
takes the units Prometheus and Go write (500ms, 30s, 5m, 1h30m) and keeps plain numbers as seconds."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pytest

from se_exporter.cli import build_parser, main
from se_exporter.consume.settings import CONSUME_OPTIONS
from se_exporter.fleet.settings import FLEET_OPTIONS, fleet_settings
from se_exporter.infra.options import Bounded, Option, parse_duration, resolve, show_duration
from se_exporter.sidecar.settings import RUN_OPTIONS, parse_heartbeat, parse_scrape_hold, run_settings
from se_exporter.simulator.faults import parse_fault
from se_exporter.simulator.settings import SIMULATE_OPTIONS

PROGRAMS: dict[str, Sequence[Option]] = {"run": RUN_OPTIONS, "fleet": FLEET_OPTIONS, "consume": CONSUME_OPTIONS,
                                         "simulate": SIMULATE_OPTIONS}
DURATION_OPTIONS = [(program, option) for program, options in PROGRAMS.items() for option in options
                    if option.metavar == "DURATION"]


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("1.5", 1.5), (" 2 ", 2.0), ("1e3", 1000.0),  # plain numbers: seconds, as before
    ("500ms", 0.5), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("2d", 172800.0),
    ("1m30s", 90.0), ("1h30m", 5400.0), ("1d2h3m4s5ms", 93784.005), ("1.5h", 5400.0), (".5s", 0.5), ("0s", 0.0),
])
def test_a_duration_reads_as_seconds(text: str, seconds: float) -> None:
    """Each unit, combinations largest first, fractions, and plain numbers as seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "said"), [
    ("5x", "'5x' is not a duration (e.g. 30s, 5m, 1.5)"),
    ("5M", "'5M' is not a duration"),  # months or minutes: refused, as Prometheus and Go do
    ("5 m", "'5 m' is not a duration"),
    ("m", "'m' is not a duration"),
    ("1.s", "'1.s' is not a duration"),
    ("1_0s", "'1_0s' is not a duration"),
    ("\u0665m", "'\u0665m' is not a duration"),  # an Arabic-Indic 5
    ("", "'' is not a duration"),
    ("30m1h", "'30m1h' is not a duration: give each unit once, largest first (e.g. 1h30m"),
    ("1m1m", "'1m1m' is not a duration: give each unit once, largest first"),
])
def test_what_is_not_a_duration_is_said_with_an_example(text: str, said: str) -> None:
    with pytest.raises(ValueError, match="^" + said.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_duration(text)


@pytest.mark.parametrize("seconds", [0.05, 0.1, 0.5, 1, 1.5, 2, 90, 300, 3600, 5400, 21600, 86400, 2592000,
                                     31622400, 93784])
def test_a_shown_duration_reads_back_as_the_same_seconds(seconds: float) -> None:
    """``show_duration`` (ranges and defaults in --help and docs/reference.md) writes what the parser reads."""
    assert parse_duration(show_duration(seconds)) == pytest.approx(seconds)
    assert show_duration(seconds) == {0.05: "50ms", 90: "1m30s", 3600: "1h", 2592000: "30d"}.get(
        seconds, show_duration(seconds))


def test_every_duration_setting_of_every_program_reads_durations() -> None:
    """The options whose metavar says DURATION are read by the one duration parser, and none says SECONDS any more:
    a duration setting cannot be added that reads plain seconds only."""
    assert {program for program, _ in DURATION_OPTIONS} == {"run", "fleet", "consume"}
    assert len(DURATION_OPTIONS) == 16  # run 8, fleet 7, consume 1
    for _, option in DURATION_OPTIONS:
        parse = option.parse
        assert (isinstance(parse, Bounded) and parse.unit == "seconds") or parse in (
            parse_heartbeat, parse_scrape_hold), option.flag
    for options in PROGRAMS.values():
        for option in options:
            assert option.metavar != "SECONDS", option.flag
            if isinstance(option.parse, Bounded) and option.parse.unit == "seconds":
                assert option.metavar == "DURATION", option.flag


@pytest.mark.parametrize(("program", "option"), DURATION_OPTIONS, ids=[o.flag for _, o in DURATION_OPTIONS])
def test_every_duration_flag_and_variable_takes_units(program: str, option: Option) -> None:
    """Each duration setting, as its flag and as its variable: 1m30s is 90 seconds, as 90 is."""
    empty = argparse.Namespace()
    for text in ("1m30s", "90"):
        flag = argparse.Namespace(**{option.dest: text})
        assert resolve([option], flag, {})[option.dest] == 90.0
        assert resolve([option], empty, {option.env: text})[option.dest] == 90.0


def test_the_heartbeat_in_minutes_and_off(tmp_path: Path) -> None:
    """SE_EXPORTER_HEARTBEAT_INTERVAL=5m (refused before) heartbeats every 300 s; 0s and off turn them off."""
    args = build_parser().parse_args(["run", "--forward-file", str(tmp_path / "documents.jsonl"),
                                      "--state-dir", str(tmp_path / "state")])
    assert run_settings(args, {"SE_EXPORTER_HEARTBEAT_INTERVAL": "5m"}).heartbeat_seconds == 300.0
    assert parse_heartbeat("0s") == parse_heartbeat("off") == parse_heartbeat("0") == 0.0


def test_fleet_and_consume_durations_end_to_end() -> None:
    """A fleet's settings with durations in flags and variables; consume's idle timeout in seconds with a unit."""
    hub = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=a2V5;EntityPath=h"
    args = build_parser().parse_args(["fleet", "--eventhub-connection-string", hub, "--checkpoint-connection-string",
                                      "UseDevelopmentStorage=true", "--vm-expiry", "15m"])
    fleet = fleet_settings(args, {"SE_EXPORTER_LOAD_BALANCING_INTERVAL": "10s", "SE_EXPORTER_OWNERSHIP_EXPIRY": "1m"})
    assert (fleet.vm_expiry, fleet.load_balancing_interval, fleet.ownership_timeout) == (900.0, 10.0, 60.0)
    consume = resolve(CONSUME_OPTIONS, build_parser().parse_args(["consume", "--idle-timeout", "1h"]), {})
    assert consume["idle_timeout"] == 3600.0


def test_a_simulator_faults_seconds_take_units() -> None:
    """``--fault delay,seconds=500ms`` (the simulator's one duration) reads as every duration flag does."""
    assert parse_fault("delay,seconds=500ms").seconds == 0.5
    assert parse_fault("hang,seconds=1m").seconds == 60.0
    assert parse_fault("drip,seconds=0.25").seconds == 0.25


@pytest.mark.parametrize(("argv", "env", "line"), [
    (["run", "--heartbeat-interval", "5x"], {},
     "se-exporter: error: --heartbeat-interval: '5x' is not a duration (e.g. 30s, 5m, 1.5)"),
    (["run"], {"SE_EXPORTER_POLL_INTERVAL": "2h"}, "se-exporter: error: SE_EXPORTER_POLL_INTERVAL: '2h' is out of "
                                                   "range: 50ms to 1h"),
    (["run", "--imds-timeout=-5s"], {}, "se-exporter: error: --imds-timeout: '-5s' must be a positive number "
                                           "(50ms to 5m)"),
    (["consume", "--eventhub-connection-string", "Endpoint=sb://ns.example/;SharedAccessKeyName=k;SharedAccessKey=s;"
      "EntityPath=h", "--idle-timeout", "10 min"], {},
     "se-exporter: error: --idle-timeout: '10 min' is not a duration"),
    (["simulate", "--fault", "delay,seconds=5x"], {}, "se-exporter: error: fault 'delay,seconds=5x': '5x' is not a "
                                                      "duration"),
])
def test_a_bad_duration_stops_start_up_with_one_line(argv: list[str], env: dict[str, str], line: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 and one line naming the setting as written and what a duration looks like."""
    assert main(argv, env=env) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err
