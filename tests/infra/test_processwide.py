"""main() called in-process (by a program or a test) gives the process back as it found it."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from se_exporter.cli import main
from se_exporter.infra import processwide
from tests.support.helpers import wait_until
from tests.support.process_state import snapshot


def state() -> dict[str, Any]:
    """What the autouse fixture compares, and the warnings filters and open files besides."""
    return {**snapshot(), "warnings filters": list(warnings.filters), "open files": len(os.listdir("/proc/self/fd"))}


def test_restored_puts_back_what_the_body_installed_also_when_it_raises() -> None:
    """Signal handlers, excepthooks, root handlers and levels, logger levels and warnings filters set inside
    restored() are undone when it ends by an exception."""
    before = state()
    added = logging.StreamHandler(sys.stderr)
    with pytest.raises(RuntimeError), processwide.restored():
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        sys.excepthook = lambda *args: None
        threading.excepthook = lambda args: None
        logging.getLogger().handlers[:] = [added]
        logging.getLogger().setLevel(logging.DEBUG)
        logging.getLogger("se_exporter.test_processwide.new").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", message="anything")
        raise RuntimeError("the command failed")
    assert state() == before


def test_start_up_refused_by_main_leaves_nothing_installed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run refused after logging and crash hooks were set up (its port is taken) returns 2 and leaves no handler,
    hook or logger level behind."""
    before = state()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = main(["run", "--imds-url", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{taken.getsockname()[1]}",
                     "--state-dir", str(tmp_path)], env={})
    assert code == 2
    assert "cannot listen there" in capsys.readouterr().err
    assert state() == before


def test_a_sidecar_run_in_process_and_stopped_by_sigterm_leaves_the_process_as_it_was(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sidecar run by main() on its simulator with documents forwarded to a file, stopped by SIGTERM through its
    own handler, returns 0 and leaves signal handlers, hooks, logging, warnings filters and the number of open files
    as they were (its sockets, files and lock closed)."""
    before = state()
    returned = threading.Event()
    stopped: list[bool] = []

    def stop_once_its_handler_is_in() -> None:
        ours = before["signal handlers"]["SIGTERM"]
        wait_until(lambda: returned.is_set() or signal.getsignal(signal.SIGTERM) != ours, timeout=60,
                   what="the sidecar's SIGTERM handler")
        if not returned.is_set():
            stopped.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_once_its_handler_is_in, name="stopper")
    stopper.start()
    try:
        code = main(["run", "--simulate", "demo", "--speed", "50", "--listen", "127.0.0.1:0", "--state-dir",
                     str(tmp_path / "state"), "--forward-file", str(tmp_path / "documents.jsonl")], env={})
    finally:
        returned.set()
        stopper.join(timeout=60)
    assert (code, stopped) == (0, [True]), capsys.readouterr()
    wait_until(lambda: not [t for t in threading.enumerate() if t.name in ("poll", "identity")], timeout=10,
               what="the sidecar's threads to end")
    assert state() == before
