"""`make demo-fleet` as a person runs it: both streams of a small fleet on one machine, stopped with Ctrl-C."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from se_exporter.fleet.platform.reader import read_platform
from tests.support.child_logs import attach
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parent.parent.parent
COVERAGE = re.compile(r"^\d\d:\d\d:\d\d coverage (\w+) +([0-9A-F-]{36}) (\w+) +(\d+) VM\(s\)$", re.MULTILINE)


def run_demo(out: Path, screen: Path, until: str) -> str:
    """`make demo-fleet` at 10x into ``out`` until the screen matches ``until``, then Ctrl-C; the screen."""
    make = shutil.which("make")
    assert make, "make is needed (Debian's make package)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SE_EXPORTER_", "OTEL_"))}
    with screen.open("wb") as stdout:
        child = subprocess.Popen([make, "--no-print-directory", "demo-fleet", f"DEMO_FLEET_DIR={out}", "SPEED=10",
                                  "FLEET_PORT=0", f"PYTHON={sys.executable}"], stdout=stdout,
                                 stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, env=env)
        attach(f"make demo-fleet (pid {child.pid})", screen, lambda: child.poll() is None)
        try:
            wait_until(lambda: re.search(until, screen.read_text(), re.MULTILINE), timeout=120, what=until)
        finally:
            os.killpg(child.pid, signal.SIGINT)
            child.wait(timeout=60)
    return screen.read_text()


def test_make_demo_fleet_runs_both_streams_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """The banner says what runs where; the simulator's platform copy goes to the file as messages the fleet's
    reader takes; three sidecars forward to their hub; Ctrl-C stops every program and ends with a summary."""
    out = tmp_path / "demo-fleet"
    screen = run_demo(out, tmp_path / "screen.txt", r"^  Lines follow")
    platform_lines = (out / "platform.jsonl").read_bytes().splitlines()
    lines = screen.splitlines()
    assert lines[0].startswith("se-exporter demo-fleet: three sidecars and Azure's own copy of their events")
    for label in ("Simulated IMDS", "Sidecar web_0", "Sidecar web_1", "Sidecar web_2", "Platform copy", "Fleet"):
        assert any(line.startswith(f"  {label} ") for line in lines), label
    assert "se-exporter demo-fleet summary" in screen and "make: ***" not in screen
    assert all(read_platform(line, 1 << 20, 0.0) is not None for line in platform_lines)
    for log in ("simulator", "web_0", "web_1", "web_2", "fleet"):
        text = (out / f"{log}.log").read_text()
        assert "Traceback" not in text and "SharedAccessKey=" not in text, log


def test_make_demo_fleet_shows_every_coverage_state(tmp_path: Path) -> None:
    """Within one cycle the fleet shows the Freeze observed by its two VMs, the Reboot web_2's sidecar is blind to
    as missed, and the Redeploy of web_3 (which runs no sidecar) as no_sidecar."""
    wanted = {("Freeze", "observed", "2"), ("Reboot", "missed", "1"), ("Redeploy", "no_sidecar", "1")}
    every = "".join(rf"(?=.*coverage {kind} +\S+ {state} +{count} VM)" for kind, state, count in sorted(wanted))
    screen = run_demo(tmp_path / "demo-fleet", tmp_path / "screen.txt", rf"(?s)\A{every}")
    assert wanted <= {(kind, state, count) for kind, _, state, count in COVERAGE.findall(screen)}
