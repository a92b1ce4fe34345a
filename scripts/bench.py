"""The sidecar's cost, each figure beside a reference measured in the same run (writes docs/measurements/bench.json).

    python scripts/bench.py           (make bench)  full run, about four minutes
    python scripts/bench.py --smoke   tiny windows and sizes, to keep the script working (make test)

Absolute timings on shared machines differ several-fold from one machine to the next; ratios taken in one run do
not. So every figure is printed with the reference it is divided by, measured at the same time on the
same machine, and the target is a ratio:

* the Go peer (webdevops/azure-scheduledevents-exporter, in ../shared/peers; skipped, and said so, when absent)
  runs at the same time as two sidecars (metrics only; Prometheus + OTLP/HTTP + Event Hubs), each process polling
  its own IMDS double (the project's simulator, the same document) at the same rate. CPU is the sum over all
  threads of /proc/PID/task/*/schedstat (nanoseconds), wake-ups are voluntary context switches per thread, polls
  are counted by each double. Nobody scrapes them while CPU is measured;
* ``json.loads`` of a 1,000-event document beside parse + lifecycle diff of the same bytes;
* the azure-eventhub SDK sending the same documents, in the same batch size, with no spool, beside the spool drain;
* the series and bytes of one /metrics scrape, idle, with one event listed and started, beside the Go peer's scrape
  of the same documents (scripts/series.py), against the series budget: an idle VM at most 1.5x the peer's series
  and 2x its bytes, at most 30 ``azure_*`` series, one listed event at most 15 more.

The sidecars run through scripts/named_threads.py, which only names their OS threads so that the per-thread figures
say which thread is which. The simulator, the Event Hubs test server and the OTLP receiver run here, on loopback.
Nothing fails on a missed target (the machines are noisy); the smoke mode proves the script runs, nothing more.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import json
import os
import platform
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

import series  # noqa: E402 - scripts/series.py, as scripts/core.py below
import yaml  # noqa: E402 - after the path set-up above
from azure.eventhub import EventData  # noqa: E402 - after the path set-up above
from core import document  # noqa: E402 - scripts/core.py: this script's folder is first on sys.path
from prometheus_client import CollectorRegistry  # noqa: E402

from se_exporter.core.pause import TICK  # noqa: E402
from se_exporter.infra.azure.clients import producer_factory  # noqa: E402
from se_exporter.sidecar.forwarding.envelope import CONTENT_TYPE, Envelope  # noqa: E402
from se_exporter.sidecar.forwarding.eventhubs import EventHubsTarget  # noqa: E402
from se_exporter.sidecar.forwarding.forward import ForwardMetrics  # noqa: E402
from se_exporter.sidecar.forwarding.spool import Spool  # noqa: E402
from se_exporter.simulator import scenario as scenarios  # noqa: E402
from se_exporter.simulator.server import SE_PATH, Simulator, SimulatorServer, start  # noqa: E402
from tests.integration.test_prometheus import Prometheus  # noqa: E402
from tests.support import container  # noqa: E402
from tests.support.alerting import ALERTMANAGER_CONFIG, Alertmanager, Webhook, shortened  # noqa: E402
from tests.support.eventhubs_server import EventHubsTestServer  # noqa: E402
from tests.support.helpers import Sidecar, key_times, stop_process  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402

PEER_NAME = "azure-scheduledevents-exporter"
PEER_CANDIDATES = [ROOT.parent / "shared" / "peers" / PEER_NAME, ROOT.parent.parent / "shared" / "peers" / PEER_NAME]
BATCH = 100  # documents per Event Hubs batch, for the forwarder and the bare SDK alike
SPAN_DELAY = 0.5  # the span processor's schedule delay (sidecar/sinks/tracing.py): the floor of span latency
IDLE_VM = "bench-vm"  # a VM the demo's events do not list: its sidecar's pause detector sleeps
ARMED = "metrics only, armed"  # the contender whose VM has a Freeze listed: its pause detector wakes every TICK
ANATOMY_GAP = 0.1  # seconds slept before each measured part of a poll: long enough for the caches to go cold
TICKS = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------- /proc readings

@dataclass(frozen=True)
class Task:
    name: str
    cpu_ns: int  # time on CPU, all of it (user + system), from schedstat
    wakeups: int  # voluntary context switches: the thread slept and was woken
    preempted: int  # involuntary context switches


def tasks(pid: int) -> dict[int, Task]:
    """Every thread of the process now (a thread that ends between two readings takes its CPU with it)."""
    found = {}
    for entry in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu_ns = int((entry / "schedstat").read_text().split()[0])
            status = (entry / "status").read_text()
            name = (entry / "comm").read_text().strip()
        except (OSError, IndexError):
            continue  # it ended while being read
        found[int(entry.name)] = Task(name, cpu_ns, _field(status, "voluntary_ctxt_switches"),
                                      _field(status, "nonvoluntary_ctxt_switches"))
    return found


def _field(status: str, name: str) -> int:
    match = re.search(rf"^{name}:\s+(\d+)", status, re.M)
    return int(match.group(1)) if match else 0


def rss_mb(pid: int) -> float:
    return _field(Path(f"/proc/{pid}/status").read_text(), "VmRSS") / 1024


def process_cpu_ns(pid: int) -> int:
    """utime + stime of the whole process, exited threads included (clock ticks: a cross-check only)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // TICKS


# ---------------------------------------------------------------------------------------------- the processes

@dataclass
class Contender:
    """One process polling its own IMDS double."""

    label: str
    process: subprocess.Popen[bytes]
    double: Simulator
    port: int
    go: bool = False

    @property
    def polls(self) -> int:
        return sum(1 for request in list(self.double.requests) if request.path == SE_PATH)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


@dataclass
class Window:
    """What one contender did over one measuring window."""

    seconds: float
    cpu_ns: int
    process_cpu_ns: int
    polls: int
    threads: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> cpu_ns, wakeups, preempted
    ended_threads: int = 0

    @property
    def wakeups(self) -> float:
        return sum(thread["wakeups"] for thread in self.threads.values())


def _thread_label(contender: Contender, tid: int, task: Task, order: dict[int, int]) -> str:
    if contender.go:
        return f"go thread {order[tid]}"  # Go names no threads: numbered by start order
    if task.name.startswith("Thread-"):
        return "http connection"  # one per scrape; none while nobody scrapes
    return task.name


