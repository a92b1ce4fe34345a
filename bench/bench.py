"""The sidecar's cost and speed, printed as one table (and written to benchmarks/bench.json).

    python bench/bench.py           (make bench)  full run, about two minutes
    python bench/bench.py --smoke   a few iterations of everything, to keep the script working (make test)

The simulator, the Event Hubs test server and the OTLP receiver run here on loopback; the sidecar runs as a separate
process with Prometheus, OTLP/HTTP spans and Event Hubs forwarding all on. Figures are measured, targets are
printed beside them; nothing here fails on a missed target (the machines are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402 - after the path set-up above
from prometheus_client import CollectorRegistry  # noqa: E402

from se_exporter.app import make_http_app  # noqa: E402
from se_exporter.lifecycle import diff  # noqa: E402
from se_exporter.metrics import Metrics, Snapshot  # noqa: E402
from se_exporter.model import parse_document  # noqa: E402
from se_exporter.simulator import scenario as scenarios  # noqa: E402
from se_exporter.simulator.server import Simulator, start  # noqa: E402
from se_exporter.sinks.envelope import Envelope  # noqa: E402
from se_exporter.sinks.eventhubs import EventHubsTarget, producer_factory  # noqa: E402
from se_exporter.sinks.forward import ForwardMetrics  # noqa: E402
from se_exporter.sinks.spool import Spool  # noqa: E402
from tests import container  # noqa: E402
from tests.alerting import ALERTMANAGER_CONFIG, Alertmanager, Webhook, shortened  # noqa: E402
from tests.eventhubs_server import EventHubsTestServer  # noqa: E402
from tests.helpers import Sidecar  # noqa: E402
from tests.integration.test_prometheus import Prometheus  # noqa: E402
from tests.otlp_receiver import OtlpReceiver  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else 0.0


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback only
        return str(response.read().decode())


def value(text: str, name: str, labels: str = "") -> float | None:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def wait(predicate: Callable[[], object], timeout: float = 30.0, every: float = 0.001) -> float:
    """Seconds until predicate() is truthy, polling tightly by default (this measures latency)."""
    started = time.perf_counter()
    while not predicate():
        if time.perf_counter() - started > timeout:
            raise TimeoutError("condition not met in time")
        time.sleep(every)
    return time.perf_counter() - started


def document(events: int) -> bytes:
    return json.dumps({"DocumentIncarnation": 7, "Events": [
        {"EventId": f"E{i:05d}", "EventType": "Reboot", "EventStatus": "Scheduled", "ResourceType": "VirtualMachine",
         "Resources": [f"vm{i % 50}", f"vm{(i + 1) % 50}"], "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
         "Description": "Host update", "EventSource": "Platform", "DurationInSeconds": -1}
        for i in range(events)]}).encode()


def core_figures(repeats: int) -> dict[str, float]:
    raw = document(1000)
    parse_times, diff_times = [], []
    records: dict = {}  # type: ignore[type-arg]
    for index in range(repeats):
        started = time.perf_counter()
        parsed = parse_document(raw)
        middle = time.perf_counter()
        records = dict(diff({} if index % 2 == 0 else records, parsed, 1000.0 + index).records)
        parse_times.append(middle - started)
        diff_times.append(time.perf_counter() - middle)
    snapshot = Snapshot(records=records, incarnation=7, up=True, has_document=True, vm_name="vm1")
    registry = CollectorRegistry()
    Metrics(registry, lambda: snapshot)
    # Through the sidecar's own /metrics app, asked the way Prometheus asks (OpenMetrics preferred, gzip).
    app = make_http_app(registry, SimpleNamespace(healthy=True, snapshot=snapshot))  # type: ignore[arg-type]
    environ = {"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET", "QUERY_STRING": "", "HTTP_ACCEPT_ENCODING": "gzip",
               "HTTP_ACCEPT": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                              "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"}
    scrapes = []
    for _ in range(repeats):
        started = time.perf_counter()
        b"".join(app(dict(environ), lambda status, headers: None))
        scrapes.append(time.perf_counter() - started)
    return {"parse_diff_1000_ms": statistics.median(a + b for a, b in zip(parse_times, diff_times, strict=True))
            * 1000, "scrape_1000_ms": statistics.median(scrapes) * 1000}


def drain_figure(documents: int) -> float:
    """Seconds for the forwarder to drain ``documents`` spooled envelopes into the Event Hubs test server."""
    hub = EventHubsTestServer().start()
    body = document(2)
    try:
        with tempfile.TemporaryDirectory() as folder:
            spool = Spool(Path(folder), 1 << 30)
            for sequence in range(1, documents + 1):
                spool.append(Envelope(sequence, f"bench:{sequence}", "vm-1", {"sequence": sequence}, body, time.time()))
            target = EventHubsTarget(spool, producer_factory(hub.connection_string(), None, None, None),
                                     ForwardMetrics(CollectorRegistry()))
            started = time.perf_counter()
            target.start()
            wait(lambda: spool.count == 0, timeout=600)
            elapsed = time.perf_counter() - started
            target.close(5)
            return elapsed
    finally:
        hub.stop()


def sidecar_figures(unchanged_polls: int, changes: int) -> dict[str, float]:
    sim = Simulator(scenarios.load("demo"), speed=0.001)  # moves only when advanced: changes happen on cue
    imds = start(sim)
    hub = EventHubsTestServer().start()
    receiver = OtlpReceiver()
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as state, (Path(state) / "sidecar.log").open("wb") as log:
        env = {**os.environ, "SE_EXPORTER_EVENTHUB_CONNECTION_STRING": hub.connection_string(),
               "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint}
        port = _free_port()
        child = subprocess.Popen(  # noqa: S603 - our own console script with fixed arguments
            [sys.executable, "-m", "se_exporter", "run", "--imds-url", imds.url, "--listen", f"127.0.0.1:{port}",
             "--poll-interval", "0.05", "--state-dir", state], stdout=subprocess.DEVNULL, stderr=log, env=env,
            cwd=ROOT)
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            wait(lambda: _ok(url), timeout=30)
            polls = lambda: value(scrape(url), "azure_scheduled_events_polls_total", '{outcome="ok"}') or 0  # noqa: E731
            # Warm: identity read, first document forwarded, spans set up. Checked 5 times a second, not 1,000:
            # RSS is measured as Prometheus would leave it, not after a storm of scrapes (each is a thread).
            wait(lambda: polls() >= 40, timeout=30, every=0.2)
            figures["rss_mb"] = rss_mb(child.pid)
            # Leave the sidecar alone while its CPU is measured: scraping it would measure the scrapes.
            start_cpu, start_polls = cpu_seconds(child.pid), polls()
            time.sleep(unchanged_polls * 0.05)
            end_cpu, end_polls = cpu_seconds(child.pid), polls()
            figures["cpu_per_poll_ms"] = (end_cpu - start_cpu) / (end_polls - start_polls) * 1000
            detection, forwarded, spans = [], [], []
            for key_time in sim.scenario.key_times()[1:changes + 1]:
                delivered = len(hub.store.all())
                updates = len(receiver.named("scheduled_event.update"))
                sim.advance(max(0.0, key_time + 0.01 - sim.scenario_time()))
                incarnation = sim.document()["DocumentIncarnation"]
                changed = time.perf_counter()
                wait(lambda i=incarnation: value(scrape(url), "azure_scheduled_events_document_incarnation") == i)
                seen = time.perf_counter()
                detection.append(seen - changed)
                wait(lambda d=delivered: len(hub.store.all()) > d)
                forwarded.append(time.perf_counter() - seen)
                wait(lambda u=updates: len(receiver.named("scheduled_event.update")) > u)
                spans.append(time.perf_counter() - changed)
            figures["detection_ms"] = statistics.median(detection) * 1000
            figures["detection_max_ms"] = max(detection) * 1000
            figures["eventhubs_after_detection_ms"] = statistics.median(forwarded) * 1000
            figures["span_s"] = statistics.median(spans)
        except TimeoutError:
            print(Path(state, "sidecar.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            child.terminate()
            child.wait(timeout=15)
            hub.stop()
            receiver.close()
            imds.shutdown()
    return figures


def image_figures() -> dict[str, float] | str:
    """Sizes of the image and of its base (uncompressed layers), or why they were not measured. The base is the
    suite's stand-in for python:3.11-slim (Debian's python3 + a virtualenv), so the difference is what se-exporter
    adds; the base's own size is the stand-in's, not python:3.11-slim's."""
    reason = container.unavailable()
    if reason:
        return reason
    base = container.stand_in_base()
    tag = f"localhost/{container.run_name('bench')}"
    container.build_image(tag, base)
    try:
        return {"image_mb": container.image_size(tag) / 1e6, "base_mb": container.image_size(base) / 1e6}
    finally:
        container.remove_image(tag)


