"""Full garbage collections that walk what came since the last one, not everything a process holds.

A full collection walks every object the collector tracks. A fleet replica holds two per VM, each replaced at the
VM's next heartbeat and none of them in a reference cycle, so walking them all again is CPU spent for nothing
(``scripts/fleet_scale_bench.py``; docs/performance.md).

``FreezeSurvivors`` freezes what survives each full collection (``gc.freeze``): the next one walks only what came
later. Frozen objects are still freed by their reference counts (a VM's old state at its next heartbeat); only a
reference cycle among them waits, so every ``thaw_every`` seconds everything is thawed (``gc.unfreeze``) and the
next full collection walks it all once, and collects any such cycle.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

THAW_EVERY = 600.0  # seconds: at most this long a cycle among frozen objects waits to be collected
OLDEST = len(gc.get_threshold()) - 1  # the generation a full collection collects (2)


class FreezeSurvivors:
    """A ``gc.callbacks`` entry: after a full collection, freeze its survivors, or thaw everything when due."""

    def __init__(self, thaw_every: float = THAW_EVERY, clock: Callable[[], float] = time.monotonic,
                 freeze: Callable[[], None] = gc.freeze, unfreeze: Callable[[], None] = gc.unfreeze) -> None:
        self.thaw_every = thaw_every
        self._clock, self._freeze, self._unfreeze = clock, freeze, unfreeze
        self._thawed_at = clock()

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info.get("generation") != OLDEST:
            return
        now = self._clock()
        if now - self._thawed_at >= self.thaw_every:
            self._thawed_at = now
            self._unfreeze()  # walked by the next full collection
        else:
            self._freeze()

    def install(self) -> FreezeSurvivors:
        gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def freeze_from_now() -> FreezeSurvivors:
    """Freeze what the process holds now (what start-up made lives as long as it), and install the policy."""
    gc.freeze()
    return FreezeSurvivors().install()
