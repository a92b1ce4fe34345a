"""Since when the sidecar has watched IMDS with no gap that could hide an event's announcement.

The rules page ``SeExporterHostFailure`` for an event first seen Started only when the sidecar had been watching
(``azure_scheduled_events_watching_since_timestamp_seconds``); anything it cannot vouch for warns instead. So every
doubt here starts a new watch: a new watch costs at most ``hostFailureWatchedSeconds`` (60 s) of warnings where a
host failure would have paged, while a watch wrongly continued pages for maintenance announced and started unseen.

A watch continues from one successful read to the next only when the two are at most the allowed gap apart on both
clocks, and the wall clock did not go back between them. The previous read may be this process's or, after a
restart, the one the state file recorded (``lifecycle_store``): the same rule measures a gap in the reads and the
time a sidecar was not running. The wall clock is the only clock that survives a reboot, and it can step; the
monotonic reading is kept beside it because within one boot it cannot step (``time.monotonic`` counts from boot, for
every process, on Linux and Windows): a restart in the same boot whose wall clock went back by about its own downtime
is still caught. A monotonic reading below the saved one means the machine restarted since: it says nothing then.
"""

from __future__ import annotations

from dataclasses import dataclass

# The longest allowed gap whatever the settings: a Terminate's shortest notice (5 minutes; Reboot and Redeploy give
# 10 to 15), so no platform event that is not approved early can be announced and started inside a gap.
WATCH_GAP_CEILING = 300.0
# Within that, a gap of this many polls (a minute at the default 1 s: a pod restart's usual pause) or of two of the
# longest waits after failed polls (a short IMDS outage), whichever is longer, keeps the watch.
WATCH_GAP_POLLS = 60


def allowed_gap(poll_interval: float, max_wait: float) -> float:
    """The longest time between two successful reads that keeps the watch (``max_wait``: the longest wait between
    polls, ``Settings.effective_max_backoff``)."""
    return min(WATCH_GAP_CEILING, max(WATCH_GAP_POLLS * poll_interval, 2 * max_wait))


@dataclass(frozen=True)
class Read:
    """When a successful read happened, on the wall clock and on the monotonic clock (None: not known)."""

    wall: float
    monotonic: float | None = None


def watching_since(since: float | None, last: Read | None, now: Read, gap: float) -> float:
    """The start of the watch after a successful read at ``now``: ``since`` when it continues from the read ``last``,
    else ``now.wall`` (a new watch). It is never after ``now.wall``."""
    if since is None or last is None:
        return now.wall
    wall = now.wall - last.wall
    if wall < 0 or wall > gap:  # the wall clock went back, or the reads are too far apart
        return now.wall
    if last.monotonic is not None and now.monotonic is not None and now.monotonic - last.monotonic > gap:
        return now.wall  # the same boot, and further apart than the wall clock says: it was stepped back
    if since > last.wall:  # a watch that began after the read it continues: written by a clock since stepped back
        return now.wall
    return since
