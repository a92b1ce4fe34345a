"""The helper that walks a scenario for integration tests waits for the sidecar's first read before changing it."""

from __future__ import annotations

import time

from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.server import Simulator
from tests.support.helpers import step_through


class LateFirstPoll:
    """Stands for a sidecar on a busy machine: its metrics answer at once, its first poll comes three scrapes
    later; from then on it reads the simulator's document at every scrape."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.scrapes = 0
        self.read: list[int] = []

    def value(self, name: str) -> float | None:
        assert name == "azure_scheduled_events_document_incarnation"
        self.scrapes += 1
        if self.scrapes > 3:
            self.read.append(int(self.sim.document()["DocumentIncarnation"]))
        return float(self.read[-1]) if self.read else None


def test_a_late_first_poll_still_reads_the_first_document() -> None:
    """Every document of the scenario is read, the first one too, when the sidecar's first poll comes late."""
    now = time.time()
    sim = Simulator(scenarios.load("live-migration"), clock=lambda: now)
    sidecar = LateFirstPoll(sim)

    step_through(sim, sidecar)  # type: ignore[arg-type]  # what step_through reads of a Sidecar: value()

    assert list(dict.fromkeys(sidecar.read)) == [1, 2, 3, 4]
