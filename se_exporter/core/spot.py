"""A ``Preempt`` linked to the ``SpotRebalanceRecommendation`` that came before it on the same VM.

IMDS does not say which recommendation a Preempt follows, so they are linked by VM and time: the rule, and why the
warning between them is the figure Spot users need, is docs/events.md's ("SpotRebalanceRecommendation's
lifecycle"). Pure: records in, links out. The lead is measured on the monotonic clock (``EventRecord``'s
``first_seen_elapsed``): a wall clock stepped back between the two first sightings must not unlink them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from se_exporter.core.lifecycle import SCHEDULED, STARTED, EventRecord, Transition
from se_exporter.core.model import PREEMPT, SPOT_REBALANCE

# A day: Azure documents no bound; a recommendation older than that says little about today's eviction.
LINK_WINDOW_SECONDS = 86400.0


def _same_vm(one: EventRecord, other: EventRecord) -> bool:
    if not one.event.resources or not other.event.resources:
        return True
    names = {name.lstrip("_").casefold() for name in one.event.resources}
    return any(name.lstrip("_").casefold() in names for name in other.event.resources)


def lead_seconds(preempt: EventRecord, recommendation: EventRecord) -> float | None:
    """Recommendation first seen -> Preempt first seen, on the monotonic clock; None when either reading is unknown."""
    if preempt.first_seen_elapsed is None or recommendation.first_seen_elapsed is None:
        return None
    return preempt.first_seen_elapsed - recommendation.first_seen_elapsed


def recommendation_before(preempt: EventRecord, candidates: Iterable[EventRecord]) -> EventRecord | None:
    """The recommendation ``preempt`` follows, or None (see the module docstring)."""
    best: tuple[float, EventRecord] | None = None
    for record in candidates:
        if record.event.event_type != SPOT_REBALANCE:
            continue
        lead = lead_seconds(preempt, record)
        if lead is not None and 0 <= lead <= LINK_WINDOW_SECONDS and _same_vm(preempt, record) \
                and (best is None or lead < best[0]):
            best = (lead, record)
    return None if best is None else best[1]


def links(transitions: Iterable[Transition], records: Mapping[str, EventRecord],
          ended: Mapping[str, EventRecord]) -> dict[str, EventRecord]:
    """For each Preempt first seen in ``transitions``: its key -> the recommendation it follows (open or ended)."""
    found: dict[str, EventRecord] = {}
    for transition in transitions:
        record = transition.record
        if record.event.event_type != PREEMPT or transition.kind not in (SCHEDULED, STARTED) \
                or (transition.kind == STARTED and record.started_at != record.first_seen):
            continue
        before = recommendation_before(record, (*records.values(), *ended.values()))
        if before is not None:
            found[record.event.key] = before
    return found
