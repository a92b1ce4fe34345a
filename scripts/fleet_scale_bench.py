"""`se-exporter fleet` at scale: 100,000 VMs over 32 partitions, two replicas, Azurite; ratios to the bare SDK.

    python scripts/fleet_scale_bench.py           (make bench)  100,000 VMs, 32 partitions, 3 minutes of heartbeats
    python scripts/fleet_scale_bench.py --smoke   300 VMs, 4 partitions, seconds-long phases (make test)

Processes, all on this machine's cores at once: the Event Hubs test server (tests/support/eventhubs_server.py) in its
own process, which is also the producer (documents are appended to its store directly, built through the sidecar's own
envelope: the SDK's AMQP sender is left out, the benchmark measures the consumers); Azurite, reached through a
counting proxy in its own process (it counts the bodies of writes to the state blobs, and every byte sent); the
replicas (`tests.support.fleet_helpers.FleetProcess`); the bare SDK (`EventHubConsumerClient.receive_batch`, same batch
size and prefetch as `fleet`, no checkpoint store, consumer group `bare`, in its own process); and this script,
which scrapes and parses /metrics. Phases, in order, and what runs in each besides the hub, Azurite and the proxy:

1. backlog: one replica; one document per VM enqueued at once; time until its /metrics shows every VM; then its
   RSS holding all of them (the highest over two checkpoint intervals, state writes included; per 100,000 VMs:
   the idle RSS plus the growth scaled) and one scrape's CPU and bytes (median of 5).
2. hand-over: a second replica starts and the SDK's load balancing moves half the partitions to it (one per
   balancing round); both are scraped every 0.25 s: VMs counted once (distinct vm_id over the replicas, what the
   shipped queries count) against the sum of the replicas' `azure_scheduled_fleet_vms`; the overlap is the
   difference: its maximum, how long it lasted, and whether the distinct count ever passed the fleet's size.
3. idle: both replicas, no documents: their CPU per second (balancing rounds, timers).
4. defaults: the replicas replaced one at a time by two with the fleet's default --load-balancing-interval
   (30 s) and --ownership-expiry (180 s), each taking over the half its predecessor released (the other paused
   meanwhile, so that its half stays its own: see ``defaults``); waited for until exact (the split is printed);
   then idle again, at the defaults.
5. steady state, at the defaults: heartbeats from every VM every 300 s, both replicas scraped every 15 s, and as
   references, receiving the same stream from the latest event on: the bare SDK in one process (every
   partition), and two bare SDK processes in one consumer group, half the partitions each (explicit partition
   ids: no checkpoint store, no balancing), as the two replicas share the stream. The replicas' CPU per second
   (all threads from /proc, both summed, idle wake-ups, balancing rounds, checkpoints and scrapes included) over
   each reference, both printed and labelled (the target is per replica, like for like: over the pair, each
   process receiving the half a replica receives; the one process is printed beside it); state bytes written
   per second (the replicas' counter `azure_scheduled_fleet_state_bytes_written_total` where the fleet has it,
   else the proxy's count of state blob write bodies; both are printed) over the bytes of the documents received.
6. wave, at the defaults: the heartbeats go on and 10,000 VMs get a new event within 60 s: time from its first
   document until the replicas' /metrics show every one of them (distinct VMs), over the time until the bare SDK
   has received them.
7. restart: the replicas restarted together with the fail-over settings and waited for until evenly split; then
   kill -9 of one replica and a new one started at once: time until the picture is exact again (every VM once,
   every partition owned, every wave VM with its event).

Fail-over settings: the dead replica's ownerships are taken only after --ownership-expiry, and the hand-over of
phase 2 takes one balancing round per partition, so the backlog, hand-over, first idle and restart phases run
with shorter intervals than the fleet's defaults (--balancing 2, --ownership 10): each round renews every owned
partition's ownership blob, CPU the bare SDK does not spend. The steady state and the wave, which need no
fail-over, run at the defaults: like for like with the references.

Each figure is printed with its reference, the ratio and the target beside it; nothing fails on a missed target. A
run at the default sizes writes them to docs/measurements/fleet-scale.json; smoke and other sizes only print them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fleet_bench import cpu_seconds, rss_mb  # same folder: the pieces both fleet benchmarks use
from fleet_peers import WAVE_EVENT, Child

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from se_exporter.fleet.settings import DEFAULT_CHECKPOINT_INTERVAL, FleetSettings  # noqa: E402
from tests.support.fleet_helpers import Azurite, FleetProcess  # noqa: E402
from tests.support.helpers import wait_until  # noqa: E402

FLEET = b"azure_scheduled_fleet"
DEFAULT_BALANCING = FleetSettings.load_balancing_interval  # what the steady state and the wave run with
DEFAULT_OWNERSHIP = 6 * DEFAULT_BALANCING  # --ownership-expiry unset: six balancing intervals
ORDERLY_STOP = 60.0  # seconds a SIGTERM'd replica gets to write its states and release its partitions


@dataclass(frozen=True)
class Sizes:
    vms: int
    partitions: int
    steady_s: float
    heartbeat_s: float
    scrape_s: float
    wave: int
    wave_s: float
    idle_s: float
    checkpoint_s: float


FULL = Sizes(vms=100_000, partitions=32, steady_s=180, heartbeat_s=300, scrape_s=15, wave=10_000, wave_s=60,
             idle_s=20, checkpoint_s=DEFAULT_CHECKPOINT_INTERVAL)
SMOKE = Sizes(vms=300, partitions=4, steady_s=4, heartbeat_s=10, scrape_s=1, wave=100, wave_s=2, idle_s=2,
              checkpoint_s=1)


# ---------------------------------------------------------------- what the replicas show


def family(text: bytes, name: bytes) -> bytes:
    """The sample lines of one family (as the fleet writes them: after its TYPE line, up to the next comment)."""
    start = text.find(b"# TYPE " + FLEET + b"_" + name + b" ")
    if start < 0:
        return b""
    start = text.find(b"\n", start) + 1
    end = text.find(b"\n#", start)
    return text[start:] if end < 0 else text[start:end + 1]


def total(text: bytes, name: bytes) -> float | None:
    """The sum of a family's samples (a counter's family is named with its _total); None without the family."""
    lines = family(text, name)
    if not lines:
        return None
    prefix = FLEET + b"_" + name
    return sum(float(line.rsplit(b" ", 1)[1]) for line in lines.splitlines()
               if line.startswith(prefix) and line[len(prefix):len(prefix) + 1] in (b" ", b"{"))


VM_ID = re.compile(rb'vm_id="([^"]*)"')
WAVE_VM = re.compile(rb'vm_id="([^"]*)"[^\n]*event_id="' + WAVE_EVENT.lower())  # the fleet labels EventIds lower-cased


@dataclass
class Picture:
    """One scrape of every replica, read as the shipped queries read it."""

    at: float  # unix time, when the scrapes were sent (a replica renders what it holds then)
    distinct: int  # VMs counted once over the replicas
    summed: float  # the replicas' azure_scheduled_fleet_vms, summed
    owned: tuple[float, ...]  # partitions each replica reads
    wave: int  # VMs with a wave event, counted once
    scrape_bytes: int

    @property
    def overlap(self) -> float:
        return self.summed - self.distinct


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - loopback only
        return bytes(response.read())


class Replicas:
    """The running replicas, scraped at once (one thread each)."""

    def __init__(self, hub: str, storage: str, work: Path, args: list[str], fast: list[str]) -> None:
        self.hub, self.storage, self.work, self.args, self.fast = hub, storage, work, args, fast
        self.running: list[FleetProcess] = []
        self.started = 0
        self.pool = ThreadPoolExecutor(4)

    def start(self, extra: list[str] | None = None) -> FleetProcess:
        """One more replica, with the run's arguments and ``extra`` (default: the fail-over phases' settings)."""
        self.started += 1
        replica = FleetProcess(self.hub, self.storage, self.work / f"replica{self.started}", *self.args,
                               *(self.fast if extra is None else extra))
        self.running.append(replica)
        return replica

    def start_together(self, extra: list[str]) -> None:
        """Two replicas started at the same moment (one thread each): their first balancing rounds race for the
        released partitions, rather than the first taking them all and the second stealing one per round."""
        names = [self.started + 1, self.started + 2]
        self.started += 2

        def one(number: int) -> FleetProcess:
            return FleetProcess(self.hub, self.storage, self.work / f"replica{number}", *self.args, *extra)

        self.running.extend(self.pool.map(one, names))

    def stop_all(self) -> None:
        """SIGTERM to every replica (each writes a last state and releases its partitions), and their exit."""
        for replica in self.running:
            replica.process.terminate()
        for replica in self.running:
            replica.stop()
        self.running.clear()

    def kill(self, replica: FleetProcess) -> None:
        replica.kill()
        self.running.remove(replica)

    def cpu(self) -> float:
        return sum(cpu_seconds(replica.process.pid) for replica in self.running)

    def texts(self) -> list[bytes]:
        return list(self.pool.map(scrape, [replica.metrics_url for replica in self.running]))

    def picture(self) -> Picture:
        at = time.time()
        texts = self.texts()
        ids: set[bytes] = set()
        wave: set[bytes] = set()
        for text in texts:
            ids.update(VM_ID.findall(family(text, b"vm_last_seen_timestamp_seconds")))
            wave.update(WAVE_VM.findall(family(text, b"event_info")))
        return Picture(at, len(ids), sum(total(text, b"vms") or 0.0 for text in texts),
                       tuple(total(text, b"owned_partitions") or 0.0 for text in texts), len(wave),
                       sum(len(text) for text in texts))

    def state_bytes(self) -> float | None:
        """The replicas' azure_scheduled_fleet_state_bytes_written_total, every kind (None: the fleet has none)."""
        counts = [total(text, b"state_bytes_written_total") for text in self.texts()]
        return None if None in counts else sum(count or 0.0 for count in counts)

    def stop(self) -> None:
        self.stop_all()
        self.pool.shutdown()


