"""Sidecar heartbeats: the current document forwarded again when nothing changed for --heartbeat-interval."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client import CollectorRegistry

from se_exporter.cli import SimulatedImds, build_parser
from se_exporter.core.errors import ConfigError
from se_exporter.infra.options import Listen
from se_exporter.sidecar.assembly import Sidecar
from se_exporter.sidecar.forwarding.envelope import Sequencer
from se_exporter.sidecar.forwarding.forward import ForwardMetrics, ForwardSink
from se_exporter.sidecar.forwarding.forward_file import file_line
from se_exporter.sidecar.settings import Settings, run_settings
from se_exporter.simulator.faults import Fault
from tests.conftest import Reliability
from tests.support.fakes.documents import RAW, change
from tests.support.fakes.targets import Collecting
from tests.support.helpers import FORWARDED_SCHEMA as SCHEMA
from tests.support.helpers import wait_until

OTHER = b'{"DocumentIncarnation": 4, "Events": []}'
HUB = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0;EntityPath=hub"


def sink(tmp_path: Path, interval: float | None) -> tuple[ForwardSink, Collecting]:
    target = Collecting()
    return ForwardSink(Sequencer(tmp_path), [target], ForwardMetrics(CollectorRegistry()),
                       heartbeat_interval=interval), target


def test_a_quiet_document_is_forwarded_again_marked_as_a_heartbeat(tmp_path: Path) -> None:
    """Same body and VM, a new sequence, observed now, heartbeat: true; it validates against the schema."""
    forward, target = sink(tmp_path, 0.05)
    try:
        forward.on_change(change(RAW))
        wait_until(lambda: len(target.heartbeats()) >= 2, timeout=5, what="two heartbeats")
    finally:
        forward.shutdown()
    first, beat = target.envelopes[0], target.heartbeats()[0]
    assert "heartbeat" not in first.properties
    assert (beat.body, beat.partition_key) == (first.body, first.partition_key)
    assert beat.sequence > first.sequence and beat.message_id != first.message_id
    assert beat.observed_at > first.observed_at
    assert {k: v for k, v in beat.properties.items() if k not in ("sequence", "observed_at", "heartbeat")} == \
        {k: v for k, v in first.properties.items() if k not in ("sequence", "observed_at")}
    jsonschema.validate(json.loads(file_line(beat)), SCHEMA)
    sequences = [e.sequence for e in target.envelopes]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)


def test_heartbeats_repeat_the_latest_change_and_wait_for_a_first_document(tmp_path: Path) -> None:
    """Nothing is repeated before a valid document; after a change, heartbeats carry the new one."""
    forward, target = sink(tmp_path, 0.05)
    try:
        # The heartbeat thread's own clock: it has ticked, over at least four intervals, with nothing to forward.
        started = forward._forwarded_at
        wait_until(lambda: forward._forwarded_at >= started + 4 * 0.05, timeout=5,
                   what="heartbeat ticks over four intervals")
        assert target.envelopes == []
        forward.on_change(change(RAW))
        forward.on_change(change(OTHER))
        # A heartbeat of RAW may fall between the two changes (the interval is 50 ms): once OTHER is the latest
        # change, every heartbeat carries OTHER.
        wait_until(lambda: len([b for b in target.heartbeats() if b.body == OTHER]) >= 2, timeout=5,
                   what="heartbeats of the latest change")
    finally:
        forward.shutdown()
    bodies = [beat.body for beat in target.heartbeats()]
    assert set(bodies) <= {RAW, OTHER}
    assert set(bodies[bodies.index(OTHER):]) == {OTHER}  # never the older change again


def test_without_an_interval_nothing_is_repeated_and_shutdown_is_prompt(tmp_path: Path) -> None:
    """Off means off: no thread, no heartbeat; with one, shutdown ends the heartbeat thread."""
    forward, target = sink(tmp_path, None)
    forward.on_change(change(RAW))
    forward.shutdown()
    assert len(target.envelopes) == 1
    before = {thread for thread in threading.enumerate() if thread.name == "heartbeat"}
    beating, _ = sink(tmp_path / "b", 3600)
    assert len({thread for thread in threading.enumerate() if thread.name == "heartbeat"} - before) == 1
    beating.shutdown(timeout=5)
    assert {thread for thread in threading.enumerate() if thread.name == "heartbeat"} - before == set()


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, None),  # a file target alone: off
    (["--forward-file", "x.jsonl"], {}, None),
    ([], {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": HUB}, 300.0),  # Event Hubs: on by default
    (["--heartbeat-interval", "0"], {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": HUB}, None),
    (["--heartbeat-interval", "off"], {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": HUB}, None),
    (["--heartbeat-interval", "60", "--forward-file", "x.jsonl"], {}, 60.0),
    (["--forward-file", "x.jsonl"], {"SE_EXPORTER_HEARTBEAT_INTERVAL": "120"}, 120.0),
    (["--heartbeat-interval", "off"], {}, None),  # turning off what is off is no contradiction
])
def test_heartbeat_defaults_off_for_files_and_five_minutes_for_event_hubs(argv: list[str], env: dict[str, str],
                                                                          expected: float | None) -> None:
    """The documented defaults, and 0 or off to turn heartbeats off."""
    settings = run_settings(build_parser().parse_args(["run", *argv]), env)
    assert settings.heartbeat_seconds == expected


def test_a_bad_heartbeat_interval_names_the_setting() -> None:
    """Out of range or not a number: one line naming the flag."""
    for value in ("-1", "0.01", "soon"):
        with pytest.raises(ConfigError, match="--heartbeat-interval"):
            run_settings(build_parser().parse_args(["run", "--heartbeat-interval", value]), {})


def _forwarded(path: Path) -> list[dict[str, Any]]:
    """The forward file's complete lines (a line being written is left for the next look)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _beats(path: Path, failing: bool) -> list[dict[str, Any]]:
    return [line["properties"] for line in _forwarded(path)
            if line["properties"].get("heartbeat") and line["properties"].get("imds_failing") is failing]


