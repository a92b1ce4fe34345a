"""Two decisions every loop that talks to a peer makes: how long to wait after failures, and when to say so.

Used by every retry loop of every program (the poll loop and the identity watcher against IMDS, the batching
processor behind the sidecar's outputs and the simulator's Event Hubs copy, the fleet's storage and partition-count
loops), so that each waits and logs the same way: a wait that grows to a cap, jittered, and one log line when a peer
starts failing (or fails in a new way) and one when it recovers, never one per attempt.

The jitter is why a fleet survives its own peers' outages: thousands of sidecars that lost one Event Hubs namespace
at the same moment would otherwise retry at the same moments for ever, and meet it together when it comes back
(AWS's "Exponential Backoff and Jitter"). Each wait is drawn between the first wait and a ceiling that doubles with
each failure up to the cap ("full jitter" above a floor): never sooner than the first wait, so a failing peer is
asked no more often than a healthy one.
"""

from __future__ import annotations

import random

_RANDOM = random.Random()  # noqa: S311 - waits, not secrets; seeded from the OS: every process draws its own


def backoff(failures: int, first: float, cap: float, rng: random.Random = _RANDOM) -> float:
    """The wait after ``failures`` consecutive failures (1 or more): drawn uniformly between ``first`` and
    ``first * 2**failures``, that ceiling at most ``cap`` (a cap below ``first`` is the wait). ``rng``: tests pass
    a seeded one."""
    ceiling = min(first * 2.0 ** min(max(failures, 1), 32), cap)  # the exponent is bounded: 2.0**1024 overflows
    return rng.uniform(min(first, ceiling), ceiling)


def spread(value: float, rng: random.Random = _RANDOM) -> float:
    """``value`` drawn anew between half and one and a half times itself: for a client whose own retries cannot
    jitter (the Event Hubs SDK's ``retry_backoff_factor``), so that no two processes share one schedule."""
    return rng.uniform(value / 2, value * 1.5)


class Health:
    """A peer's health as far as the log is concerned: ``failing`` is the reason of the current failure, or None."""

    def __init__(self) -> None:
        self.failing: str | None = None

    def fail(self, reason: str) -> bool:
        """Record a failure; True when it is news (the first failure, or a new reason): log it then."""
        news = reason != self.failing
        self.failing = reason
        return news

    def recover(self) -> bool:
        """Record a success; True when it ends a failure: log the recovery then."""
        ended = self.failing is not None
        self.failing = None
        return ended