@dataclass
class Watch:
    """Pictures taken every ``every`` seconds until a condition holds: overlap and counts through a hand-over."""

    pictures: list[Picture] = field(default_factory=list)

    def until(self, replicas: Replicas, done: Any, every: float, timeout: float, what: str) -> Picture:
        """The first picture for which ``done`` holds."""
        started = time.time()
        while True:
            round_started = time.monotonic()
            picture = replicas.picture()
            self.pictures.append(picture)
            if done(picture):
                return picture
            if picture.at - started > timeout:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {picture}")
            time.sleep(max(0.0, every - (time.monotonic() - round_started)))  # the scrape cadence

    def stretches(self, measure: Callable[[Picture], float]) -> tuple[float, float, float]:
        """The largest ``measure`` of the pictures (VMs on two replicas, VMs on none), the seconds it was above 0
        in all (a picture counts until the next one), and the longest stretch of them."""
        most, seconds, longest, stretch = 0.0, 0.0, 0.0, 0.0
        for before, after in zip(self.pictures, self.pictures[1:], strict=False):
            most = max(most, measure(before))
            if measure(before) > 0:
                seconds += after.at - before.at
                stretch += after.at - before.at
                longest = max(longest, stretch)
            else:
                stretch = 0.0
        return max(most, measure(self.pictures[-1]) if self.pictures else 0.0), seconds, longest

    def cadence(self) -> float:
        gaps = [after.at - before.at for before, after in zip(self.pictures, self.pictures[1:], strict=False)]
        return statistics.median(gaps) if gaps else 0.0


