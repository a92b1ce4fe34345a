"""Survivors of a full collection frozen, everything thawed now and then (``infra.generations``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from se_exporter.infra.generations import FreezeSurvivors


class Node:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def no_frozen() -> Iterator[None]:
    """The test starts and ends with nothing frozen, and its policy removed (the suite's own objects thawed)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_what_survives_a_full_collection_is_frozen_and_thawed_once_due(no_frozen: None) -> None:
    """Only the end of a full collection acts: it freezes, or thaws everything once ``thaw_every`` has passed since
    the last thaw (and then freezes again at the next one)."""
    calls: list[str] = []
    now = [0.0]
    policy = FreezeSurvivors(thaw_every=600, clock=lambda: now[0], freeze=lambda: calls.append("freeze"),
                             unfreeze=lambda: calls.append("unfreeze"))
    for phase, generation in (("start", 2), ("stop", 0), ("stop", 1)):
        policy(phase, {"generation": generation})
    assert calls == []
    policy("stop", {"generation": 2})
    now[0] = 599.0
    policy("stop", {"generation": 2})
    now[0] = 600.0
    policy("stop", {"generation": 2})
    policy("stop", {"generation": 2})
    assert calls == ["freeze", "freeze", "unfreeze", "freeze"]


def test_a_cycle_frozen_while_alive_is_collected_after_the_next_thaw(no_frozen: None) -> None:
    """With the real collector: a cycle alive at a full collection is frozen; dropped, it outlives later collections
    until everything is thawed, and the full collection after that frees it. A cycle dropped before a full
    collection is freed by it as ever."""
    now = [0.0]
    policy = FreezeSurvivors(thaw_every=600, clock=lambda: now[0]).install()
    try:
        kept, dropped = Node(), Node()
        kept_ref, dropped_ref = weakref.ref(kept), weakref.ref(dropped)
        del dropped
        gc.collect()  # frees the dropped cycle, freezes the kept one
        assert dropped_ref() is None and gc.get_freeze_count() > 0
        del kept
        gc.collect()
        assert kept_ref() is not None  # frozen: not walked
        now[0] = 600.0
        gc.collect()  # thaws everything at its end
        assert gc.get_freeze_count() == 0 and kept_ref() is not None
        gc.collect()
        assert kept_ref() is None
    finally:
        policy.remove()