def measure(contenders: list[Contender], seconds: float) -> dict[str, Window]:
    """Read every contender, leave them alone for ``seconds``, read them again."""
    before = {c.label: (tasks(c.process.pid), process_cpu_ns(c.process.pid), c.polls) for c in contenders}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    windows = {}
    for contender in contenders:
        now, proc_now, polls_now = tasks(contender.process.pid), process_cpu_ns(contender.process.pid), contender.polls
        then, proc_then, polls_then = before[contender.label]
        order = {tid: index for index, tid in enumerate(sorted(now), 1)}
        window = Window(elapsed, 0, proc_now - proc_then, polls_now - polls_then,
                        ended_threads=len(set(then) - set(now)))
        for tid, task in now.items():
            old = then.get(tid, Task(task.name, 0, 0, 0))
            window.cpu_ns += task.cpu_ns - old.cpu_ns
            entry = window.threads.setdefault(_thread_label(contender, tid, task, order),
                                              {"cpu_ns": 0, "wakeups": 0, "preempted": 0})
            entry["cpu_ns"] += task.cpu_ns - old.cpu_ns
            entry["wakeups"] += task.wakeups - old.wakeups
            entry["preempted"] += task.preempted - old.preempted
        windows[contender.label] = window
    return windows


def merge(windows: list[Window]) -> Window:
    total = Window(sum(w.seconds for w in windows), sum(w.cpu_ns for w in windows),
                   sum(w.process_cpu_ns for w in windows), sum(w.polls for w in windows),
                   ended_threads=sum(w.ended_threads for w in windows))
    for window in windows:
        for name, values in window.threads.items():
            entry = total.threads.setdefault(name, {"cpu_ns": 0, "wakeups": 0, "preempted": 0})
            for key, amount in values.items():
                entry[key] += amount
    return total


class Field:
    """The IMDS doubles, the Event Hubs test server, the OTLP receiver and the processes under measurement."""

    def __init__(self, stack: ExitStack, state: Path, peer: Path | None, package: Path) -> None:
        self._state, self.peer, self.package = state, peer, package
        self.hub = EventHubsTestServer().start()
        stack.callback(self.hub.stop)
        self.receiver = OtlpReceiver()
        stack.callback(self.receiver.close)
        self._logs: list[Path] = []

    @staticmethod
    def _double(stack: ExitStack, armed: bool = False) -> tuple[Simulator, SimulatorServer]:
        """The demo, moving only when advanced (changes come on cue). Its events list WestNO_0 and its neighbours:
        served as a VM none of them lists (IDLE_VM: the same bytes, its pause detector asleep) unless ``armed``
        (a Freeze of this VM's listed: the detector awake)."""
        double = Simulator(scenarios.load("demo"), speed=0.001, vm_name=None if armed else IDLE_VM)
        server = start(double)
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        return double, server

    def sidecar(self, stack: ExitStack, label: str, interval: float, every_sink: bool,
                package: Path | None = None, armed: bool = False) -> Contender:
        """A sidecar (from ``package``, default this checkout's), stopped when ``stack`` closes."""
        double, server = self._double(stack, armed)
        port = _free_port()
        directory = self._state / f"{label.replace(' ', '-')}-{interval:g}"
        directory.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SE_EXPORTER_", "OTEL_"))}
        env["PYTHONPATH"] = str(package or self.package)  # as installed: with its bytecode (see compiled_package)
        if every_sink:
            env["SE_EXPORTER_EVENTHUB_CONNECTION_STRING"] = self.hub.connection_string()
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = self.receiver.http_endpoint
        log_path = directory / "sidecar.log"
        self._logs.append(log_path)
        with log_path.open("wb") as log:
            process = subprocess.Popen(  # noqa: S603 - our own launcher with fixed arguments
                [sys.executable, str(ROOT / "scripts" / "named_threads.py"), "run", "--imds-url", server.url,
                 "--listen", f"127.0.0.1:{port}", "--poll-interval", f"{interval:g}", "--state-dir", str(directory)],
                stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=ROOT)
        stack.callback(stop_process, process)
        return Contender(label, process, double, port)

    def go_peer(self, stack: ExitStack, interval: float) -> Contender | None:
        """The Go peer (None when absent), stopped when ``stack`` closes."""
        if self.peer is None:
            return None
        double, server = self._double(stack)
        port = _free_port()
        log_path = self._state / f"go-{interval:g}.log"
        self._logs.append(log_path)
        with log_path.open("wb") as log:
            process = subprocess.Popen(  # noqa: S603 - the measuring stick, fixed arguments, loopback only
                [str(self.peer), f"--bind=127.0.0.1:{port}", f"--scrape-time={round(interval * 1000)}ms",
                 "--api-timeout=3s", f"--api-url={server.url}{SE_PATH}?api-version=2020-07-01"],
                stdout=subprocess.DEVNULL, stderr=log, env={"PATH": os.environ.get("PATH", "")})
        stack.callback(stop_process, process)
        return Contender("Go peer", process, double, port, go=True)

    def warm(self, contenders: list[Contender], polls: int) -> None:
        """Each has polled ``polls`` times, forwarded its first document and been scraped once (as by Prometheus:
        RSS then includes what a scrape leaves behind), then polled ``polls`` times more."""
        try:
            wait(lambda: all(c.polls >= polls for c in contenders), timeout=60, every=0.1)
            for contender in contenders:
                wait(lambda c=contender: _ok(c.metrics_url), timeout=30, every=0.1)  # type: ignore[misc]
            wait(lambda: len(self.hub.store.all()) > 0 and len(self.receiver.spans) > 0, timeout=30, every=0.1)
            marks = {c.label: c.polls for c in contenders}
            wait(lambda: all(c.polls >= marks[c.label] + polls for c in contenders), timeout=60, every=0.1)
        except TimeoutError:
            self.dump_logs()
            raise

    def dump_logs(self) -> None:
        for path in self._logs:
            print(f"--- {path.name}\n{path.read_text()[-3000:] if path.exists() else ''}", file=sys.stderr)


