"""Counters and histograms whose series appear only once used, and show 0 for a while before their first count.

A series costs money on every VM of a fleet, every scrape, so a label set nobody has counted yet (a transition of
an event type this VM never saw, a poll outcome that never happened) is not exported at all. But a counter that
appears already at 1 is missed by ``increase()`` and ``rate()``: Prometheus has no sample before it to take the
difference from. So a label set, when first used, is shown at 0 for ``hold`` seconds while the real child counts
behind it, then shown as it is. Every scraper whose interval is at most ``hold`` takes at least one sample of the 0
in that window (a window as long as the interval holds a scrape of each), however many Prometheus servers scrape
(an HA pair each sees its own 0), and the first count is late by at most ``hold``; later counts are not late.
The hold costs nothing once it is over: a family with no label set in its hold is yielded as prometheus-client
builds it.

A family with no series is not yielded at all (its HELP and TYPE lines are bytes too); ``describe`` still names
every family, so the registry finds them for ``/metrics?name[]=...``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class HeldFamilies(Collector):
    """The held families of one registry. ``hold`` is the longest interval anything scrapes at (0: no hold)."""

    def __init__(self, hold: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold = hold
        self._clock = clock
        self._families: list[Held] = []

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Held:
        return self._add(Counter(name, documentation, labels, registry=None), labels)

    def histogram(self, name: str, documentation: str, buckets: Sequence[float], labels: Sequence[str] = ()) -> Held:
        return self._add(Histogram(name, documentation, labels, buckets=buckets, registry=None), labels)

    def _add(self, metric: Counter | Histogram, labels: Sequence[str]) -> Held:
        held = Held(metric, tuple(labels), self)
        self._families.append(held)
        return held

    def now(self) -> float:
        return self._clock()

    def describe(self) -> list[Metric]:
        return [family for held in self._families for family in held.metric.describe()]

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        for held in self._families:
            yield from held.collect(now, self.hold)

    def counted(self) -> Iterator[Metric]:
        """What has been counted, no hold applied: for a person (the demo's summary), not for a scraper."""
        for held in self._families:
            yield from held.collect(0.0, 0.0)


class Held:
    """One counter or histogram: ``labels(...)`` as prometheus-client's (its child, to ``inc`` or ``observe``), but
    the label set is born, and held at 0, from its first ``labels`` call; unlabelled, ``inc`` and ``observe``."""

    def __init__(self, metric: Counter | Histogram, names: tuple[str, ...], families: HeldFamilies) -> None:
        self.metric = metric
        self._families = families
        self._names = names
        self._born: dict[tuple[str, ...], float] = {}  # label values -> when first used (the families' clock)
        self._holding = False  # some label set may still be in its hold: collect looks
        self._lock = threading.Lock()

    def labels(self, *values: str) -> Any:
        """The child of these label values (prometheus-client's ``Counter`` or ``Histogram`` child)."""
        key = tuple(str(value) for value in values)
        if key not in self._born:
            with self._lock:
                if key not in self._born:
                    self._born[key] = self._families.now()
                    self._holding = self._families.hold > 0
        return self.metric.labels(*values) if values else self.metric

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def observe(self, value: float) -> None:
        self.labels().observe(value)

    def collect(self, now: float, hold: float) -> Iterator[Metric]:
        """The family, each label set born less than ``hold`` before ``now`` shown at 0."""
        with self._lock:
            if not self._born:
                return
            held = {key for key, at in self._born.items() if now - at < hold} if self._holding and hold else set()
            if not held and hold:
                self._holding = False
        for family in self.metric.collect():
            if not held or not family.samples:
                yield family
                continue
            copy = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                value = 0.0 if self._key(sample.labels) in held and not sample.name.endswith("_created") \
                    else sample.value
                copy.add_sample(sample.name, sample.labels, value, sample.timestamp, sample.exemplar)
            yield copy

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        return tuple(labels[name] for name in self._names)