# ---------------------------------------------------------------- the phases


@dataclass
class Row:
    figure: str
    measured: float
    unit: str
    reference: float | None = None
    target: str = ""

    @property
    def ratio(self) -> float | None:
        return self.measured / self.reference if self.reference else None


@dataclass
class Run:
    """One run's peers and figures."""

    sizes: Sizes
    hub: Child
    proxy: Child
    replicas: Replicas
    balancing: float
    rows: list[Row] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    bare: Child | None = None
    pair: list[Child] = field(default_factory=list)  # two bare SDK processes, half the partitions each

    def row(self, figure: str, measured: float, unit: str, reference: float | None = None, target: str = "") -> None:
        self.rows.append(Row(figure, float(measured), unit, reference, target))  # a count of VMs may be an int

    def exact(self, picture: Picture, wave: int = 0) -> bool:
        """Every VM shown once, every partition read, every wave VM with its event."""
        vms, partitions = self.sizes.vms, self.sizes.partitions
        return picture.distinct == vms and picture.summed == vms and sum(picture.owned) == partitions \
            and picture.wave == wave


def backlog(run: Run) -> None:
    sizes, replicas = run.sizes, run.replicas
    first = replicas.start()
    wait_until(lambda: sum(replicas.picture().owned) == sizes.partitions, timeout=120, interval=0.5,
               what="the first replica to own every partition")
    idle_rss = rss_mb(first.process.pid)
    started = run.hub.ask("backlog")["at"]
    # Read every 2 s: a scrape of 100,000 VMs costs the replica ~0.3 s of CPU, which the backlog would pay too.
    shown = Watch().until(replicas, run.exact, 2.0, 600, "every VM on the first replica").at - started
    peak, until = rss_mb(first.process.pid), time.monotonic() + 2 * sizes.checkpoint_s
    while time.monotonic() < until:  # the highest RSS over two checkpoint intervals: state writes included
        time.sleep(0.25)  # the sampling interval of a measurement, not a wait for a condition
        peak = max(peak, rss_mb(first.process.pid))
    scrapes = []
    for _ in range(5):
        cpu = cpu_seconds(first.process.pid)
        size = len(scrape(first.metrics_url))
        scrapes.append((cpu_seconds(first.process.pid) - cpu, size))
    vms = f"{sizes.vms:,}"
    run.row(f"backlog: {vms} VMs, enqueued at once, all on /metrics", shown, "s")
    run.row("RSS of a replica, idle, every partition owned", idle_rss, "MB")
    run.row(f"RSS of a replica holding all {vms} VMs (highest)", peak, "MB")
    run.row("RSS per 100,000 VMs, one replica holding all", idle_rss + (peak - idle_rss) * 100_000 / sizes.vms, "MB",
            target="<= 250 MB")
    run.row(f"one scrape of {vms} VMs: the replica's CPU (median of 5)",
            statistics.median(cpu for cpu, _ in scrapes) * 1000, "ms")
    run.row(f"one scrape of {vms} VMs: its size", statistics.median(size for _, size in scrapes) / 1e6, "MB")