def side_by_side(field_: Field, stack: ExitStack, interval: float, windows: int, window_seconds: float,
                 warm_polls: int, armed: bool = False) -> tuple[list[Contender], list[dict[str, Window]]]:
    """The two sidecars and the Go peer at one rate (and, ``armed``, a metrics-only sidecar whose VM has an event
    listed), warmed, then measured ``windows`` times side by side."""
    contenders = [field_.sidecar(stack, "metrics only", interval, every_sink=False),
                  field_.sidecar(stack, "every sink", interval, every_sink=True)]
    if armed:
        contenders.append(field_.sidecar(stack, ARMED, interval, every_sink=False, armed=True))
    go = field_.go_peer(stack, interval)
    if go is not None:
        contenders.append(go)
    field_.warm(contenders, warm_polls)
    return contenders, [measure(contenders, window_seconds) for _ in range(windows)]


def scrape_cost_ms(contender: Contender, idle_ns_per_s: float, scrapes: int) -> float:
    """CPU of one /metrics scrape: the process's CPU over ``scrapes`` scrapes, less what it spends idle meanwhile.
    Read from /proc/PID/stat, which keeps the CPU of threads that have ended (the sidecar serves each connection
    in a thread of its own), in clock ticks: hence many scrapes."""
    before, started = process_cpu_ns(contender.process.pid), time.monotonic()
    for _ in range(scrapes):
        request = urllib.request.Request(contender.metrics_url, headers={"Accept-Encoding": "gzip"})  # noqa: S310
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback only
            response.read()
    elapsed = time.monotonic() - started
    spent = process_cpu_ns(contender.process.pid) - before - idle_ns_per_s * elapsed
    return max(0.0, spent) / scrapes / 1e6


