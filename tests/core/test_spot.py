"""A Preempt linked to the SpotRebalanceRecommendation before it, whatever the wall clock does meanwhile."""

from __future__ import annotations

import json
from collections.abc import Mapping

from se_exporter.core import spot
from se_exporter.core.lifecycle import EventRecord, diff
from se_exporter.core.model import Document, parse_document


def doc(incarnation: int, *events: Mapping[str, object]) -> Document:
    return parse_document(json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}).encode())


def event(event_id: str, event_type: str) -> dict[str, object]:
    return {"EventId": event_id, "EventType": event_type, "EventStatus": "Scheduled", "ResourceType": "VirtualMachine",
            "Resources": ["spot-1"], "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT", "Description": "",
            "EventSource": "Platform", "DurationInSeconds": -1}


def linked(steps: list[tuple[float, float, Document]]) -> tuple[dict[str, EventRecord], ...]:
    """Each step's links, the diff fed (wall clock, monotonic clock, document)."""
    records: Mapping[str, EventRecord] = {}
    ended: Mapping[str, EventRecord] = {}
    found = []
    for now, elapsed, document in steps:
        step = diff(records, document, now, ended, elapsed=elapsed)
        found.append(spot.links(step.transitions, step.records, step.ended))
        records, ended = step.records, step.ended
    return tuple(found)


def test_a_wall_clock_stepped_back_keeps_a_preempt_linked_to_its_recommendation() -> None:
    """The wall clock stepped back ten minutes between the recommendation and the Preempt (38 s apart on the
    monotonic clock): the Preempt is still linked, with a lead of 38 s."""
    rec, preempt = event("R1", "SpotRebalanceRecommendation"), event("P1", "Preempt")
    links = linked([(10_000.0, 500.0, doc(1, rec)), (10_000.0 - 600 + 38, 538.0, doc(2, rec, preempt))])
    ((key, recommendation),) = links[1].items()
    assert (key, recommendation.event.event_id) == ("p1", "R1")
    (preempt_record,) = [r for r in diff({}, doc(1, preempt), 0.0, elapsed=538.0).records.values()]
    assert spot.lead_seconds(preempt_record, recommendation) == 38.0


def test_a_wall_clock_stepped_forward_keeps_the_link_window_on_the_monotonic_clock() -> None:
    """A two-day step forward of the wall clock between them is no two days of lead: still within the window."""
    rec, preempt = event("R1", "SpotRebalanceRecommendation"), event("P1", "Preempt")
    links = linked([(10_000.0, 500.0, doc(1, rec)), (10_000.0 + 2 * 86_400, 530.0, doc(2, rec, preempt))])
    assert [r.event.event_id for r in links[1].values()] == ["R1"]


def test_a_recommendation_seen_after_the_preempt_is_not_the_one_it_follows() -> None:
    """Seen 10 s after the Preempt on the monotonic clock, a recommendation is not the one it follows, though the
    wall clock (stepped back meanwhile) puts it a thousand seconds before."""
    (preempt,) = diff({}, doc(1, event("P1", "Preempt")), 10_000.0, elapsed=500.0).records.values()
    (rec,) = diff({}, doc(1, event("R1", "SpotRebalanceRecommendation")), 9_000.0, elapsed=510.0).records.values()
    assert spot.recommendation_before(preempt, [rec]) is None
    (earlier,) = diff({}, doc(1, event("R0", "SpotRebalanceRecommendation")), 11_000.0, elapsed=490.0).records.values()
    assert spot.recommendation_before(preempt, [rec, earlier]) is earlier