def test_heartbeats_during_an_imds_outage_say_so_and_recovery_clears_it(tmp_path: Path,
                                                                       reliability: Reliability) -> None:
    """While IMDS answers 500, heartbeats carry imds_failing true and an imds_last_success that no longer moves;
    once IMDS answers again they carry imds_failing false and a later imds_last_success."""
    forward_file = tmp_path / "documents.jsonl"
    settings = Settings(simulate="degraded-hardware", listen=Listen("127.0.0.1", 0), state_dir=tmp_path / "state",
                        poll_interval=0.05, max_backoff=0.1, forward_file=forward_file, heartbeat_interval=0.2)
    stop = threading.Event()
    with Sidecar(settings, simulate=SimulatedImds) as sidecar:
        sidecar.listen()
        assert isinstance(sidecar.simulated, SimulatedImds)
        sim = sidecar.simulated.simulator
        sidecar.start(stop)
        wait_until(lambda: _beats(forward_file, False), timeout=10, what="a heartbeat while IMDS answers")
        first = _forwarded(forward_file)[0]["properties"]
        assert first["imds_failing"] is False and first["imds_last_success"] == first["observed_at"]
        sim.inject(Fault("status", status=500, count=0))
        failing = wait_until(lambda: _beats(forward_file, True)[2:], timeout=10, what="three failing heartbeats")
        assert len({beat["imds_last_success"] for beat in failing}) == 1  # frozen at the last good read
        assert all(beat["observed_at"] > beat["imds_last_success"] for beat in failing)
        frozen = failing[0]["imds_last_success"]
        seen = len(_beats(forward_file, False))
        sim.clear_faults()
        recovered = wait_until(lambda: _beats(forward_file, False)[seen:], timeout=10,
                               what="a heartbeat after recovery")
        assert recovered[0]["imds_last_success"] > frozen
        stop.set()
    for line in _forwarded(forward_file):
        jsonschema.validate(line, SCHEMA)
    reliability("Forwarding", "IMDS answering 500 while heartbeats run, then answering again",
                "heartbeats carried imds_failing true and an imds_last_success frozen at the last good read; the "
                "first heartbeat after recovery carried imds_failing false and a later imds_last_success")
