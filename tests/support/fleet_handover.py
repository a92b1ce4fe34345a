"""A hand-over watched from outside, as a user's Prometheus sees it: every replica's /metrics scraped at once every
0.25 s, and what each round showed (the VMs on each replica, how many on two, how many on none). Used by
tests/integration/test_fleet_handover.py and scripts/fleet_handover.py (the measured window in docs/operations.md)."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tests.support.fleet_helpers import FleetProcess

EVERY = 0.25  # seconds between rounds
VM_ID = re.compile(rb'^azure_scheduled_fleet_vm_last_seen_timestamp_seconds\{[^}]*vm_id="([^"]+)"', re.MULTILINE)


@dataclass(frozen=True)
class Round:
    """One round of scrapes, sent to every replica at once: the VM ids each showed (empty: it did not answer)."""

    started: float  # time.monotonic() before the requests were sent
    shown: tuple[frozenset[str], ...]
    after: dict[str, float]  # what ``context()`` said once every scrape had answered

    @property
    def union(self) -> frozenset[str]:
        return frozenset().union(*self.shown)

    @property
    def overlap(self) -> frozenset[str]:
        """VMs shown by two replicas or more: what a sum of per-replica totals counts twice."""
        seen: set[str] = set()
        twice: set[str] = set()
        for ids in self.shown:
            twice |= seen & ids
            seen |= ids
        return frozenset(twice)

    @property
    def total(self) -> int:
        """The sum of the per-replica counts, as ``sum(azure_scheduled_fleet_vms)`` gives it."""
        return sum(len(ids) for ids in self.shown)


def shown_by(replica: FleetProcess) -> frozenset[str]:
    """The VM ids one replica shows right now; none when it does not answer (stopped, killed)."""
    try:
        with urllib.request.urlopen(replica.metrics_url, timeout=10) as response:
            return frozenset(match.decode() for match in VM_ID.findall(response.read()))
    except OSError:
        return frozenset()


@dataclass
class Watch:
    """Rounds every EVERY seconds over ``replicas`` (a list the caller may append to) until ``stop``."""

    replicas: list[FleetProcess]
    context: Callable[[], dict[str, float]] = dict
    rounds: list[Round] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(4)
        self._thread = threading.Thread(target=self._run, name="handover-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            shown = tuple(self._pool.map(shown_by, list(self.replicas)))
            self.rounds.append(Round(started, shown, dict(self.context())))
            self._stop.wait(max(0.0, EVERY - (time.monotonic() - started)))

    def stop(self) -> list[Round]:
        self._stop.set()
        self._thread.join(30)
        self._pool.shutdown()
        return self.rounds


def windows(rounds: Sequence[Round], size: Callable[[Round], int]) -> list[tuple[int, int]]:
    """Runs of consecutive rounds where ``size`` is above 0: (the largest size, the number of rounds) each."""
    runs: list[tuple[int, int]] = []
    largest = length = 0
    for one in rounds:
        value = size(one)
        if value:
            largest, length = max(largest, value), length + 1
        elif length:
            runs.append((largest, length))
            largest = length = 0
    if length:
        runs.append((largest, length))
    return runs


def summary(rounds: Sequence[Round], fleet: int) -> str:
    """The largest number of VMs on two replicas and on none, and for how many rounds in a row, in words."""
    twice = windows(rounds, lambda one: len(one.overlap))
    missing = windows(rounds, lambda one: fleet - len(one.union))

    def describe(runs: list[tuple[int, int]]) -> str:
        if not runs:
            return "none"
        largest = max(size for size, _ in runs)
        longest = max(length for _, length in runs)
        return (f"at most {largest} VMs, for up to {longest} rounds in a row (about {longest * EVERY:g} s); "
                f"{len(runs)} runs")
    return (f"{len(rounds)} rounds every {EVERY:g} s: on two replicas {describe(twice)}; "
            f"on none {describe(missing)}")