# The paging path's intervals: the sidecar's default poll (Azure's advice), and Prometheus and Alertmanager
# shortened from their production 15-30 s so that a run takes a minute; the ratio is what carries over.
PAGING = {"poll": 1.0, "scrape": 1.0, "evaluation": 1.0, "group wait": 1.0}


def paging_figures(events: int) -> dict[str, float]:
    """IMDS change -> webhook received, through the sidecar, Prometheus with dashboards/alerts.yaml and
    Alertmanager with deploy/alertmanager/alertmanager.yml; each of ``events`` Reboots for this VM is a new page."""
    appear = {f"B0000000-0000-4000-8000-{i:012d}": 100.0 * i for i in range(1, events + 1)}
    scenario = {"description": "a Reboot for this VM every 100 s", "events": [
        {"EventId": event_id, "EventType": "Reboot", "appear_at": at, "notice": 3600, "started_for": 60}
        for event_id, at in appear.items()]}
    latencies = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "paging.json").write_text(json.dumps(scenario))
        sim = Simulator(scenarios.load(str(work / "paging.json")))
        imds = start(sim)
        webhook = Webhook()
        group_wait = f"{PAGING['group wait']:g}s"
        alertmanager = Alertmanager(shortened(yaml.safe_load(ALERTMANAGER_CONFIG.read_text()), webhook, group_wait,
                                              group_wait), work / "alertmanager")
        sidecar = Sidecar(["--imds-url", imds.url, "--poll-interval", f"{PAGING['poll']:g}"], work / "sidecar")
        assert PAGING["scrape"] == PAGING["evaluation"], "the Prometheus helper takes one interval for both"
        prom = Prometheus(sidecar.base_url.removeprefix("http://"), work / "prometheus",
                          rule_file=ROOT / "dashboards" / "alerts.yaml", alertmanager=alertmanager.address,
                          interval=PAGING["scrape"])
        try:
            wait(lambda: prom.value("azure_scheduled_events_up") == 1, timeout=60, every=0.1)
            phases = random.Random(16)  # noqa: S311 - spreads phases; nothing secret
            for event_id, at in appear.items():
                # Every interval is 1 s, so the previous page fixes the phase of the next change: spread the
                # changes over the cycle, as IMDS changes fall at any moment.
                time.sleep(phases.uniform(0, PAGING["scrape"]))
                sim.advance(max(0.0, at + 0.01 - sim.scenario_time()))
                changed = time.time()
                wait(lambda e=event_id: webhook.received(event_id=e), timeout=60, every=0.005)
                latencies.append(webhook.received(event_id=event_id)[0].received_at - changed)
        finally:
            prom.stop()
            sidecar.stop()
            alertmanager.stop()
            webhook.close()
            imds.shutdown()
    return {"paging_s": statistics.median(latencies), "paging_max_s": max(latencies)}


