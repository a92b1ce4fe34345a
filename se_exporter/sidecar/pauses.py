"""The pause detector: a thread that wakes every 40 ms while this VM has an event listed (and for a minute after),
and sleeps without a timeout otherwise.

Armed, any thread that runs may look (``check``): the poll loop does at the start of every poll, so a pause that
ends an event is counted into the event's record before the document that ends it is read. Idle, the poll loop's
own wait is the detector (``overslept``): at one poll a second, a pause of P seconds shows as P-1 to P. What is found
is counted on the histogram at once and handed to the poll loop (``take``), which folds it into the records (the
records' one writer) and hands it to the outputs. The rules (what a pause is, whose it is) are ``core/pause.py``'s.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

from se_exporter.core import pause
from se_exporter.core.lifecycle import EventRecord
from se_exporter.core.pause import Pause
from se_exporter.sidecar.metrics import Metrics

log = logging.getLogger("se_exporter")
BUSY_SHARE = 0.5  # of a late look's lateness: this process used that much CPU meanwhile, so it was not stopped
HELD = 256  # pauses found and not yet taken by the poll loop: a VM pausing every second fills none of it


class PauseDetector:
    """Finds pauses (see the module docstring); ``throttled`` reads the cgroup's throttled seconds (None: unknown)."""

    def __init__(self, metrics: Metrics, monotonic: Callable[[], float] = time.monotonic,
                 throttled: Callable[[], float | None] | None = None,
                 steal: Callable[[], float | None] | None = None,
                 cpu: Callable[[], float] = time.process_time) -> None:
        self._metrics = metrics
        self._monotonic = monotonic
        # A stopped process or a frozen VM burns no CPU; one whose own work held the interpreter (a huge document
        # parsed) did: the CPU this process used over a late look tells the two apart.
        self._cpu = cpu
        self._cpu_at = cpu()
        self._looked = -math.inf  # the last look: the process ran then, so no pause before it is counted again
        self._lists_own = False  # the last listing held an event of this VM's: armed however long the poll takes
        self._throttled = cgroup_throttled() if throttled is None else throttled
        # /proc/stat costs more than a tick should: read when armed, at each poll (``listed``) and after a pause
        self._steal = steal_time if steal is None else steal
        self._steal_at: float | None = None
        self._lock = threading.Lock()
        self._due: float | None = None  # armed: when a thread is next due to have looked; None: idle
        self._armed_until = -math.inf
        self._records: Mapping[str, EventRecord] = {}  # listed at the last poll: a pause belongs to one of them
        self._vm_name: str | None = None
        self._throttled_at = self._throttled()
        self._found: deque[Pause] = deque(maxlen=HELD)
        self._wake = threading.Event()
        self._closed = False

    @property
    def armed(self) -> bool:
        return self._due is not None

    def listed(self, records: Mapping[str, EventRecord], vm_name: str | None, now: float) -> None:
        """What the poll loop read at ``now`` (monotonic): arms the detector while an event of this VM's is listed."""
        with self._lock:
            if records is not self._records or vm_name != self._vm_name:  # a new document: most polls bring none
                self._records, self._vm_name = records, vm_name
                self._lists_own = pause.arms(records.values(), vm_name)
            if self._lists_own:
                self._armed_until = now + pause.ARMED_FOR
                if self._due is None:
                    self._due = now + pause.TICK
                    self._wake.set()
            if self._due is not None:
                self._steal_at = self._steal()

    def check(self, now: float) -> None:
        """Armed: a pause if no thread has looked since it was due (any thread that runs may call this)."""
        with self._lock:
            if self._due is None:
                return
            late = pause.late_by(max(self._due, self._looked), now, pause.ARMED_MIN)
            self._due = now + pause.TICK if self._lists_own or now <= self._armed_until else None
            self._note(now, late)

    def overslept(self, due: float, now: float) -> None:
        """Idle: the poll loop's wait that was to end at ``due`` ended at ``now``; a pause when a second late."""
        with self._lock:
            if self._due is None:
                self._note(now, pause.late_by(max(due, self._looked), now, pause.IDLE_MIN))

    def take(self, now: float) -> list[Pause]:
        """The pauses found since the last call, the one ending now included (the poll loop's, at each poll)."""
        self.check(now)
        with self._lock:
            found = list(self._found)
            self._found.clear()
        return found

    def _note(self, now: float, late: float | None) -> None:
        """Under the lock: a pause of ``late`` seconds (None: none) counted and held for ``take``, unless this
        process itself used CPU for half of it or more (its own work kept the looking thread from running)."""
        reading, cpu = self._throttled(), self._cpu()
        burnt, self._cpu_at, self._looked = cpu - self._cpu_at, cpu, now
        if late is None or burnt >= BUSY_SHARE * late:
            self._throttled_at = reading
            return
        grew = None if reading is None or self._throttled_at is None else reading - self._throttled_at
        self._throttled_at = reading
        stolen, self._steal_at = self._steal_at, self._steal()
        steal = None if stolen is None or self._steal_at is None else max(0.0, self._steal_at - stolen)
        found = pause.felt(now, late, self._records.values(), self._vm_name, grew, steal)
        if found.throttled:
            self._metrics.throttled_pauses.inc()
        else:
            self._metrics.pauses.labels(found.event_type).observe(found.seconds)
        self._found.append(found)

    def run(self, stop: threading.Event) -> None:
        """The detector's thread: a look every ``TICK`` while armed, asleep (no timeout) while idle."""
        while not stop.is_set() and not self._closed:
            if self._due is None:
                self._wake.wait()
                self._wake.clear()
                continue
            stop.wait(pause.TICK)
            try:
                self.check(self._monotonic())
            except Exception:  # a bug must not end the looks: the poll loop's would then all be a second late
                log.exception("unexpected error in the pause detector")

    def close(self) -> None:
        self._closed = True
        self._wake.set()


def cgroup_throttled(root: Path = Path("/sys/fs/cgroup")) -> Callable[[], float | None]:
    """A reader of this process's cgroup's throttled CPU seconds, or one that says None: on Windows, without cgroup
    v2, or with no CPU limit (nothing can throttle it, so nothing is read every tick)."""
    if sys.platform == "win32":
        return lambda: None
    try:
        line = Path("/proc/self/cgroup").read_text().splitlines()[0]
        group = root / line.partition("::")[2].lstrip("/")
        if not line.startswith("0::") or (group / "cpu.max").read_text().split()[0] == "max":
            return lambda: None
        fd = os.open(group / "cpu.stat", os.O_RDONLY)
    except (OSError, IndexError):
        return lambda: None

    def read() -> float | None:
        try:
            for row in os.pread(fd, 4096, 0).split(b"\n"):
                if row.startswith(b"throttled_usec "):
                    return int(row.split()[1]) / 1e6
        except (OSError, ValueError):
            pass
        return None

    return read


def steal_time(path: str = "/proc/stat") -> float | None:
    """The steal time the kernel reports (``/proc/stat``'s eighth ``cpu`` column: what the hypervisor ran instead
    of this VM), in seconds per CPU; None where there is none to read (Windows, or no such column)."""
    if sys.platform == "win32":
        return None
    try:
        with open(path, "rb") as stat:
            columns = stat.readline().split()
        ticks: int = os.sysconf("SC_CLK_TCK")
        return int(columns[8]) / ticks / (os.cpu_count() or 1)
    except (OSError, ValueError, IndexError):
        return None
