"""Two decisions every loop that talks to a peer makes: how long to wait after failures, and when to say so.

Used by the poll loop (IMDS), the identity watcher and the batching processor (the sidecar's outputs, the
simulator's Event Hubs copy), so that each waits and logs the same way: a wait that doubles up to a cap, and one log
line when a peer starts failing (or fails in a new way) and one when it recovers, never one per attempt.
"""

from __future__ import annotations


def backoff(failures: int, first: float, cap: float) -> float:
    """The wait after ``failures`` consecutive failures (1 or more): ``first``, doubled each time, at most ``cap``."""
    return min(first * 2.0 ** min(max(failures, 1) - 1, 32), cap)  # the exponent is bounded: 2.0**1024 overflows


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