def hand_over(run: Run) -> None:
    sizes, replicas = run.sizes, run.replicas
    started = time.time()
    replicas.start()
    watch = Watch()

    def balanced(picture: Picture) -> bool:
        return run.exact(picture) and max(picture.owned) - min(picture.owned) <= 1

    took = watch.until(replicas, balanced, 0.25, 120 + sizes.partitions * run.balancing * 3,
                       "a balanced split").at - started
    settled = time.time()  # two balancing rounds more: a partition still moving shows
    watch.until(replicas, lambda picture: picture.at - settled > 2 * run.balancing, 0.25, 60, "two more rounds")
    most, seconds, longest = watch.stretches(lambda picture: picture.overlap)
    gone, gone_seconds, gone_longest = watch.stretches(lambda picture: sizes.vms - picture.distinct)
    highest = max(picture.distinct for picture in watch.pictures)
    run.row("hand-over: second replica started to a balanced, exact split", took, "s")
    # A moving partition's VMs may be on both for a moment: the shipped queries count distinct VMs (the row below).
    run.row("hand-over: most VMs on both replicas at once", most, "VMs", float(sizes.vms))
    run.row("hand-over: time with VMs on both replicas, in all", seconds, "s")
    run.row("hand-over: ... on both, its longest stretch", longest, "s")
    run.row("hand-over: most VMs on neither replica at once", gone, "VMs", float(sizes.vms))
    run.row("hand-over: time with VMs on neither replica, in all", gone_seconds, "s")
    run.row("hand-over: ... on neither, its longest stretch", gone_longest, "s")
    run.row("hand-over: distinct VMs ever above the fleet's size (1 = yes)", float(highest > sizes.vms), "",
            target="0")
    run.row("hand-over: scrape cadence (median between pictures)", watch.cadence(), "s", target="0.25")
    run.notes["hand_over_pictures"] = len(watch.pictures)


def idle(run: Run, settings: str = "") -> None:
    cpu, started = run.replicas.cpu(), time.monotonic()
    time.sleep(run.sizes.idle_s)  # the measurement window
    run.row(f"idle: both replicas' CPU per second, no documents{settings}", (run.replicas.cpu() - cpu)
            / (time.monotonic() - started), "s/s")


