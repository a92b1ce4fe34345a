"""What one VM's /metrics costs a fleet: the series and bytes of real scrapes of ``se-exporter run``, idle, with one
event listed and once it has started, beside the Go peer's scrapes of the same documents in the same run.

    python scripts/series.py            print the table (make bench prints it too)

Used by scripts/bench.py (the figures beside the Go peer) and scripts/docs.py (docs/metrics.md, the budget page).
Both programs poll one simulated IMDS (loopback) whose scenario time moves only when advanced, so each stage is
scraped once both have read it.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from se_exporter.simulator import scenario as scenarios  # noqa: E402 - after the path set-up above
from se_exporter.simulator.server import SE_PATH, Simulator, start  # noqa: E402
from tests.support.helpers import Sidecar, free_port, http_get, stop_process, wait_until  # noqa: E402

# ../shared/peers from a checkout, or from a worktree one level further down.
_PEERS = [folder / "shared" / "peers" / "azure-scheduledevents-exporter"
          for folder in (ROOT.parent, ROOT.parent.parent)]
PEER = next((path for path in _PEERS if path.exists()), _PEERS[0])
# One Freeze for this VM, announced 10 minutes ahead and started for an hour: idle before it, then listed, then
# Started (its notice histogram appears).
SCENARIO = {"description": "one Freeze for this VM", "vm": {"name": "vm0"}, "events": [
    {"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123", "EventType": "Freeze", "Resources": ["vm0"],
     "Description": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
     "EventSource": "Platform", "DurationInSeconds": 5, "appear_at": 100, "notice": 600, "started_for": 3600}]}
# (stage, scenario time, the sidecar's status of the event then: None for no event)
STAGES = (("idle", 0.0, None), ("one event listed", 200.0, "Scheduled"), ("one event started", 800.0, "Started"))
OURS, GO, LEAN = "se-exporter", "Go peer", "se-exporter, lean"
# Every family --disable-metrics can turn off, off: the least a VM can export (the "lean" sidecar).
LEAN_OFF = "notice,impact,spot_rebalance,poll_duration,process"
NAMESPACE = "azure_"


@dataclass(frozen=True)
class Scrape:
    """One /metrics answer: its series (sample lines), those of the ``azure_*`` families, its bytes (plain and as
    gzip, which Prometheus asks for)."""

    series: int
    azure: int
    bytes: int
    gzip_bytes: int
    families: dict[str, int]  # series per family (a histogram's _bucket, _sum and _count under its own name)

    @classmethod
    def of(cls, text: str) -> Scrape:
        lines = [line for line in text.splitlines() if line and not line.startswith("#")]
        body = text.encode()
        families: dict[str, int] = {}
        for line in lines:
            name = re.sub(r"_(bucket|sum|count)$", "", re.split(r"[{ ]", line, maxsplit=1)[0])
            families[name] = families.get(name, 0) + 1
        return cls(len(lines), sum(line.startswith(NAMESPACE) for line in lines), len(body),
                   len(gzip.compress(body, mtime=0)), families)


@contextmanager
def _go_peer(url: str, log: Path) -> Iterator[str]:
    """The Go peer polling ``url`` once a second; yields its metrics URL."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 - the measuring stick, fixed arguments, loopback only
            [str(PEER), f"--bind=127.0.0.1:{port}", "--scrape-time=1000ms", "--api-timeout=3s",
             f"--api-url={url}{SE_PATH}?api-version=2020-07-01"], stdout=subprocess.DEVNULL, stderr=out)
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        stop_process(process)


def _metric(text: str, prefix: str) -> str | None:
    return next((line for line in text.splitlines() if line.startswith(prefix)), None)


def _shows(program: str, text: str, incarnation: int, status: str | None) -> bool:
    """Whether ``program``'s scrape ``text`` shows the document of ``incarnation`` (and ours, the event's status and
    the first poll's series)."""
    if program == GO:
        return _metric(text, "azure_scheduledevent_document_incarnation ") == \
            f"azure_scheduledevent_document_incarnation {incarnation}"
    return f"azure_scheduled_events_document_incarnation {incarnation}.0" in text and (
        status is None or f'event_status="{status}"' in text) and "_polls_total{" in text


def measure(peer: Path | None = PEER) -> dict[str, dict[str, Scrape]]:
    """{stage: {program: its scrape}}; the Go peer only when ``peer`` exists."""
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        (folder / "scenario.json").write_text(json.dumps(SCENARIO))
        sim = Simulator(scenarios.load(str(folder / "scenario.json")), speed=1.0,
                        clock=functools.partial(float, time.time()))  # moves only when advanced
        server = start(sim, "127.0.0.1", 0)
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        # A poll that times out on a loaded machine adds a polls_total{outcome="timeout"} series a VM does not
        # have: the measuring machine is not IMDS, so the requests get all the time they need.
        polling = ["--imds-url", server.url, "--imds-timeout", "1m"]
        sidecar = Sidecar(polling, folder / "sidecar",
                          env={"SE_EXPORTER_MAX_SCRAPE_INTERVAL": "2m"})  # the default, as users run it
        stack.callback(sidecar.stop)
        lean = Sidecar(polling, folder / "lean", env={"SE_EXPORTER_DISABLE_METRICS": LEAN_OFF})
        stack.callback(lean.stop)
        urls = {OURS: sidecar.metrics_url, LEAN: lean.metrics_url}
        if peer is not None and peer.exists():
            urls[GO] = stack.enter_context(_go_peer(server.url, folder / "go.log"))
        figures: dict[str, dict[str, Scrape]] = {}
        for stage, at, status in STAGES:
            sim.advance(at - sim.scenario_time())
            incarnation = sim.document()["DocumentIncarnation"]
            figures[stage] = {}
            for program, url in urls.items():
                def shown(u: str = url, p: str = program, n: int = incarnation, st: str | None = status) -> str | None:
                    text = http_get(u)[1]
                    return text if _shows(p, text, n, st) else None

                text = wait_until(shown, timeout=60, what=f"{program} to show the stage {stage}")
                figures[stage][program] = Scrape.of(text)
        return figures


def table(figures: dict[str, dict[str, Scrape]]) -> list[str]:
    """The figures as text lines, each of ours beside the Go peer's and as a ratio to it."""
    lines = [f"{'stage':<20} {'program':<18} {'series':>7} {'azure_*':>8} {'bytes':>8} {'gzip':>7}"
             f" {'series ratio':>13} {'bytes ratio':>12}"]
    for stage, programs in figures.items():
        go = programs.get(GO)
        for program, scrape in programs.items():
            ratios = "" if go is None or program == GO else \
                f" {scrape.series / go.series:12.2f}x {scrape.bytes / go.bytes:11.2f}x"
            lines.append(f"{stage:<20} {program:<18} {scrape.series:7d} {scrape.azure:8d} {scrape.bytes:8d} "
                         f"{scrape.gzip_bytes:7d}{ratios}")
    return lines


def as_json(figures: dict[str, dict[str, Scrape]]) -> dict[str, dict[str, dict[str, int]]]:
    return {stage: {program: asdict(scrape) for program, scrape in programs.items()}
            for stage, programs in figures.items()}


def main() -> int:
    figures = measure()
    if GO not in figures["idle"]:
        print(f"the Go peer is absent ({PEER}): its column is empty", file=sys.stderr)
    print("\n".join(table(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
