"""The window a hand-over leaves between two `se-exporter fleet` replicas, as a user's Prometheus sees it.

    python scripts/fleet_handover.py [--vms 10000] [--baseline REF] [--balancing SECONDS]

One hub of 4 partitions (the suite's AMQP test server) holding one document of each of ``--vms`` VMs, Azurite, and
for each source tree (``--baseline``: a git revision, unpacked with ``git archive``; then this tree) on a container
of its own: replica A shows and writes the whole fleet, replica B starts (a rebalance: it takes two partitions), then
B gets SIGTERM (A takes them back). Both /metrics are scraped at once every 0.25 s throughout; printed per tree and
step: the most VMs shown by both replicas (what a sum over replicas counts twice) and by neither, and for how many
rounds in a row. The figures in docs/operations.md come from this script; the default baseline is the release
before replicas held a claimed partition until its link attached.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.eventhubs_server import EventHubsTestServer, Store  # noqa: E402 - after the path set-up above
from tests.support.fleet_handover import Watch, summary  # noqa: E402
from tests.support.fleet_helpers import Azurite, FleetProcess, envelope_for, fleet_vm, produce, vm_identity  # noqa: E402
from tests.support.helpers import free_port, wait_until  # noqa: E402

PARTITIONS = 4

def intervals(balancing: float) -> tuple[str, ...]:
    """The replicas' flags: ``--load-balancing-interval`` (the SDK's default is 30 s; 0.5 s makes a hand-over
    quick, and a round is then most often the first sign of it), the ownership expiry at the SDK's 6 times that."""
    return ("--load-balancing-interval", f"{balancing:g}", "--ownership-expiry", f"{6 * balancing:g}",
            "--checkpoint-interval", "0.5")
BASELINE = "f31bb23"  # the last commit before the hand-over hold


def unpack(revision: str, into: Path) -> Path:
    """A source tree of ``revision`` (its se_exporter package is what `-m se_exporter` finds from there)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "se_exporter"],  # noqa: S603, S607
                             check=True, capture_output=True).stdout  # the revision is the caller's own
    with tarfile.open(fileobj=io.BytesIO(archive)) as unpacked:
        unpacked.extractall(into, filter="data")
    return into


def one_tree(name: str, tree: Path, hub: EventHubsTestServer, azurite: Azurite, count: int, work: Path,
             flags: tuple[str, ...]) -> str:
    fleet = frozenset(vm_identity(index).vm_id for index in range(count))
    partition_of = {(identity := fleet_vm(index)[0]).vm_id: hub.store.partition_for(
        envelope_for(identity, fleet_vm(index)[1], 1, "i").partition_key) for index in range(count)}
    container = f"handover-{uuid.uuid4().hex[:12]}"

    def replica(label: str) -> FleetProcess:
        return FleetProcess(hub.connection_string(), azurite.connection_string, work / f"{name}-{label}",
                            "--checkpoint-container", container, *flags, cwd=tree)

    def shows(watch: Watch, shares: dict[int, int]) -> bool:
        last = watch.rounds[-1] if watch.rounds else None
        return last is not None and last.union == fleet and not last.overlap and all(
            len({partition_of[vm_id] for vm_id in last.shown[index]}) == share for index, share in shares.items())

    first = replica("a")
    replicas = [first]
    try:
        wait_until(lambda: first.value("azure_scheduled_fleet_vms") == count and all(
            first.value("azure_scheduled_fleet_partition_checkpoint_age_seconds", partition_id=str(p)) == 0
            for p in range(PARTITIONS)), timeout=300, interval=0.5, what="replica A to show and write the fleet")
        watch = Watch(replicas)
        wait_until(lambda: shows(watch, {0: PARTITIONS}), timeout=60, what="a full round")
        replicas.append(replica("b"))
        wait_until(lambda: shows(watch, {0: 2, 1: 2}), timeout=120, what="replica B's share shown")
        split = len(watch.rounds)
        replicas[1].stop()
        wait_until(lambda: shows(watch, {0: PARTITIONS, 1: 0}), timeout=120, what="replica A to show it all again")
        rounds = watch.stop()
    finally:
        for process in replicas:
            process.stop()
    full = next(index for index, one in enumerate(rounds) if one.union == fleet)
    return (f"\n  B starts (a rebalance): {summary(rounds[full:split], count)}"
            f"\n  B gets SIGTERM (a release): {summary(rounds[split:], count)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=10_000)
    parser.add_argument("--baseline", default=BASELINE, help="git revision to compare with (default %(default)s)")
    parser.add_argument("--balancing", type=float, default=0.5, help="load-balancing interval, s (%(default)s)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-handover-") as scratch:
        work = Path(scratch)
        hub = EventHubsTestServer(Store(partition_count=PARTITIONS), port=free_port()).start()
        azurite = Azurite(work / "azurite")
        try:
            started = time.monotonic()
            produce(hub.connection_string(), PARTITIONS, options.vms, 0, 1, str(uuid.uuid4()))
            print(f"{options.vms} VMs over {PARTITIONS} partitions sent in {time.monotonic() - started:.1f} s",
                  flush=True)
            trees = {f"baseline {options.baseline}": unpack(options.baseline, work / "baseline"), "this tree": ROOT}
            for name, tree in trees.items():
                result = one_tree(name.split()[0], tree, hub, azurite, options.vms, work, intervals(options.balancing))
                print(f"{name} (balancing every {options.balancing:g} s): {result}", flush=True)
        finally:
            azurite.stop()
            hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
