"""The one clock and the approvals every simulated VM of a scenario shares, and its platform copy reads.

A scenario of several VMs (``vms``) is one place in Azure: its VMs see the same events at the same moments, an
approval from any of them starts the event for all (as Azure's ``StartRequests`` does for a set), and the platform
stream tells of the same changes. So time and approvals live here, once, and every ``Simulator`` (one per VM) and
the ``PlatformCopy`` take them from here.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

from se_exporter.simulator.scenario import Scenario

MAX_SCENARIO_TIME = 100 * 365 * 86400  # seconds: a century of scenario, far below a date overflow (year 9999)


class Timeline:
    """Scenario time (elapsed time times ``speed``, plus jumps) and approvals; thread-safe.

    Scenario time counts on ``monotonic``, and ``clock`` (the wall clock) only says when a scenario second is as a
    timestamp (NotBefore, a token's expiry): a wall clock stepped back must not send a scenario back, nor one stepped
    forward end its events early. ``monotonic`` None: the monotonic clock, or ``clock`` itself when a test passes one
    (a test's clock is both)."""

    def __init__(self, scenario: Scenario, speed: float = 1.0, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] | None = None) -> None:
        self.scenario = scenario
        self.speed = speed
        self.clock = clock
        self.monotonic = monotonic or (time.monotonic if clock is time.time else clock)
        self._start = self.monotonic()
        self._offset = 0.0
        self._lock = threading.Lock()
        self._approvals: dict[str, float] = {}

    def now(self) -> tuple[float, float]:
        """(wall time, scenario time) read together."""
        wall = self.clock()
        return wall, (self.monotonic() - self._start) * self.speed + self._offset

    def scenario_time(self) -> float:
        return self.now()[1]

    def wall_at(self, t: float, now: tuple[float, float] | None = None) -> float:
        """The wall time at which scenario second ``t`` is (was, or will be) reached, at the current speed."""
        wall, scenario = now or self.now()
        return wall + (t - scenario) / self.speed

    def advance(self, seconds: float) -> None:
        """Jump scenario time forward (tests, rehearsals). ValueError (and the clock unchanged) past
        ``MAX_SCENARIO_TIME``: two jumps of 1e308 s made it infinite, and every answer after that NaN."""
        with self._lock:
            if not math.isfinite(seconds) or self.scenario_time() + seconds > MAX_SCENARIO_TIME:
                raise ValueError(f"advancing {seconds:g} s would take scenario time past {MAX_SCENARIO_TIME} s "
                                 f"(100 years); it is at {self.scenario_time():.0f} s")
            self._offset += seconds

    def approvals(self) -> dict[str, float]:
        """A copy: EventId -> scenario second of its approval."""
        with self._lock:
            return dict(self._approvals)

    def approve(self, event_ids: Iterable[str], listed: Callable[[float, dict[str, float]], set[str]]) -> list[str]:
        """Approve events ``listed(t, approvals)`` shows; returns the unknown ids (nothing approved if any is)."""
        with self._lock:
            t = self.scenario_time()
            shown = listed(t, self._approvals)
            ids = list(event_ids)
            unknown = [event_id for event_id in ids if event_id not in shown]
            if not unknown:
                for event_id in ids:
                    self._approvals.setdefault(event_id, t)
            return unknown
