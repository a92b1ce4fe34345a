"""The first five minutes: `make demo` as a person runs it, stdout and stderr on one terminal, stopped with Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.child_logs import attach
from tests.support.helpers import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parent.parent.parent
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z (debug|info|warning|error|critical) ")
SPAN_LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z span (scheduled_event\S*) +(\w+) ([0-9A-F-]{36}) "
                       r".*trace [0-9a-f]{32}$")


def run_demo(demo_dir: Path, screen: Path) -> str:
    """`make demo` at 50x into ``demo_dir``, until three documents were written, then Ctrl-C; the screen."""
    make = shutil.which("make")
    assert make, "make is needed (Debian's make package)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SE_EXPORTER_", "OTEL_"))}
    with screen.open("wb") as out:
        # Its own process group, as a shell gives a foreground job: Ctrl-C reaches make and the sidecar alike.
        child = subprocess.Popen([make, "--no-print-directory", "demo", f"DEMO_DIR={demo_dir}", "SPEED=50", "PORT=0",
                                  f"PYTHON={sys.executable}"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                 start_new_session=True, env=env)
        attach(f"make demo (pid {child.pid})", screen, lambda: child.poll() is None)
        try:
            documents = demo_dir / "documents.jsonl"
            wait_until(lambda: documents.exists() and len(documents.read_text().splitlines()) >= 3
                       and " span " in screen.read_text(), timeout=60, what="three documents and a span")
        finally:
            os.killpg(child.pid, signal.SIGINT)
            child.wait(timeout=30)
    return screen.read_text()


def test_make_demo_reads_like_a_product(tmp_path: Path) -> None:
    """The banner comes first (what runs where, what to open, how to stop); spans are one short line each, not
    JSON; Ctrl-C ends with a one-screen summary whose numbers match the documents file; a second run starts
    afresh (no lifecycles of the first run continued, no warning about them) with its own documents file, and
    the first run's outputs are kept in previous/."""
    demo_dir = tmp_path / "demo-output"
    screen = run_demo(demo_dir, tmp_path / "screen1.txt")
    lines = screen.splitlines()

    assert lines[0].startswith("se-exporter demo: the sidecar polls a simulated IMDS playing the 'demo' scenario")
    banner = lines[:lines.index("  Log lines follow: one per lifecycle transition. Stop with Ctrl-C for a summary.")]
    assert not any(LOG_LINE.match(line) for line in banner), banner
    for label in ("Simulated IMDS", "Metrics", "Documents", "Spans", "State"):
        assert any(line.startswith(f"  {label} ") for line in banner), label
    assert any("curl -s http://127.0.0.1:" in line for line in banner)

    spans = [line for line in lines if " span " in line]
    assert spans and all(SPAN_LINE.match(line) and len(line) < 160 for line in spans), spans
    assert not any(line.lstrip().startswith("{") for line in lines), "JSON on the screen"

    summary = lines[next(i for i, line in enumerate(lines) if line.startswith("se-exporter demo summary")):]
    assert len(summary) <= 20, summary
    written = len((demo_dir / "documents.jsonl").read_text().splitlines())
    assert f"  Forwarded       {written} documents to {demo_dir / 'documents.jsonl'}" in summary
    assert any(line.startswith("  Transitions") for line in summary)
    assert "make: ***" not in screen  # Ctrl-C is the way to stop, not an error

    first_messages = {json.loads(line)["message_id"] for line in
                      (demo_dir / "documents.jsonl").read_text().splitlines()}
    screen = run_demo(demo_dir, tmp_path / "screen2.txt")
    assert "not continuing" not in screen and "continuing" not in screen
    assert (demo_dir / "previous" / "documents.jsonl").read_text().splitlines()
    second = (demo_dir / "documents.jsonl").read_text().splitlines()
    assert second and not {json.loads(line)["message_id"] for line in second} & first_messages
    assert json.loads(second[0])["sequence"] == 1
