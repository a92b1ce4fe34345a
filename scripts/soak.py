"""Soak: 100,000 polls of a fast-changing simulator; print whether memory, open files and threads stay flat.

    python scripts/soak.py [--polls 100000]     (make soak)

The sidecar runs as its own process with metrics, forwarding (to the suite's Event Hubs test server) and spans
(console, to /dev/null) on; figures come from /proc. Loopback only. Writes docs/measurements/soak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from se_exporter.simulator import scenario as scenarios  # noqa: E402 - after the path set-up above
from se_exporter.simulator.server import Simulator, start  # noqa: E402
from tests.support.eventhubs_server import EventHubsTestServer  # noqa: E402

WARM_UP = 5_000
# Memory is compared from one minute after start: by then about 900 documents went through every output and the
# interpreter's and allocator's tables have grown to their working size (a one-time ~0.6 MB step ~45 s after start,
# whatever the poll rate; it is reported as warm_up_growth_mb, not hidden).
WARM_UP_SECONDS = 60.0


def proc(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return {"rss_mb": rss / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": threads}


def metric(url: str, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310 - loopback only
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=20_000)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "measurements" / "soak.json")
    args = parser.parse_args()
    sim = Simulator(scenarios.load("demo"), speed=600.0)  # the demo's 10-minute cycle every second
    imds = start(sim)
    hub = EventHubsTestServer().start()
    with TemporaryDirectory() as state, (Path(state) / "sidecar.log").open("wb") as log:
        env = {**os.environ, "SE_EXPORTER_EVENTHUB_CONNECTION_STRING": hub.connection_string()}
        launched = time.monotonic()
        child = subprocess.Popen(  # noqa: S603 - our own console script with fixed arguments
            [sys.executable, "-m", "se_exporter", "run", "--imds-url", imds.url, "--listen", "127.0.0.1:0",
             "--poll-interval", "0.05", "--state-dir", state, "--otel-traces-exporter", "console",
             "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=ROOT)
        try:
            url = None
            deadline = time.monotonic() + 30
            while url is None and time.monotonic() < deadline:
                # The metrics URL is logged at info; with --log-level warning, find the port from /proc instead.
                url = _listening_url(child.pid)
                time.sleep(0.1)
            assert url, "the sidecar did not start listening"
            polls = lambda: metric(url, "azure_scheduled_events_polls_total", '{outcome="ok"}')  # noqa: E731
            while polls() < WARM_UP:
                time.sleep(0.5)
            early = proc(child.pid)
            time.sleep(max(0.0, WARM_UP_SECONDS - (time.monotonic() - launched)))
            start_figures, started = proc(child.pid), time.monotonic()
            start_polls, start_docs = polls(), metric(url, "azure_scheduled_events_document_changes_total")
            while polls() < start_polls + args.polls:
                time.sleep(1)
                print(f"\r{int(polls() - start_polls):>7,} polls", end="", flush=True)
            end_figures, elapsed = proc(child.pid), time.monotonic() - started
            documents = metric(url, "azure_scheduled_events_document_changes_total") - start_docs
            done = polls() - start_polls
        finally:
            child.terminate()
            child.wait(timeout=15)
            hub.stop()
            imds.shutdown()
    figures = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "polls": int(done), "seconds": round(elapsed, 1), "documents": int(documents),
        "change_every": round(done / max(documents, 1), 1),
        "rss_after_warm_up_polls_mb": round(early["rss_mb"], 2),
        "warm_up_growth_mb": round(start_figures["rss_mb"] - early["rss_mb"], 2),
        "rss_start_mb": round(start_figures["rss_mb"], 2), "rss_end_mb": round(end_figures["rss_mb"], 2),
        "rss_growth_mb": round(end_figures["rss_mb"] - start_figures["rss_mb"], 2),
        "fds_start": int(start_figures["fds"]), "fds_end": int(end_figures["fds"]),
        "threads_start": int(start_figures["threads"]), "threads_end": int(end_figures["threads"]),
    }
    print("\n" + json.dumps(figures, indent=1))
    args.output.parent.mkdir(exist_ok=True)
    args.output.write_text(json.dumps(figures, indent=1) + "\n")
    flat = figures["rss_growth_mb"] <= 1.0 and figures["fds_end"] <= figures["fds_start"] + 2 \
        and figures["threads_end"] <= figures["threads_start"] + 1
    print(("PASS" if flat else "FAIL") + ": RSS growth <= 1 MB, open files and threads flat (a target, not a test)")
    return 0


def _listening_url(pid: int) -> str | None:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            port = int(fields[1].split(":")[1], 16)
            return f"http://127.0.0.1:{port}/metrics"
    return None


if __name__ == "__main__":
    sys.exit(main())
