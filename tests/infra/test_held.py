"""Held families: a label set appears when first counted, at 0 for the hold, then as counted."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, generate_latest

from se_exporter.infra.held import HeldFamilies


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _registry(hold: float) -> tuple[CollectorRegistry, HeldFamilies, Clock]:
    clock = Clock()
    families = HeldFamilies(hold, clock)
    return CollectorRegistry(), families, clock


def test_nothing_is_exported_before_the_first_count() -> None:
    """A counter and a histogram nobody counted into have no series, not even HELP and TYPE lines."""
    registry, families, _ = _registry(30)
    families.counter("x_transitions", "Transitions.", ["event_type"])
    families.histogram("x_notice_seconds", "Notice.", [1, 10], ["event_type"])
    families.histogram("x_poll_seconds", "Polls.", [1])
    registry.register(families)
    assert generate_latest(registry) == b""


def test_a_first_count_is_shown_at_zero_for_the_hold_then_as_counted() -> None:
    """The first count of a label set shows 0 until the hold is over (so increase() has a sample before it),
    whatever was counted meanwhile; then the real values; a label set born later is held on its own."""
    registry, families, clock = _registry(30)
    counter = families.counter("x_transitions", "Transitions.", ["event_type"])
    histogram = families.histogram("x_notice_seconds", "Notice.", [1, 10], ["event_type"])
    registry.register(families)
    counter.labels("Freeze").inc()
    histogram.labels("Freeze").observe(5)
    get = registry.get_sample_value
    assert get("x_transitions_total", {"event_type": "Freeze"}) == 0.0
    assert get("x_notice_seconds_bucket", {"event_type": "Freeze", "le": "10.0"}) == 0.0
    assert get("x_notice_seconds_count", {"event_type": "Freeze"}) == 0.0
    clock.now += 29.9
    counter.labels("Freeze").inc()
    assert get("x_transitions_total", {"event_type": "Freeze"}) == 0.0
    clock.now += 0.1
    counter.labels("Reboot").inc()
    assert get("x_transitions_total", {"event_type": "Freeze"}) == 2.0
    assert get("x_notice_seconds_bucket", {"event_type": "Freeze", "le": "10.0"}) == 1.0
    assert get("x_notice_seconds_sum", {"event_type": "Freeze"}) == 5.0
    assert get("x_transitions_total", {"event_type": "Reboot"}) == 0.0
    clock.now += 30
    assert get("x_transitions_total", {"event_type": "Reboot"}) == 1.0


def test_an_unlabelled_histogram_appears_with_its_first_observation() -> None:
    """An unlabelled family is one label set: absent, then held at 0, then as observed."""
    registry, families, clock = _registry(10)
    polls = families.histogram("x_poll_seconds", "Polls.", [1])
    registry.register(families)
    assert registry.get_sample_value("x_poll_seconds_count") is None
    polls.observe(0.5)
    assert registry.get_sample_value("x_poll_seconds_count") == 0.0
    clock.now += 10
    assert registry.get_sample_value("x_poll_seconds_count") == 1.0


def test_what_was_counted_is_read_apart_from_the_hold() -> None:
    """``counted`` (the demo's summary) shows the counts at once, and leaves the hold of the scrapes as it was."""
    registry, families, clock = _registry(30)
    counter = families.counter("x_polls", "Polls.", ["outcome"])
    registry.register(families)
    counter.labels("ok").inc(3)
    assert [sample.value for family in families.counted() for sample in family.samples
            if sample.name == "x_polls_total"] == [3.0]
    assert registry.get_sample_value("x_polls_total", {"outcome": "ok"}) == 0.0
    clock.now += 30
    assert registry.get_sample_value("x_polls_total", {"outcome": "ok"}) == 3.0


def test_no_hold_shows_counts_at_once() -> None:
    """A hold of 0: a first count is shown as it is (and missed by increase(), as a plain counter's would be)."""
    registry, families, _ = _registry(0)
    counter = families.counter("x_polls", "Polls.", ["outcome"])
    registry.register(families)
    counter.labels("timeout").inc()
    assert registry.get_sample_value("x_polls_total", {"outcome": "timeout"}) == 1.0


def test_describe_names_every_family_so_the_name_filter_finds_it() -> None:
    """The registry's ``name[]`` filter finds a held family by each of its series names, counted or not."""
    registry, families, clock = _registry(5)
    families.histogram("x_poll_seconds", "Polls.", [1]).observe(0.5)
    families.counter("x_errors", "Errors.", ["sink"])
    registry.register(families)
    clock.now += 5
    only = generate_latest(registry.restricted_registry(["x_poll_seconds_count"])).decode()
    assert only.splitlines()[-1] == "x_poll_seconds_count 1.0"
    assert {family.name for family in families.describe()} == {"x_poll_seconds", "x_errors"}


def test_counts_from_many_threads_are_all_shown_after_the_hold() -> None:
    """Label sets born from several threads at once are each held and none is lost."""
    registry, families, clock = _registry(5)
    counter = families.counter("x_transitions", "Transitions.", ["n"])
    registry.register(families)

    def count(n: int) -> None:
        for _ in range(100):
            counter.labels(str(n)).inc()

    threads = [threading.Thread(target=count, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {registry.get_sample_value("x_transitions_total", {"n": str(n)}) for n in range(8)} == {0.0}
    clock.now += 5
    assert {registry.get_sample_value("x_transitions_total", {"n": str(n)}) for n in range(8)} == {100.0}