def detection(field_: Field, contender: Contender, changes: int, interval: float) -> dict[str, list[float]]:
    """Document changed at the double -> the new incarnation on /metrics, -> stored by the Event Hubs server, ->
    update span at the OTLP receiver. Detection is split in two at the first GET the double answered after the
    change (its own clock): the wait for the next poll, and that poll -> on /metrics."""
    sim = contender.double
    found: dict[str, list[float]] = {"detection": [], "next_poll": [], "eventhubs": [], "span": []}
    cycle = sim.scenario.repeat_every  # a repeating scenario gives more changes than one cycle has
    rounds = range(1 + (changes // len(key_times(sim.scenario)) if cycle else 0))
    keys = [key + (cycle or 0.0) * round_ for round_ in rounds for key in key_times(sim.scenario)[1:]]
    phase = random.Random(14)  # noqa: S311 - not security: a reproducible spread of change times
    for key_time in keys[:changes]:
        # Changes otherwise come at one fixed phase of the poll schedule (a fixed time after the previous detection)
        # and the wait for the next poll would not be a fair sample of the interval.
        time.sleep(phase.uniform(0, interval))
        delivered = len(field_.hub.store.all())
        updates = len(field_.receiver.named("scheduled_event.update"))
        before = sim.document()["DocumentIncarnation"]
        sim.advance(max(0.0, key_time + 0.01 - sim.scenario_time()))
        incarnation = sim.document()["DocumentIncarnation"]
        if incarnation == before:
            raise RuntimeError(f"the double's document did not change at scenario second {key_time:g}")
        changed, changed_wall = time.perf_counter(), time.time()
        wait(lambda i=incarnation: value(scrape(contender.metrics_url),  # type: ignore[misc]
                                         "azure_scheduled_events_document_incarnation") == i, every=0.002)
        found["detection"].append(time.perf_counter() - changed)
        found["next_poll"].append(min(r.time for r in list(sim.requests) if r.path == SE_PATH
                                      and r.time >= changed_wall) - changed_wall)
        # Stored by the server (its own millisecond timestamp), so not delayed by the scrapes above.
        wait(lambda d=delivered: len(field_.hub.store.all()) > d)  # type: ignore[misc]
        stored = min(event.enqueued_time_ms for event in field_.hub.store.all()[delivered:])
        found["eventhubs"].append(max(0.0, stored / 1000 - changed_wall))
        wait(lambda u=updates: len(field_.receiver.named("scheduled_event.update")) > u)  # type: ignore[misc]
        found["span"].append(time.perf_counter() - changed)
    return found


# ---------------------------------------------------------------------------------------------- in-process

def core_figures(*args: str) -> dict[str, float]:
    """scripts/core.py in a process of its own, so that the garbage collector walks a heap the sidecar's size."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "core.py"), *args],  # noqa: S603 - ours
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return {name: float(figure) for name, figure in json.loads(done.stdout).items()}


METRICS_ONLY_IMPORTS = ["logging", "ssl", "email.parser", "http.server", "urllib.request", "prometheus_client",
                        "asyncio", "h11", "se_exporter.cli"]
# requests (which the OTLP/HTTP exporter sends with) and the exporter's protobuf messages apart from the exporter
EVERY_SINK_IMPORTS = ["asyncio", "azure.eventhub.aio", "se_exporter.sidecar.forwarding.eventhubs",
                      "opentelemetry.sdk.trace",
                      "urllib3", "charset_normalizer", "requests",
                      "opentelemetry.exporter.otlp.proto.common.trace_encoder",
                      "opentelemetry.exporter.otlp.proto.http.trace_exporter", "se_exporter.sidecar.sinks.tracing"]


def compiled_package(folder: Path, source: Path = ROOT) -> Path:
    """A copy of se_exporter with its bytecode, to put first on the sidecars' PYTHONPATH.

    An installed wheel has its bytecode (pip compiles it); this checkout may not (PYTHONDONTWRITEBYTECODE is set
    on these machines), and compiling ~30 modules at every start costs ~1 MB of RSS that an installed sidecar does
    not have. The copy is compiled here, so the checkout stays as it is."""
    target = folder / "se_exporter"
    shutil.copytree(source / "se_exporter", target, ignore=shutil.ignore_patterns("__pycache__"))
    if not compileall.compile_dir(str(target), quiet=1):
        raise RuntimeError(f"could not compile {target}")
    return folder


def import_rss(package: Path, modules: list[str]) -> list[tuple[str, float]]:
    """RSS after each import, in a fresh interpreter (scripts/import_rss.py): what the resident memory is made of.
    The standard library and third-party pieces come first, in the order the sidecar's own start-up brings them
    in; the every-sink pieces follow (what forwarding and tracing add)."""
    env = {**os.environ, "PYTHONPATH": str(package)}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_rss.py"),  # noqa: S603 - ours
                           *modules], capture_output=True, text=True, check=True,
                          cwd=ROOT, env=env)
    return [(name, float(rss)) for name, rss in json.loads(done.stdout)]


def poll_anatomy(samples: int, gap: float) -> dict[str, float]:
    """What the CPU of one poll is made of (scripts/core.py), against a double of its own."""
    server = start(Simulator(scenarios.load("demo"), speed=0.001))
    try:
        return core_figures("--poll-anatomy", server.url, str(samples), str(gap))
    finally:
        server.shutdown()
        server.server_close()


PROPERTIES: dict[str, str | int] = {"vm_name": "vm-1", "vm_id": "02aab8a4-74ef-476e-8182-f6d2ba4166a6", "vmss_name": "",
              "subscription_id": "8d10da13-8125-4ba9-a717-bf7490507b3d", "resource_group": "maintenance-rg",
              "location": "norwayeast", "observed_at": "2026-11-22T03:09:51.068Z", "api_version": "2020-07-01",
              "exporter_version": "0.1.0", "document_incarnation": 2}


def envelopes(count: int) -> Iterator[Envelope]:
    body = document(2)
    for sequence in range(1, count + 1):
        yield Envelope(sequence, f"bench:{sequence}", "vm-1", {**PROPERTIES, "sequence": sequence}, body, time.time())


class WatchedSpool(Spool):
    """A spool that says when it has been emptied: the drain's end is waited for on an event, not by polling
    its length every few milliseconds from another thread (that loop took the GIL from the forwarder it timed)."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        super().__init__(directory, max_bytes)
        self.emptied = threading.Event()

    def remove(self, envelopes: Iterable[Envelope]) -> None:
        super().remove(envelopes)
        if len(self) == 0:
            self.emptied.set()


def drain_seconds(documents: int) -> float:
    """The forwarder draining ``documents`` spooled envelopes into a fresh Event Hubs test server: from start()
    (its new client connects first, as the bare send's does) to the last acknowledged batch leaving the spool."""
    hub = EventHubsTestServer().start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            spool = WatchedSpool(Path(folder), 1 << 30)
            for envelope in envelopes(documents):
                spool.append(envelope)
            started = time.perf_counter()  # the target's worker starts draining as it is built
            target = EventHubsTarget(spool, producer_factory(hub.connection_string(), None, None, None),
                                     ForwardMetrics(CollectorRegistry()), batch_size=BATCH)
            if not spool.emptied.wait(600):
                raise TimeoutError(f"the forwarder left {len(spool)} documents spooled")
            elapsed = time.perf_counter() - started
            target.close(5)
            return elapsed
    finally:
        hub.stop()


def event_of(envelope: Envelope) -> EventData:
    event = EventData(envelope.body)
    event.content_type = CONTENT_TYPE
    event.message_id = envelope.message_id
    event.properties = dict(envelope.properties)  # type: ignore[assignment]  # SDK: dict[str | bytes, Any]
    return event


def bare_seconds(documents: int) -> float:
    """The same SDK client (async, as the forwarder uses it) sending the same documents in the same batches, with
    no spool, into a fresh Event Hubs test server: from a new client (connecting first, as the drain's does) to the
    last batch acknowledged."""
    hub = EventHubsTestServer().start()
    make_producer = producer_factory(hub.connection_string(), None, None, None)

    async def send(pending: list[Envelope]) -> float:
        started = time.perf_counter()
        producer = make_producer()
        while pending:
            chunk, pending = pending[:BATCH], pending[BATCH:]
            batch = await producer.create_batch(partition_key=chunk[0].partition_key)
            for envelope in chunk:
                batch.add(event_of(envelope))
            await producer.send_batch(batch, timeout=10)
        elapsed = time.perf_counter() - started
        await producer.close()
        return elapsed

    try:
        return asyncio.run(send(list(envelopes(documents))))
    finally:
        hub.stop()


def one_document_trip(singles: int) -> float:
    """The median round trip of a batch of one, on one client."""
    hub = EventHubsTestServer().start()
    make_producer = producer_factory(hub.connection_string(), None, None, None)

    async def round_trips() -> float:
        producer = make_producer()
        trips = []
        for envelope in envelopes(singles):
            started = time.perf_counter()
            batch = await producer.create_batch(partition_key=envelope.partition_key)
            batch.add(event_of(envelope))
            await producer.send_batch(batch, timeout=10)
            trips.append(time.perf_counter() - started)
        await producer.close()
        return statistics.median(trips)

    try:
        return asyncio.run(round_trips())
    finally:
        hub.stop()


def drain_beside_bare(documents: int, rounds: int, singles: int) -> tuple[list[float], list[float], float]:
    """Seconds of ``rounds`` bare sends and ``rounds`` drains, alternated (bare first, then drain first, ...) so that
    both see the same moments of a noisy machine, each on a fresh server and a fresh client; and the median round
    trip of one document. A first untimed send pays the SDK's lazy imports for both."""
    bare_seconds(1)
    bare, drain = [], []
    for index in range(rounds):
        if index % 2 == 0:
            bare.append(bare_seconds(documents))
            drain.append(drain_seconds(documents))
        else:
            drain.append(drain_seconds(documents))
            bare.append(bare_seconds(documents))
    return bare, drain, one_document_trip(singles)


# ---------------------------------------------------------------------------------------------- small helpers

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


def image_and_paging(smoke: bool) -> tuple[dict[str, float] | str, dict[str, float]]:
    """The image size beside its base's, and IMDS change -> webhook beside the intervals that bound it; printed."""
    image = image_figures() if not smoke else "measured by the full run only"
    if isinstance(image, dict):
        print(f"Container image {image['image_mb']:.1f} MB, its base {image['base_mb']:.1f} MB: se-exporter adds "
              f"{image['image_mb'] - image['base_mb']:.1f} MB (uncompressed layers; base: the suite's Debian stand-in)")
    else:
        print(f"Container image size: not measured ({image})")
    paging = paging_figures(1 if smoke else 10)
    bound = sum(PAGING.values())
    terms = " + ".join(f"{name} {seconds:g} s" for name, seconds in PAGING.items())
    print(f"IMDS change -> Alertmanager webhook, bounded by {terms} = {bound:g} s: median {paging['paging_s']:.2f} s "
          f"({paging['paging_s'] / bound:.2f}x the bound), worst {paging['paging_max_s']:.2f} s "
          f"({paging['paging_max_s'] / bound:.2f}x)")
    return image, paging


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


@contextmanager
def announced(what: str) -> Iterator[None]:
    print(f"  {what} ...", end="", flush=True, file=sys.stderr)
    started = time.monotonic()
    yield
    print(f" {time.monotonic() - started:.0f} s", file=sys.stderr)


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    return {"cores": os.cpu_count(), "cpu": model or platform.processor() or platform.machine(),
            "python": platform.python_version(), "kernel": platform.release(),
            "load_average_at_start": [round(load, 2) for load in os.getloadavg()]}


# ---------------------------------------------------------------------------------------------- the table

@dataclass
class Row:
    figure: str
    measured: float
    unit: str
    reference: float | None  # what measured is divided by (None: no reference available in this run)
    reference_is: str
    target: float | None = None  # the ratio to stay at or below (None: no target, shown for information)
    spread: tuple[float, float] | None = None  # lowest and highest ratio over the sub-windows
    absolute: bool = False  # target compares measured itself, not the ratio

    @property
    def ratio(self) -> float | None:
        return self.measured / self.reference if self.reference else None

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        compared = self.measured if self.absolute else self.ratio
        if compared is None:
            return "n/a"
        return "PASS" if compared <= self.target + 1e-9 else "MISS"

    def as_json(self) -> dict[str, Any]:
        return {"figure": self.figure, "measured": round(float(self.measured), 4), "unit": self.unit,
                "reference": None if self.reference is None else round(float(self.reference), 4),
                "reference_is": self.reference_is, "ratio": None if self.ratio is None else round(self.ratio, 3),
                "ratio_spread": None if self.spread is None else [round(x, 3) for x in self.spread],
                "target": self.target, "target_is": "absolute" if self.absolute else "ratio",
                "verdict": self.verdict}


def print_table(rows: list[Row]) -> None:
    print(f"{'figure':<62} {'measured':>10}  {'reference (what)':<46} {'ratio':>18} {'target':>8}")
    for row in rows:
        measured = f"{row.measured:.3g} {row.unit}"
        reference = "n/a" if row.reference is None else f"{row.reference:.3g} {row.unit}"
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        if row.spread is not None:
            ratio += f" ({row.spread[0]:.2f}-{row.spread[1]:.2f})"
        target = "" if row.target is None else (f"<= {row.target:g}" + ("" if row.absolute else "x"))
        print(f"{row.figure:<62} {measured:>10}  {reference + ' (' + row.reference_is + ')':<46.46} {ratio:>18} "
              f"{target:>8} {row.verdict}")


def print_threads(label: str, window: Window) -> None:
    per_s = 1 / window.seconds
    print(f"  {label}: {window.cpu_ns * per_s / 1e6:.3f} ms CPU/s, {window.wakeups * per_s:.1f} wake-ups/s, "
          f"{window.polls * per_s:.2f} polls/s over {window.seconds:.0f} s"
          + (f" ({window.ended_threads} threads ended meanwhile)" if window.ended_threads else ""))
    for name, values in sorted(window.threads.items(), key=lambda item: -item[1]["cpu_ns"]):
        print(f"    {name:<24} {values['cpu_ns'] * per_s / 1e6:8.3f} ms/s  {values['wakeups'] * per_s:6.1f} wake-ups/s"
              f"  {values['preempted'] * per_s:5.1f} preempted/s")


def threads_json(window: Window) -> dict[str, Any]:
    per_s = 1 / window.seconds
    return {"seconds": round(window.seconds, 2), "polls": window.polls,
            "cpu_ms_per_s": round(window.cpu_ns * per_s / 1e6, 4),
            "process_cpu_ms_per_s_ticks": round(window.process_cpu_ns * per_s / 1e6, 3),
            "wakeups_per_s": round(window.wakeups * per_s, 2), "ended_threads": window.ended_threads,
            "threads": {name: {"cpu_ms_per_s": round(v["cpu_ns"] * per_s / 1e6, 4),
                               "wakeups_per_s": round(v["wakeups"] * per_s, 2),
                               "preempted_per_s": round(v["preempted"] * per_s, 2)}
                        for name, v in window.threads.items()}}


def spread(parts: list[dict[str, Window]], label: str, reference: str,
           measure_of: Callable[[Window], float]) -> tuple[float, float] | None:
    ratios = [measure_of(part[label]) / measure_of(part[reference]) for part in parts
              if reference in part and measure_of(part[reference])]
    return (min(ratios), max(ratios)) if ratios else None


@dataclass
class Run:
    """Everything one run measured, before it is turned into rows."""

    smoke: bool
    slow_parts: list[dict[str, Window]]
    slow_total: dict[str, Window]
    slow_rss: dict[str, float]
    scrape_ms: dict[str, float]
    fast_parts: list[dict[str, Window]]
    fast_total: dict[str, Window]
    found: dict[str, list[float]]
    core: dict[str, float]
    anatomy: dict[str, float]
    imports: list[tuple[str, float]]
    drained: int
    bare: float
    single_trip: float
    drain: float
    bare_runs: list[float] = field(default_factory=list)
    drain_runs: list[float] = field(default_factory=list)
    floor_rss: float = 0.0  # MB: a fresh interpreter that has imported prometheus-client alone


def windows_of(smoke: bool, windows: int, seconds: float) -> tuple[tuple[int, float], tuple[int, float]]:
    """(count, seconds) of the 1 Hz and of the 20 Hz windows: a 20 Hz window is a third of a 1 Hz one."""
    return ((2, 1.0), (2, 0.5)) if smoke else ((windows, seconds), (windows, seconds / 3))


def run(smoke: bool, peer: Path | None, windows: int = 4, seconds: float = 15.0) -> Run:
    (slow_windows, slow_seconds), (fast_windows, fast_seconds) = windows_of(smoke, windows, seconds)
    changes, drained = (2, 200) if smoke else (12, 10_000)
    package_dir = tempfile.TemporaryDirectory()
    package = compiled_package(Path(package_dir.name))
    with ExitStack() as stack, tempfile.TemporaryDirectory() as state:
        field_ = Field(stack, Path(state), peer, package)
        with announced(f"1 Hz side by side, {slow_windows} x {slow_seconds:g} s"), ExitStack() as slow_stack:
            slow, slow_parts = side_by_side(field_, slow_stack, 1.0, slow_windows, slow_seconds, 2 if smoke else 5,
                                            armed=True)
            slow_rss = {c.label: rss_mb(c.process.pid) for c in slow}
            slow_total = {c.label: merge([part[c.label] for part in slow_parts]) for c in slow}
            idle = {c.label: slow_total[c.label].cpu_ns / slow_total[c.label].seconds for c in slow}
            scrape_ms = {c.label: scrape_cost_ms(c, idle[c.label], 20 if smoke else 200) for c in slow}
        with announced(f"20 Hz side by side, {fast_windows} x {fast_seconds:g} s, then {changes} changes"), \
                ExitStack() as fast_stack:
            fast, fast_parts = side_by_side(field_, fast_stack, 0.05, fast_windows, fast_seconds, 20 if smoke else 100)
            fast_total = {c.label: merge([part[c.label] for part in fast_parts]) for c in fast}
            try:
                found = detection(field_, next(c for c in fast if c.label == "every sink"), changes, 0.05)
            except TimeoutError:
                field_.dump_logs()
                raise
    with announced("json.loads beside parse + diff; the /metrics writer; the anatomy of a poll"):
        core = core_figures(str(5 if smoke else 60))
        anatomy = poll_anatomy(3 if smoke else 40, ANATOMY_GAP)
        imports = import_rss(package, [*METRICS_ONLY_IMPORTS, *EVERY_SINK_IMPORTS])
        # The floor under the metrics-only RSS: an interpreter that imports prometheus-client and nothing else.
        floor_rss = import_rss(package, ["prometheus_client"])[-1][1]
        package_dir.cleanup()  # (on an error earlier, the interpreter removes it at exit)
    with announced(f"{drained:,} documents: the SDK bare and the spool drain, alternated"):
        bare_runs, drain_runs, single_trip = drain_beside_bare(drained, 2 if smoke else 5, 5 if smoke else 20)
        bare, drain = statistics.median(bare_runs), statistics.median(drain_runs)
    return Run(smoke, slow_parts, slow_total, slow_rss, scrape_ms, fast_parts, fast_total, found, core, anatomy,
               imports, drained, bare, single_trip, drain, bare_runs, drain_runs, floor_rss)


def before_after(peer: Path | None, before: Path, smoke: bool, count: int = 4, length: float = 15.0) -> int:
    """``--before DIR``: the sidecar figures only (CPU per second and wake-ups at 1 Hz, CPU per poll at 20 Hz, RSS),
    this checkout's sidecars and those of another checkout (``DIR``, e.g. ``git worktree add DIR main``) side by side
    with the Go peer, each as a ratio to the peer in the same windows: a change's before/after from one run."""
    (slow_windows, slow_seconds), (fast_windows, fast_seconds) = windows_of(smoke, count, length)
    kinds = [("metrics only", False), ("every sink", True)]
    with ExitStack() as stack, tempfile.TemporaryDirectory() as state, tempfile.TemporaryDirectory() as after_dir, \
            tempfile.TemporaryDirectory() as before_dir:
        packages = {"after": compiled_package(Path(after_dir)), "before": compiled_package(Path(before_dir), before)}
        field_ = Field(stack, Path(state), peer, packages["after"])
        results: dict[float, dict[str, Window]] = {}
        rss: dict[str, float] = {}
        for interval, windows, seconds in ((1.0, slow_windows, slow_seconds), (0.05, fast_windows, fast_seconds)):
            with announced(f"{1 / interval:g} Hz, before and after side by side, {windows} x {seconds:g} s"), \
                    ExitStack() as rate_stack:
                contenders = [field_.sidecar(rate_stack, f"{kind} ({when})", interval, every_sink, packages[when])
                              for when in ("before", "after") for kind, every_sink in kinds]
                go = field_.go_peer(rate_stack, interval)
                contenders += [go] if go is not None else []
                field_.warm(contenders, 2 if smoke else 5)
                parts = [measure(contenders, seconds) for _ in range(windows)]
                results[interval] = {c.label: merge([part[c.label] for part in parts]) for c in contenders}
                if interval == 1.0:
                    rss = {c.label: rss_mb(c.process.pid) for c in contenders}
    slow, fast = results[1.0], results[0.05]
    go_label = "Go peer"

    def ratio(value: float, reference: float | None) -> str:
        return f"{value / reference:.2f}x" if reference else "n/a"

    go_cpu = slow[go_label].cpu_ns / slow[go_label].seconds / 1e6 if go_label in slow else None
    go_poll = fast[go_label].cpu_ns / max(1, fast[go_label].polls) / 1e6 if go_label in fast else None
    go_wake = slow[go_label].wakeups / slow[go_label].seconds if go_label in slow else None
    print(f"\nBefore ({before}) and after (this checkout), each beside the Go peer in the same windows:")
    print(f"{'sidecar':<26} {'CPU/s at 1 Hz':>22} {'CPU per poll at 20 Hz':>24} {'wake-ups/s at 1 Hz':>22} {'RSS':>16}")
    for label in [f"{kind} ({when})" for kind, _ in kinds for when in ("before", "after")]:
        cpu = slow[label].cpu_ns / slow[label].seconds / 1e6
        poll = fast[label].cpu_ns / max(1, fast[label].polls) / 1e6
        wake = slow[label].wakeups / slow[label].seconds
        print(f"{label:<26} {cpu:8.3f} ms {ratio(cpu, go_cpu):>9} {poll:10.3f} ms {ratio(poll, go_poll):>9} "
              f"{wake:10.2f} {ratio(wake, go_wake):>9} {rss[label]:7.1f} MB {ratio(rss[label], rss.get(go_label)):>6}")
    if go_cpu is not None and go_poll is not None and go_wake is not None:
        print(f"{go_label:<26} {go_cpu:8.3f} ms {'':>9} {go_poll:10.3f} ms {'':>9} {go_wake:10.2f} {'':>9} "
              f"{rss[go_label]:7.1f} MB")
    print("Per thread at 1 Hz (CPU from schedstat; wake-ups = voluntary context switches):")
    for label, window in slow.items():
        print_threads(label, window)
    return 0


def rows_of(r: Run) -> list[Row]:
    rounds = [drain / bare for drain, bare in zip(r.drain_runs, r.bare_runs, strict=True)]  # each round's own ratio
    go = "Go peer"
    has_go = go in r.slow_total

    def per_s(label: str) -> float:
        return r.slow_total[label].cpu_ns / r.slow_total[label].seconds / 1e6

    def per_poll(label: str) -> float:
        return r.fast_total[label].cpu_ns / max(1, r.fast_total[label].polls) / 1e6

    def wakeups(label: str) -> float:
        return r.slow_total[label].wakeups / r.slow_total[label].seconds

    def thread_wakeups(label: str, thread: str) -> float:
        window = r.slow_total[label]
        return window.threads.get(thread, {"wakeups": 0})["wakeups"] / window.seconds

    go_per_s = per_s(go) if has_go else None
    go_per_poll = per_poll(go) if has_go else None
    go_wakeups = wakeups(go) if has_go else None
    same_time = "Go peer, same time"
    interval = 50.0

    def cpu_per_s(w: Window) -> float:
        return w.cpu_ns / w.seconds

    def cpu_per_poll(w: Window) -> float:
        return w.cpu_ns / max(1, w.polls)

    rows = [
        Row("CPU per second at 1 Hz, metrics only", per_s("metrics only"), "ms", go_per_s, same_time, 1.0,
            spread(r.slow_parts, "metrics only", go, cpu_per_s)),
        Row("CPU per second at 1 Hz, Prometheus + OTLP + Event Hubs", per_s("every sink"), "ms", go_per_s,
            same_time, 1.5, spread(r.slow_parts, "every sink", go, cpu_per_s)),
        Row("CPU time per poll at 20 Hz (unchanged document), metrics only", per_poll("metrics only"), "ms",
            go_per_poll, same_time, 1.0, spread(r.fast_parts, "metrics only", go, cpu_per_poll)),
        Row("CPU time per poll at 20 Hz, every sink on", per_poll("every sink"), "ms", go_per_poll, same_time, None,
            spread(r.fast_parts, "every sink", go, cpu_per_poll)),
        Row("RSS at 1 Hz, metrics only", r.slow_rss["metrics only"], "MB", r.slow_rss.get(go), same_time, 2.0),
        Row("RSS at 1 Hz, every sink on", r.slow_rss["every sink"], "MB", r.slow_rss.get(go), same_time, 3.5),
        Row("RSS of an interpreter that imported prometheus-client alone", r.floor_rss, "MB", r.slow_rss.get(go),
            same_time),
        Row("wake-ups per second at 1 Hz, metrics only, whole process", wakeups("metrics only"), "/s", go_wakeups,
            same_time, 3.0, absolute=True),
        Row("wake-ups per second at 1 Hz, every sink on", wakeups("every sink"), "/s", go_wakeups, same_time),
        Row("wake-ups per second at 1 Hz, metrics only, an event of this VM listed (pause detector armed)",
            wakeups(ARMED), "/s", wakeups("metrics only"), "metrics only, nothing of this VM listed, same time"),
        Row("wake-ups per second of the armed pause detector's thread", thread_wakeups(ARMED, "pauses"), "/s",
            1 / TICK, "its tick (1 / 40 ms)", 25.0, absolute=True),
        Row("CPU of one /metrics scrape (gzip), metrics only", r.scrape_ms["metrics only"], "ms", r.scrape_ms.get(go),
            same_time),
        Row("parse + lifecycle diff of a 1,000-event document", r.core["parse_diff_1000_ms"], "ms",
            r.core["json_loads_1000_ms"], "json.loads of the same bytes", None),
        Row("parse + lifecycle diff of 1,000 events never seen before", r.core["parse_diff_unseen_1000_ms"], "ms",
            r.core["json_loads_unseen_1000_ms"], "json.loads of the same bytes", None),
        Row("/metrics with 1,000 listed events (gzip)", r.core["scrape_1000_ms"], "ms", r.core["scrape_floor_1000_ms"],
            "prometheus-client writing the same families"),
        Row(f"{r.drained:,} spooled documents drained to Event Hubs (median of {len(r.drain_runs)})", r.drain, "s",
            r.bare, f"the SDK sending them bare, batches of {BATCH} (median of {len(r.bare_runs)})", 1.3,
            (min(rounds), max(rounds)) if rounds else None),
        Row("detection: changed -> on /metrics, 20 Hz, median", statistics.median(r.found["detection"]) * 1000, "ms",
            interval, "the poll interval", interval + 10.0, absolute=True),
        Row("detection, worst of the run", max(r.found["detection"]) * 1000, "ms", interval, "the poll interval",
            2 * interval + 10.0, absolute=True),
        Row("changed -> stored by the Event Hubs server, 20 Hz, median", statistics.median(r.found["eventhubs"]) * 1000,
            "ms", statistics.median(r.found["detection"]) * 1000, "changed -> on /metrics, same changes"),
        Row("changed -> span at the OTLP receiver (median)", statistics.median(r.found["span"]), "s", SPAN_DELAY,
            "the span processor's schedule delay"),
    ]
    soak = ROOT / "docs" / "measurements" / "soak.json"
    if soak.exists():
        figures = json.loads(soak.read_text())
        rows.append(Row("RSS growth over the soak (make soak, a separate run)", figures["rss_growth_mb"], "MB",
                        figures["rss_start_mb"], "RSS at the soak's start"))
    return rows


BUDGET_SERIES, BUDGET_BYTES, BUDGET_AZURE, BUDGET_EVENT = 1.5, 2.0, 30, 15


def budget_verdict(scrapes: dict[str, dict[str, series.Scrape]]) -> str:
    """One line: the series budget met or not, each bound with its measured figure."""
    idle, listed = scrapes["idle"], scrapes["one event listed"]
    ours = idle[series.OURS]
    checks = [(f"azure_* series idle {ours.azure} <= {BUDGET_AZURE}", ours.azure <= BUDGET_AZURE),
              (f"one listed event adds {listed[series.OURS].series - ours.series} <= {BUDGET_EVENT}",
               listed[series.OURS].series - ours.series <= BUDGET_EVENT)]
    go = idle.get(series.GO)
    if go is None:
        checks.append(("Go peer absent: its ratios not measured", True))
    else:
        checks += [(f"series {ours.series / go.series:.2f}x <= {BUDGET_SERIES}x",
                    ours.series <= BUDGET_SERIES * go.series),
                   (f"bytes {ours.bytes / go.bytes:.2f}x <= {BUDGET_BYTES}x", ours.bytes <= BUDGET_BYTES * go.bytes)]
    met = all(ok for _, ok in checks)
    return ("budget met: " if met else "BUDGET MISSED: ") + "; ".join(
        text if ok else f"{text} MISSED" for text, ok in checks)


def print_series(peer: Path | None) -> dict[str, dict[str, series.Scrape]]:
    """The series and bytes of one scrape beside the Go peer's, printed with the budget's verdict."""
    with announced("one /metrics scrape beside the Go peer's: idle, one event listed, started"):
        scrapes = series.measure(peer)
    print("\nSeries and bytes of one scrape (the budget: idle at most 1.5x the Go peer's series and 2x its bytes, "
          f"at most {BUDGET_AZURE} azure_* series; one listed event at most {BUDGET_EVENT} more):")
    print("\n".join("  " + line for line in series.table(scrapes)))
    print("  " + budget_verdict(scrapes))
    return scrapes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script works, not the numbers")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "measurements" / "bench.json")
    parser.add_argument("--peer", type=Path, default=next((p for p in PEER_CANDIDATES if p.exists()), None),
                        help=f"the Go peer's binary (default: {PEER_CANDIDATES[0]} if present)")
    parser.add_argument("--before", type=Path, metavar="DIR",
                        help="only the sidecar figures, this checkout beside the se-exporter checkout in DIR")
    parser.add_argument("--windows", type=int, default=4, help="side-by-side windows per rate (default 4)")
    parser.add_argument("--window-seconds", type=float, default=15.0,
                        help="seconds of a 1 Hz window (default 15; a 20 Hz window is a third of it)")
    args = parser.parse_args()
    peer = args.peer if args.peer is not None and args.peer.exists() else None
    if args.before is not None:
        return before_after(peer, args.before, args.smoke, args.windows, args.window_seconds)
    looked_at = args.peer or PEER_CANDIDATES[0]
    host = machine()
    mode = "smoke" if args.smoke else "full"
    about = f"{host['cores']} cores, {host['cpu']}, Python {host['python']}"
    print(f"se-exporter benchmark ({mode}) on {about}; load average {host['load_average_at_start']}", file=sys.stderr)
    if peer is None:
        print(f"the Go peer is absent ({looked_at}): figures against it are skipped", file=sys.stderr)
    measured = run(args.smoke, peer, args.windows, args.window_seconds)
    rows = rows_of(measured)
    print(f"\nse-exporter benchmark ({mode}): {about}. Ratio = measured / reference, both from this run; "
          "(low-high) = the ratio's spread over the sub-windows.")
    if peer is None:
        print(f"Go peer absent ({looked_at}): rows against it show n/a.")
    print_table(rows)
    print("\nPer thread at 1 Hz (CPU from schedstat; wake-ups = voluntary context switches):")
    for label, window in measured.slow_total.items():
        print_threads(label, window)
    print("Per thread at 20 Hz:")
    for label, window in measured.fast_total.items():
        print_threads(label, window)
    found = measured.found
    rest = [d - n for d, n in zip(found["detection"], found["next_poll"], strict=True)]
    print(f"Detection at 20 Hz, median: {statistics.median(found['detection']) * 1000:.1f} ms = the wait for the next "
          f"poll {statistics.median(found['next_poll']) * 1000:.1f} ms (the double's clock) + that poll -> on /metrics "
          f"{statistics.median(rest) * 1000:.1f} ms, which includes saving the open lifecycles first (two fsyncs: "
          f"{measured.anatomy['lifecycle_save_wall_ms']:.1f} ms wall time here)")
    core = measured.core
    print(f"Parse + diff of 1,000 events apart: parse_document {core['parse_1000_ms']:.2f} ms, lifecycle diff "
          f"{core['diff_1000_ms']:.2f} ms (json.loads {core['json_loads_1000_ms']:.2f} ms)")
    print("Drain beside bare, each round (s): " + "; ".join(
        f"bare {bare:.2f}, drain {drain:.2f} ({drain / bare:.2f}x)"
        for bare, drain in zip(measured.bare_runs, measured.drain_runs, strict=True)))
    a = measured.anatomy
    print(f"Anatomy of a poll (thread CPU, median, each part after sleeping {ANATOMY_GAP:g} s as between polls): "
          f"poll_once {a['poll_once_ms']:.3f} ms, of which the GET through ImdsClient {a['get_imds_client_ms']:.3f} ms "
          f"(the same GET with http.client alone {a['get_http_client_ms']:.3f} ms, as bytes on a bare socket "
          f"{a['get_socket_ms']:.3f} ms); going to sleep and waking in Event.wait {a['wait_ms']:.3f} ms; "
          f"the same poll_once back to back (warm caches) {a['poll_once_warm_ms']:.3f} ms.")
    print("RSS by import, in a fresh interpreter (MB after each; the sidecar's order; the first "
          f"{len(METRICS_ONLY_IMPORTS)} are what metrics only loads):")
    previous = 0.0
    steps = []
    for name, rss in measured.imports:
        steps.append(f"{name} {rss:.1f}" if not previous else f"+{name} {rss - previous:+.1f} = {rss:.1f}")
        previous = rss
    print("  " + "; ".join(steps))
    scrapes = print_series(peer)
    image, paging = image_and_paging(args.smoke)
    result = {"series": series.as_json(scrapes), "machine": host, "mode": mode, "go_peer": str(peer) if peer else None,
              "image": {k: round(v, 1) for k, v in image.items()} if isinstance(image, dict) else image,
              "paging_bound_s": PAGING, "paging_s": {k: round(v, 3) for k, v in paging.items()},
              "figures": [row.as_json() for row in rows],
              "threads_1hz": {label: threads_json(window) for label, window in measured.slow_total.items()},
              "threads_20hz": {label: threads_json(window) for label, window in measured.fast_total.items()},
              "detection_ms": [round(x * 1000, 2) for x in measured.found["detection"]],
              "detection_next_poll_ms": [round(x * 1000, 2) for x in measured.found["next_poll"]],
              "eventhubs_one_document_send_ms": round(measured.single_trip * 1000, 3),
              "drain_s": [round(x, 3) for x in measured.drain_runs],
              "bare_send_s": [round(x, 3) for x in measured.bare_runs],
              "poll_anatomy_ms": {name: round(figure, 4) for name, figure in measured.anatomy.items()},
              "rss_by_import_mb": [[name, round(rss, 2)] for name, rss in measured.imports],
              "parse_and_diff_apart_ms": {"parse": round(measured.core["parse_1000_ms"], 3),
                                          "diff": round(measured.core["diff_1000_ms"], 3)}}
    if args.smoke:
        print(json.dumps(result))
    else:
        args.output.parent.mkdir(exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