def _ok(url: str) -> bool:
    try:
        scrape(url)
    except OSError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script works, not the numbers")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "bench.json")
    args = parser.parse_args()
    smoke = args.smoke
    figures = {**core_figures(3 if smoke else 50), **sidecar_figures(20 if smoke else 1200, 2 if smoke else 12)}
    figures["drain_10000_s"] = drain_figure(200 if smoke else 10_000)
    figures.update(paging_figures(1 if smoke else 10))
    bound = sum(PAGING.values())
    soak = ROOT / "benchmarks" / "soak.json"
    growth = json.loads(soak.read_text())["rss_growth_mb"] if soak.exists() else None
    rows = [
        ("CPU time per poll of an unchanged document (20 Hz)", figures["cpu_per_poll_ms"], "ms", 0.45),
        ("steady RSS, Prometheus + OTLP/HTTP + Event Hubs on", figures["rss_mb"], "MB", 45.0),
        ("detection: document changed -> on /metrics (20 Hz; median)", figures["detection_ms"], "ms", 60.0),
        ("detection, worst of the run", figures["detection_max_ms"], "ms", 60.0),
        ("document detected -> acknowledged by Event Hubs (median)", figures["eventhubs_after_detection_ms"], "ms",
         100.0),
        ("document changed -> span at the OTLP receiver (median)", figures["span_s"], "s", 1.0),
        ("parse + lifecycle diff of a 1,000-event document", figures["parse_diff_1000_ms"], "ms", 5.0),
        ("/metrics scrape with 1,000 listed events", figures["scrape_1000_ms"], "ms", 20.0),
        ("10,000 spooled documents drained to Event Hubs" if not smoke else "200 spooled documents drained",
         figures["drain_10000_s"], "s", 10.0),
    ]
    rows += [("IMDS change -> Alertmanager webhook (median; bound below)", figures["paging_s"], "s", bound),
             ("IMDS change -> Alertmanager webhook, worst of the run", figures["paging_max_s"], "s", bound)]
    if growth is not None:
        rows.append(("RSS growth over 100,000 polls (make soak)", growth, "MB", 1.0))
    image = image_figures() if not smoke else "measured by the full run only"
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"se-exporter benchmark ({'smoke' if smoke else 'full'}) on {machine}")
    print(f"{'figure':<62} {'measured':>12} {'target':>10}")
    for name, measured, unit, target in rows:
        mark = "PASS" if measured <= target else "MISS"
        print(f"{name:<62} {measured:>9.3f} {unit:<2} {'<= ' + format(target, 'g'):>8} {unit:<2} {mark}")
    if isinstance(image, dict):
        print(f"container image {image['image_mb']:.1f} MB, its base {image['base_mb']:.1f} MB: se-exporter adds "
              f"{image['image_mb'] - image['base_mb']:.1f} MB (uncompressed layers; base: the suite's Debian stand-in)")
    else:
        print(f"container image size: not measured ({image})")
    terms = " + ".join(f"{name} {seconds:g} s" for name, seconds in PAGING.items())
    print(f"paging is bounded by {terms} = {bound:g} s: median {figures['paging_s']:.2f} s "
          f"({figures['paging_s'] / bound:.2f} of the bound), worst {figures['paging_max_s']:.2f} s "
          f"({figures['paging_max_s'] / bound:.2f})")
    result = {"machine": machine, "paging_bound_s": PAGING, "mode": "smoke" if smoke else "full",
              "figures": [{"figure": n, "measured": round(m, 4), "unit": u, "target": t} for n, m, u, t in rows],
              "image": {k: round(v, 1) for k, v in image.items()} if isinstance(image, dict) else image}
    if not smoke:
        args.output.parent.mkdir(exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    else:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
