"""`make demo-fleet`: a small fleet with both streams on one machine, on loopback only, until Ctrl-C.

    python scripts/demo_fleet.py [--speed 5] [--out demo-fleet-output] [--port 10170]

What runs (each on 127.0.0.1, each stopped by Ctrl-C):

* the IMDS simulator playing the ``fleet`` scenario: four VMs of scale set ``web``, each with its own IMDS at
  ``/vms/<name>``, and the platform's Event Grid copy of their events (``--platform-eventhub-*`` and
  ``--platform-file``): a Freeze of web_0 and web_1, a Reboot of web_2 whose sidecar is blind to it, a Redeploy of
  web_3 (no sidecar runs there) and a Reboot of web_1 that is canceled;
* three sidecars (web_0, web_1, web_2) forwarding to the sidecars' event hub;
* the suite's Event Hubs test server (AMQP, tests/support/eventhubs_server.py) serving both hubs, ``sidecars`` and
  ``platform``, and Azurite (tests/azurite, telemetry off) as the fleet's checkpoint store;
* ``se-exporter fleet`` reading both hubs, with a short ``--reconcile-grace`` so a missed event shows quickly.

It prints where everything is, then one line whenever the fleet's picture of the platform's events changes: which
VMs of each EventId were ``observed``, ``missed`` or had ``no_sidecar``. Ctrl-C stops everything and prints
a short summary. Everything it writes goes under ``--out`` (the previous run's is removed first).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.eventhubs_server import EventHubsTestServer, Store  # noqa: E402 - after the path set-up above
from tests.support.fleet_helpers import Azurite  # noqa: E402
from tests.support.helpers import free_port, http_get  # noqa: E402

SIDECARS = ("web_0", "web_1", "web_2")  # web_3 runs none: the platform's events for it are a blind spot
GRACE = "5"  # seconds a live sidecar may take to list an announced event before it counts as missed


class Child:
    """One program of the demo: its own session (Ctrl-C reaches the demo, which stops each in order), stderr and
    stdout to a log file, SIGTERM if the demo dies."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.log = name, log
        guard = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []
        with log.open("wb") as out:
            self.process = subprocess.Popen(  # noqa: S603 - our own programs, arguments of this script
                [*guard, sys.executable, "-m", "se_exporter", *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, cwd=ROOT)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log.read_text(errors="replace"))
            if found:
                return found
            if self.process.poll() is not None:
                raise SystemExit(f"demo-fleet: {self.name} exited with {self.process.returncode}; its log: {self.log}")
            time.sleep(0.1)  # polling a log file for a line, not waiting for something to settle
        raise SystemExit(f"demo-fleet: {self.name} did not start within {timeout:g} s; its log: {self.log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def clean_env(**secrets: str) -> dict[str, str]:
    """No SE_EXPORTER_* or proxy setting of the user's leaks in (loopback only); secrets by environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SE_EXPORTER_")
           and k.upper() not in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")}
    env.update({f"SE_EXPORTER_{name.upper()}": value for name, value in secrets.items()})
    return env


def coverage(metrics_url: str) -> dict[tuple[str, str, str], int]:
    """(event_type, event_id, coverage) -> VMs, from the fleet's /metrics ({} while it does not answer)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    try:
        status, body = http_get(metrics_url)
    except OSError:
        return {}
    if status != 200:
        return {}
    return {(sample.labels["event_type"], sample.labels["event_id"], sample.labels["coverage"]): int(sample.value)
            for family in text_string_to_metric_families(body) for sample in family.samples
            if sample.name == "azure_scheduled_fleet_platform_event_vms"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", type=float, default=5.0, help="scenario speed (default 5: a cycle in a minute)")
    parser.add_argument("--out", type=Path, default=ROOT / "demo-fleet-output", help="where logs and files go")
    parser.add_argument("--port", type=int, default=10170, help="the fleet's port (0: any free one)")
    args = parser.parse_args()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    started: list[Child] = []
    servers: list[EventHubsTestServer] = []
    azurite: Azurite | None = None
    try:
        sidecar_hub = EventHubsTestServer(Store(hub="sidecars"), port=free_port()).start()
        platform_hub = EventHubsTestServer(Store(hub="platform"), port=free_port()).start()
        servers += [sidecar_hub, platform_hub]
        azurite = Azurite(out / "azurite")
        simulator = Child("the simulator", ["simulate", "--listen", "127.0.0.1:0", "--scenario", "fleet", "--speed",
                                            f"{args.speed:g}", "--platform-file", str(out / "platform.jsonl")],
                          out / "simulator.log",
                          clean_env(simulator_platform_eventhub_connection_string=platform_hub.connection_string()))
        started.append(simulator)
        imds = simulator.wait_for(r"at (http://127\.0\.0\.1:\d+)").group(1)
        sidecars = {}
        for name in SIDECARS:
            child = Child(f"the sidecar of {name}", ["run", "--imds-url", f"{imds}/vms/{name}", "--listen",
                                                     "127.0.0.1:0", "--state-dir", str(out / name)],
                          out / f"{name}.log", clean_env(eventhub_connection_string=sidecar_hub.connection_string()))
            started.append(child)
            sidecars[name] = child.wait_for(r"metrics at (http://\S+/metrics)").group(1)
        hubs = {"eventhub_connection_string": sidecar_hub.connection_string(),
                "checkpoint_connection_string": azurite.connection_string,
                "platform_eventhub_connection_string": platform_hub.connection_string()}
        fleet = Child("the fleet", ["fleet", "--listen", f"127.0.0.1:{args.port}", "--checkpoint-container",
                                    "demo-fleet", "--load-balancing-interval", "1", "--checkpoint-interval", "2",
                                    "--reconcile-grace", GRACE], out / "fleet.log", clean_env(**hubs))
        started.append(fleet)
        metrics = fleet.wait_for(r"metrics at (http://\S+/metrics)").group(1)
        print(banner(args.speed, imds, sidecars, metrics, out), flush=True)
        shown: dict[tuple[str, str, str], int] = {}
        while not stop.wait(1.0):
            now = coverage(metrics)
            for key in sorted(now.keys() | shown.keys()):
                if now.get(key, 0) != shown.get(key, 0):
                    event_type, event_id, state = key
                    print(f"{time.strftime('%H:%M:%S')} coverage {event_type:<8} {event_id} {state:<16} "
                          f"{now.get(key, 0)} VM(s)", flush=True)
            shown = now
    finally:
        for child in reversed(started):
            child.stop()
        for server in servers:
            server.stop()
        if azurite is not None:
            azurite.stop()
    lines = (out / "platform.jsonl").read_text().splitlines() if (out / "platform.jsonl").exists() else []
    print(f"se-exporter demo-fleet summary\n  Platform copy   {len(lines)} Event Grid messages "
          f"({out / 'platform.jsonl'}), {len(sidecar_hub.store.all())} sidecar documents on the hub\n"
          f"  Logs            {out}/*.log", flush=True)
    return 0


def banner(speed: float, imds: str, sidecars: dict[str, str], metrics: str, out: Path) -> str:
    return "\n".join([
        f"se-exporter demo-fleet: three sidecars and Azure's own copy of their events, one fleet (speed {speed:g})",
        f"  Simulated IMDS  {imds}/vms/<web_0..web_3>  (web_2 is blind to one Reboot; web_3 runs no sidecar)",
        *(f"  Sidecar {name}   {url}" for name, url in sidecars.items()),
        f"  Platform copy   Event Grid messages to the 'platform' hub and {out / 'platform.jsonl'}",
        f"  Fleet           {metrics}  (reads both hubs; a missed event shows after {GRACE} s)",
        f"  Try             curl -s {metrics} | grep platform_event_vms",
        f"  Logs            {out}/*.log",
        "  Lines follow when the fleet's coverage of an announced event changes. Stop with Ctrl-C.",
    ])


if __name__ == "__main__":
    sys.exit(main())
