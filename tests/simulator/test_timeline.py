"""Scenario time counts on the monotonic clock; the wall clock only dates it."""

from __future__ import annotations

from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.timeline import Timeline


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_wall_clock_stepped_back_never_sends_a_scenario_back() -> None:
    """Ten seconds on, with the wall clock stepped back an hour: the scenario is ten seconds on, and its seconds are
    dated by the wall clock as it reads now."""
    wall, elapsed = Clock(1_800_000_000.0), Clock(50.0)
    timeline = Timeline(scenarios.load("live-migration"), speed=2.0, clock=wall, monotonic=elapsed)
    wall.now -= 3600 - 10
    elapsed.now += 10
    assert timeline.now() == (1_800_000_000.0 - 3590, 20.0)
    assert timeline.wall_at(30.0) == 1_800_000_000.0 - 3590 + 5


def test_a_clock_given_alone_counts_scenario_time_too() -> None:
    """A test's one clock (a held simulator's) is both: scenario time stands while it does."""
    wall = Clock(1_000.0)
    timeline = Timeline(scenarios.load("live-migration"), clock=wall)
    wall.now += 7
    assert timeline.scenario_time() == 7.0
