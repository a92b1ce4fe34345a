"""The shared backoff and log-once-per-health-change helpers."""

from __future__ import annotations

from se_exporter.core.retry import Health, backoff


def test_backoff_doubles_from_the_first_wait_up_to_the_cap() -> None:
    """Consecutive failures wait first, twice that, four times that, ..., never more than the cap."""
    assert [backoff(n, 0.5, 3.0) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_backoff_after_very_many_failures_is_the_cap() -> None:
    """A peer down for days (thousands of failures) still gets the cap, not an overflow."""
    assert backoff(100_000, 1.0, 30.0) == 30.0


def test_health_reports_only_changes() -> None:
    """A failure is news once per reason, a recovery once per failure; repeats are not."""
    health = Health()
    assert health.recover() is False
    assert [health.fail("timeout"), health.fail("timeout"), health.fail("auth")] == [True, False, True]
    assert health.failing == "auth"
    assert [health.recover(), health.recover()] == [True, False]
    assert health.failing is None
