"""The sidecar assembled from one Settings: started, serving, stopped; and storage problems named by their flag."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from se_exporter.cli import SimulatedImds
from se_exporter.core.errors import ForwardFileError
from se_exporter.infra.options import Listen
from se_exporter.sidecar.assembly import Sidecar
from se_exporter.sidecar.settings import Settings
from tests.support.helpers import http_get, parse_samples, value, wait_until

CONN = "Endpoint=sb://127.0.0.1:9/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0;EntityPath=hub"


def test_the_sidecar_serves_what_it_polled_and_closes_its_port_when_stopped(tmp_path: Path) -> None:
    """Built from one Settings (here with the built-in simulator): /readyz turns 200 once a document was read,
    /metrics shows it, and after the with-block the HTTP port is closed and the state directory released."""
    settings = Settings(simulate="demo", listen=Listen("127.0.0.1", 0), state_dir=tmp_path / "state",
                        poll_interval=0.05)
    stop = threading.Event()
    with Sidecar(settings, simulate=SimulatedImds) as sidecar:
        sidecar.listen()
        assert sidecar.simulated is not None and sidecar.settings.imds_url.startswith("http://127.0.0.1:")
        sidecar.start(stop)
        base = sidecar.metrics_url.removesuffix("/metrics")
        wait_until(lambda: http_get(base + "/readyz")[0] == 200, what="the first document")
        status, text = http_get(sidecar.metrics_url)
        assert status == 200
        assert value(parse_samples(text), "azure_scheduled_events_up") == 1.0
        port = int(base.rsplit(":", 1)[1])
        stop.set()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    stopped = threading.Event()
    stopped.set()  # the threads end at once: only the claim of the state directory is of interest here
    with Sidecar(Settings(imds_url="http://127.0.0.1:9", listen=Listen("127.0.0.1", 0),
                          state_dir=tmp_path / "state")) as again:
        again.listen()
        again.start(stopped)  # the state directory is free again: no "already used" error


def test_a_forward_file_that_cannot_be_opened_is_an_error_of_that_path(tmp_path: Path) -> None:
    """The forwarding layer raises its own error, carrying the path and no flag name."""
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    settings = Settings(imds_url="http://127.0.0.1:9", listen=Listen("127.0.0.1", 0), state_dir=tmp_path / "state",
                        forward_file=blocker / "documents.jsonl")
    with Sidecar(settings) as sidecar, pytest.raises(ForwardFileError) as raised:
        sidecar.listen()
        sidecar.start(threading.Event())
    assert raised.value.path == blocker / "documents.jsonl"
    assert "--forward-file" not in str(raised.value)


def test_a_forward_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO put in place after the start-up check (which refuses one) is refused when opened, not waited on for a
    reader for ever (start-up hung, /healthz 503, nothing logged)."""
    fifo = tmp_path / "documents.jsonl"
    os.mkfifo(fifo)
    settings = Settings(imds_url="http://127.0.0.1:9", listen=Listen("127.0.0.1", 0), state_dir=tmp_path / "state",
                        forward_file=fifo)
    with Sidecar(settings) as sidecar, pytest.raises(ForwardFileError) as raised:
        sidecar.listen()
        sidecar.start(threading.Event())
    assert raised.value.path == fifo and "not a regular file" in str(raised.value)


@pytest.mark.parametrize(("flag", "args", "reason"), [
    ("--forward-file", ["--forward-file", "{blocker}/documents.jsonl"], "cannot open it for appending"),
    ("--state-dir", ["--state-dir", "{blocker}/state"], "cannot write there"),
    ("--spool-dir", ["--eventhub-connection-string", CONN, "--spool-dir", "{blocker}/spool"], "cannot write there"),
])
def test_storage_errors_stop_start_up_with_one_line_naming_the_flag(tmp_path: Path, flag: str, args: list[str],
                                                                      reason: str) -> None:
    """A forward file, state or spool directory that cannot be used ends start-up with exit 2 and one line that
    names the flag and the path, as every configuration error does."""
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    argv = [arg.format(blocker=blocker) for arg in args]
    if "--state-dir" not in argv:
        argv += ["--state-dir", str(tmp_path / "state")]
    done = subprocess.run([sys.executable, "-m", "se_exporter", "run", "--listen", "127.0.0.1:0",
                           "--imds-url", "http://127.0.0.1:9", *argv],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("SE_EXPORTER_", "OTEL_"))})
    assert done.returncode == 2, done.stderr
    path = next(arg for arg in argv if arg.startswith(str(blocker)))
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"se-exporter: error: {flag} {path}: {reason} ("), done.stderr


def test_bounds_raised_to_their_floor_are_logged_once_at_start_up(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """--max-backoff below --poll-interval starts (with the poll interval as the cap) and says so in one warning."""
    settings = Settings(imds_url="http://127.0.0.1:9", listen=Listen("127.0.0.1", 0), state_dir=tmp_path / "state",
                        poll_interval=10, max_backoff=1)
    stopped = threading.Event()
    stopped.set()
    with caplog.at_level(logging.WARNING), Sidecar(settings) as sidecar:
        sidecar.listen()
        sidecar.start(stopped)
    said = [r.getMessage() for r in caplog.records if "--max-backoff" in r.getMessage()]
    assert said == ["--max-backoff 1 is shorter than --poll-interval 10: using 10"]