def defaults(run: Run) -> None:
    """The fail-over settings' replicas replaced, one at a time, by two at the fleet's default balancing interval
    and ownership expiry, for the steady state and the wave: like for like with the bare SDK, which balances
    nothing. The SDK's greedy balancing claims every released partition it can in one round but steals only one
    per round (30 s at the defaults), so the halves are handed over released: the second replica is paused
    (SIGSTOP: its ownerships stay current), the first stopped (SIGTERM: states written, partitions released), and
    the new one takes the released half in its first round; then the same for the second. The split is noted."""
    sizes, replicas = run.sizes, run.replicas
    started = time.time()
    for _ in range(2):
        old, other = replicas.running
        others = total(scrape(other.metrics_url), b"owned_partitions") or 0.0
        other.process.send_signal(signal.SIGSTOP)  # its partitions stay recorded as its own, not claimable
        replicas.running.remove(other)  # a paused replica answers no scrape
        try:
            replicas.running.remove(old)
            old.process.terminate()  # its orderly stop releases its half: waited for, not cut short by a SIGKILL
            with contextlib.suppress(subprocess.TimeoutExpired):  # after 10 s (a loaded machine takes longer)
                old.process.wait(ORDERLY_STOP)
            if old.stop() != 0:
                raise AssertionError(f"a replica did not stop in order within {ORDERLY_STOP:g} s: its partitions are "
                                     "not released, and the released half cannot be claimed")
            new = replicas.start([])
            wait_until(lambda new=new, others=others: total(scrape(new.metrics_url), b"owned_partitions")
                       == sizes.partitions - others, timeout=120, interval=0.5, what="the released half claimed")
        finally:
            other.process.send_signal(signal.SIGCONT)
            replicas.running.insert(0, other)
    exact = Watch().until(replicas, run.exact, 1.0, 300, "an exact picture at the default balancing interval")
    run.row("defaults: the replicas replaced by two at the default balancing, to an exact picture",
            exact.at - started, "s")
    run.notes["steady_split"] = list(exact.owned)


def idle_default(run: Run) -> None:
    idle(run, f", default balancing ({DEFAULT_BALANCING:g} s)")


def steady(run: Run) -> None:
    sizes, replicas, hub, proxy = run.sizes, run.replicas, run.hub, run.proxy
    # The three bare SDK processes started at once (each waits seconds for its partitions' first empty batches):
    # what is measured starts once all three are ready.
    halves = [("pair", ",".join(str(partition) for partition in range(half, sizes.partitions, 2))) for half in (0, 1)]
    with ThreadPoolExecutor(3) as pool:
        bare, *run.pair = pool.map(lambda extra: Child("bare", replicas.hub, str(sizes.wave), *extra), [(), *halves])
    run.bare = bare
    assert bare.first == "ready", bare.first
    assert all(child.first == "ready" for child in run.pair), [child.first for child in run.pair]
    hub.ask(f"heartbeats {sizes.heartbeat_s}")
    wait_until(lambda: bare.ask("stats")["messages"] > 0, timeout=60, interval=0.1, what="the first heartbeats")

    def snapshot() -> dict[str, Any]:
        return {"at": time.monotonic(), "replicas": replicas.cpu(), "bare": cpu_seconds(bare.process.pid),
                "pair": sum(cpu_seconds(child.process.pid) for child in run.pair),
                "hub": hub.ask("stats"), "proxy": proxy.ask("stats"), "counter": replicas.state_bytes(),
                "received": bare.ask("stats"), "pair_messages": sum(child.ask("stats")["messages"]
                                                                    for child in run.pair)}

    before = snapshot()
    while time.monotonic() - before["at"] < sizes.steady_s:
        time.sleep(min(sizes.scrape_s, max(0.0, sizes.steady_s - (time.monotonic() - before["at"]))))
        replicas.texts()  # what Prometheus would scrape every scrape_s
    after = snapshot()
    seconds = after["at"] - before["at"]

    def rate(*path: str) -> float:
        start: Any = before
        end: Any = after
        for key in path:
            start, end = start[key], end[key]
        return float(end - start) / seconds

    documents = rate("hub", "body_bytes")
    proxied = rate("proxy", "state_body")
    counted = rate("counter") if before["counter"] is not None and after["counter"] is not None else None
    run.notes["state_bytes_source"] = "counter" if counted is not None else "proxy"
    run.notes["steady_messages_per_s"] = rate("hub", "messages")
    run.notes["steady_pair_messages_per_s"] = rate("pair_messages")
    heartbeats = f"{rate('hub', 'messages'):.0f} heartbeats/s"
    run.row(f"steady: {heartbeats}, replicas' CPU per second (both) / one bare SDK process", rate("replicas"),
            "s/s", rate("bare"))  # beside the target's: one process pays its fixed costs once, two replicas twice
    run.row(f"steady: {heartbeats}, replicas' CPU per second (both) / two bare SDK processes, half the "
            "partitions each", rate("replicas"), "s/s", rate("pair"), "<= 1.5x")
    run.row("steady: two bare SDK processes' CPU per second / one bare SDK process's", rate("pair"), "s/s",
            rate("bare"))
    if counted is not None:
        run.row("steady: state bytes written per second (fleet's counter)", counted, "B/s", documents, "<= 2x")
    run.row("steady: state bytes written per second (proxy: state blob write bodies)", proxied, "B/s", documents,
            "" if counted is not None else "<= 2x")
    run.row("steady: bytes sent to storage per second (proxy: every request)", rate("proxy", "sent"), "B/s",
            documents)
    run.row("steady: storage requests per second (proxy)", rate("proxy", "requests"), "/s")
    run.row("steady: document bytes received per second (bare SDK)", rate("received", "body_bytes"), "B/s",
            documents)


