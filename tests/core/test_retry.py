"""The shared backoff and log-once-per-health-change helpers."""

from __future__ import annotations

import random
import statistics

from se_exporter.core.retry import Health, backoff, spread


def test_backoff_is_drawn_between_the_first_wait_and_a_ceiling_doubling_to_the_cap() -> None:
    """The n-th wait lies between the first wait and first * 2**n (the cap at most), and the draws cover that range."""
    rng = random.Random(20240709)
    for failures, ceiling in [(1, 1.0), (2, 2.0), (3, 3.0), (4, 3.0), (30, 3.0)]:
        waits = [backoff(failures, 0.5, 3.0, rng) for _ in range(500)]
        assert all(0.5 <= wait <= ceiling for wait in waits)
        assert max(waits) - min(waits) > 0.8 * (ceiling - 0.5)  # spread over the range, not bunched
        assert abs(statistics.mean(waits) - (0.5 + ceiling) / 2) < 0.1 * ceiling


def test_two_processes_failing_together_do_not_retry_together() -> None:
    """Two clients that failed at the same moments draw different waits: their retries drift apart instead of
    arriving in lock-step (the spread of the n-th retry's time grows with n)."""
    one, other = random.Random(1), random.Random(2)
    at_one = at_other = 0.0
    apart = []
    for failures in range(1, 11):
        at_one += backoff(failures, 1.0, 30.0, one)
        at_other += backoff(failures, 1.0, 30.0, other)
        apart.append(abs(at_one - at_other))
    assert max(apart) > 5.0
    assert sum(gap < 0.1 for gap in apart) <= 1


def test_backoff_after_very_many_failures_stays_within_the_cap() -> None:
    """A peer down for days (thousands of failures) still waits between the first wait and the cap, no overflow."""
    rng = random.Random(7)
    assert all(1.0 <= backoff(100_000, 1.0, 30.0, rng) <= 30.0 for _ in range(100))


def test_a_cap_below_the_first_wait_is_the_wait() -> None:
    """A cap shorter than the first wait wins (it is the longest wait a caller allows)."""
    assert backoff(1, 5.0, 2.0, random.Random(3)) == 2.0


def test_spread_draws_a_schedule_of_its_own_per_client() -> None:
    """An SDK's retry factor is drawn between half and one and a half times the default, a different one each time."""
    rng = random.Random(11)
    factors = [spread(0.8, rng) for _ in range(200)]
    assert all(0.4 <= factor <= 1.2 for factor in factors)
    assert len(set(factors)) == 200 and max(factors) - min(factors) > 0.6


def test_health_reports_only_changes() -> None:
    """A failure is news once per reason, a recovery once per failure; repeats are not."""
    health = Health()
    assert health.recover() is False
    assert [health.fail("timeout"), health.fail("timeout"), health.fail("auth")] == [True, False, True]
    assert health.failing == "auth"
    assert [health.recover(), health.recover()] == [True, False]
    assert health.failing is None
