"""The watch rule (core/watch.py) on its own: when a successful read continues the watch, and that a doubt about
either clock always starts a new one, never a watch that begins after the read."""

from __future__ import annotations

import pytest

from se_exporter.core.watch import WATCH_GAP_CEILING, Read, allowed_gap, watching_since

GAP = 60.0
LAST = Read(1000.0, 50.0)


@pytest.mark.parametrize(("now", "expected"), [
    (Read(1060.0, 110.0), 400.0),  # exactly the gap on both clocks: continued
    (Read(1060.5, 110.0), 1060.5),  # the wall clock says a little more
    (Read(1001.0, 111.0), 1001.0),  # the monotonic clock says more: the wall clock went back about the downtime
    (Read(999.0, 51.0), 999.0),  # the wall clock went back
    (Read(1030.0, 20.0), 400.0),  # the monotonic clock counts again from boot: the wall clock decides
    (Read(1030.0, None), 400.0),  # no monotonic reading
])
def test_a_read_continues_the_watch_only_within_the_gap_on_both_clocks(now: Read, expected: float) -> None:
    assert watching_since(400.0, LAST, now, GAP) == expected


def test_no_watch_or_no_last_read_starts_one_and_none_begins_after_its_read() -> None:
    now = Read(1010.0, 60.0)
    assert watching_since(None, LAST, now, GAP) == 1010.0
    assert watching_since(400.0, None, now, GAP) == 1010.0
    assert watching_since(1005.0, LAST, now, GAP) == 1010.0  # began after the read it continues from


@pytest.mark.parametrize(("poll", "wait", "gap"), [(1.0, 5.0, 60.0), (0.05, 0.2, 3.0), (0.05, 5.0, 10.0),
                                                   (10.0, 10.0, WATCH_GAP_CEILING), (1.0, 3600.0, WATCH_GAP_CEILING)])
def test_the_allowed_gap(poll: float, wait: float, gap: float) -> None:
    assert allowed_gap(poll, wait) == gap