def wave(run: Run) -> None:
    sizes, replicas, hub, bare = run.sizes, run.replicas, run.hub, run.bare
    assert bare is not None
    started = hub.ask(f"wave {sizes.wave} {sizes.wave_s}")["at"]
    received = wait_until(lambda: bare.ask("stats")["wave_done_at"], timeout=sizes.wave_s + 120, interval=0.25,
                          what="the bare SDK to receive the wave")
    shown = Watch().until(replicas, lambda picture: picture.wave >= sizes.wave, 0.25, sizes.wave_s + 300,
                          "the wave on /metrics").at
    last = hub.ask("stats")["wave_last"]
    run.row(f"wave: {sizes.wave:,} VMs' new event on /metrics, from its first document", shown - started, "s",
            received - started, "<= 1.5x")
    run.row("wave: ... on /metrics, after its last document", shown - last, "s")
    run.row("wave: ... received by the bare SDK, after its last document", received - last, "s")


def fail_over(run: Run) -> None:
    """Back to the fail-over settings for the restart (a kill -9's partitions are taken after --ownership-expiry):
    the default replicas stopped, two fast ones started at once, waited for until they split evenly."""
    sizes, replicas = run.sizes, run.replicas
    replicas.stop_all()
    replicas.start_together(replicas.fast)
    Watch().until(replicas, lambda picture: run.exact(picture, sizes.wave) and max(picture.owned)
                  - min(picture.owned) <= 1, 1.0, 120 + sizes.partitions * run.balancing * 3, "an even split")


def restart(run: Run) -> None:
    sizes, replicas = run.sizes, run.replicas
    victim = replicas.running[-1]
    killed = time.time()
    replicas.kill(victim)
    replicas.start()
    watch = Watch()
    exact = watch.until(replicas, lambda picture: run.exact(picture, sizes.wave), 0.5,
                        300 + sizes.partitions * run.balancing * 3, "an exact picture after the restart")
    most, seconds, _ = watch.stretches(lambda picture: picture.overlap)
    run.row(f"restart: kill -9 and start of a replica to an exact picture ({sizes.vms:,} VMs)", exact.at - killed,
            "s", target="<= 60 s")
    run.row("restart: most VMs on both replicas at once", most, "VMs", target="0")
    run.row("restart: time with VMs on both replicas, in all", seconds, "s", target="0")
    hub = run.hub.ask("stats")
    run.row(f"the test server, {hub['messages']:,.0f} messages held: its RSS", hub["rss_mb"], "MB")


def measure(sizes: Sizes, args: argparse.Namespace, work: Path) -> Run:
    hub = Child("hub", str(sizes.vms), str(sizes.partitions))
    azurite = proxy = replicas = run = None
    try:
        # Started here, not beside the test server in a thread: its orphan guard (setpriv --pdeathsig) would stop it
        # when the thread that started it ends.
        azurite = Azurite(work / "azurite")
        proxy = Child("proxy", str(azurite.port))
        storage = azurite.connection_string.replace(f":{azurite.port}/", f":{proxy.first}/")
        fleet_args = ["--checkpoint-container", "scale", "--checkpoint-interval", str(sizes.checkpoint_s)]
        fast = ["--load-balancing-interval", str(args.balancing), "--ownership-expiry", str(args.ownership)]
        replicas = Replicas(hub.first, storage, work, fleet_args, fast)
        run = Run(sizes, hub, proxy, replicas, args.balancing)
        for phase in (backlog, hand_over, idle, defaults, idle_default, steady, wave, fail_over, restart):
            print(f"{time.strftime('%H:%M:%S')} {phase.__name__}", file=sys.stderr, flush=True)
            phase(run)
        return run
    finally:  # also when a phase failed: no peer left behind
        if replicas is not None:
            replicas.stop()
        if run is not None and run.bare is not None:
            run.bare.stop()
        for child in run.pair if run is not None else []:
            child.stop()
        if proxy is not None:
            proxy.stop()
        if azurite is not None:
            azurite.stop()
        hub.stop()


def report(run: Run, args: argparse.Namespace, mode: str) -> dict[str, Any]:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    sizes = run.sizes
    print(f"se-exporter fleet at scale ({mode}) on {machine}: {sizes.vms:,} VMs over {sizes.partitions} partitions, "
          f"two replicas, checkpoint interval {sizes.checkpoint_s:g} "
          f"s; backlog, hand-over, first idle and restart: balancing every {args.balancing:g} s, ownership expiry "
          f"{args.ownership:g} s; second idle, steady and wave: the defaults ({DEFAULT_BALANCING:g} s, "
          f"{DEFAULT_OWNERSHIP:g} s), split {run.notes.get('steady_split')}; state bytes from the "
          f"{run.notes['state_bytes_source']}")
    for row in run.rows:
        reference = f"{row.reference:12.3f}" if row.reference is not None else " " * 12
        ratio = f"{row.ratio:8.2f}x" if row.ratio is not None else " " * 9
        print(f"  {row.figure:<76} {row.measured:12.3f} {row.unit:<4} {reference} {ratio}  {row.target}")
    return {"machine": machine, "mode": mode, "vms": sizes.vms, "partitions": sizes.partitions,
            "load_balancing_interval": args.balancing,
            "ownership_expiry": args.ownership, "steady_load_balancing_interval": DEFAULT_BALANCING,
            "steady_ownership_expiry": DEFAULT_OWNERSHIP, "checkpoint_interval": sizes.checkpoint_s,
            "steady_seconds": sizes.steady_s, "heartbeat_interval": sizes.heartbeat_s, **run.notes,
            "figures": [{"figure": row.figure, "measured": round(row.measured, 4), "unit": row.unit,
                         "reference": None if row.reference is None else round(row.reference, 4),
                         "ratio": None if row.ratio is None else round(row.ratio, 4), "target": row.target}
                        for row in run.rows]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="300 VMs, 4 partitions, seconds: checks the script works")
    parser.add_argument("--vms", type=int, help=f"VMs in the fleet (default {FULL.vms:,})")
    parser.add_argument("--partitions", type=int, help=f"partitions of the hub (default {FULL.partitions})")
    parser.add_argument("--steady", type=float, help=f"seconds of steady state (default {FULL.steady_s:g})")
    parser.add_argument("--wave", type=int, help=f"VMs in the maintenance wave (default {FULL.wave:,})")
    parser.add_argument("--wave-seconds", type=float, help=f"seconds the wave is sent over (default {FULL.wave_s:g})")
    parser.add_argument("--balancing", type=float,
                        help="the replicas' --load-balancing-interval (default 2; smoke 0.5)")
    parser.add_argument("--ownership", type=float, help="the replicas' --ownership-expiry (default 10; smoke 3)")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "measurements" / "fleet-scale.json")
    args = parser.parse_args()
    sizes = SMOKE if args.smoke else FULL
    args.balancing = args.balancing or (0.5 if args.smoke else 2.0)
    args.ownership = args.ownership or (3.0 if args.smoke else 10.0)
    for name, attribute in (("vms", "vms"), ("partitions", "partitions"), ("steady", "steady_s"), ("wave", "wave"),
                            ("wave_seconds", "wave_s")):
        if getattr(args, name) is not None:
            sizes = replace(sizes, **{attribute: getattr(args, name)})
    if sizes.wave > sizes.vms:
        parser.error(f"--wave {sizes.wave} is more than the fleet's {sizes.vms} VMs")
    with tempfile.TemporaryDirectory() as work:
        run = measure(sizes, args, Path(work))
    mode = "smoke" if args.smoke else "full" if sizes == FULL else "custom"
    result = report(run, args, mode)
    if mode == "full":
        args.output.parent.mkdir(exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
