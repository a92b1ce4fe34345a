"""api-version choice, the types each version lists, documents of two versions as one timeline, events that skip
Scheduled, and a Preempt linked to the SpotRebalanceRecommendation before it."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from se_exporter.core import apiversion, spot
from se_exporter.core.apiversion import FALLBACK, NEWEST, RETRY_NEWEST_SECONDS, VersionChoice
from se_exporter.core.lifecycle import CANCELED, SCHEDULED, STARTED, EventRecord, diff
from se_exporter.core.model import EVENT_TYPES, Document, parse_document


def doc(incarnation: int, *events: Mapping[str, object]) -> Document:
    return parse_document(json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}).encode())


def event(event_id: str, event_type: str, status: str = "Scheduled", resources: tuple[str, ...] = ("spot-1",),
          source: str = "Platform") -> dict[str, object]:
    return {"EventId": event_id, "EventStatus": status, "EventType": event_type, "ResourceType": "VirtualMachine",
            "Resources": list(resources), "NotBefore": "" if status == "Started" else "Mon, 11 Apr 2022 22:26:58 GMT",
            "Description": "", "EventSource": source, "DurationInSeconds": -1}


def test_auto_asks_for_the_newest_version_first() -> None:
    """With auto, the first poll asks for 2024-07-09; a pinned version is asked for as given, whatever happens."""
    assert VersionChoice.from_setting("auto").to_ask(0.0) == NEWEST == "2024-07-09"
    pinned = VersionChoice.from_setting("2019-08-01")
    assert pinned.refused("2019-08-01", 5.0).to_ask(10.0 ** 9) == "2019-08-01"


def test_a_refusal_falls_back_and_the_newer_version_is_asked_for_again_an_hour_later() -> None:
    """After a refusal the fallback is asked for until RETRY_NEWEST_SECONDS have passed; then the newer version
    once, and, refused again, the fallback for another period."""
    choice = VersionChoice.from_setting("auto").refused(NEWEST, 100.0)
    assert (choice.in_use, choice.to_ask(100.0), choice.to_ask(100.0 + RETRY_NEWEST_SECONDS - 1)) == (
        FALLBACK, FALLBACK, FALLBACK)
    assert choice.to_ask(100.0 + RETRY_NEWEST_SECONDS) == NEWEST
    again = choice.refused(NEWEST, 100.0 + RETRY_NEWEST_SECONDS)
    assert again.to_ask(100.0 + RETRY_NEWEST_SECONDS + 1) == FALLBACK
    assert again.to_ask(100.0 + 2 * RETRY_NEWEST_SECONDS) == NEWEST


def test_an_answer_to_the_newer_version_makes_it_the_one_in_use() -> None:
    """A retry that IMDS answers switches back for good (no further retries needed)."""
    choice = VersionChoice.from_setting("auto").refused(NEWEST, 0.0).answered(NEWEST)
    assert (choice.in_use, choice.retry_at, choice.to_ask(10.0 ** 9)) == (NEWEST, None, NEWEST)


def test_an_outage_during_a_retry_postpones_it() -> None:
    """A retry that meets an outage keeps the fallback and is tried again a period later."""
    choice = VersionChoice.from_setting("auto").refused(NEWEST, 0.0).retry_failed(RETRY_NEWEST_SECONDS)
    assert choice.in_use == FALLBACK
    assert choice.to_ask(2 * RETRY_NEWEST_SECONDS - 1) == FALLBACK
    assert choice.to_ask(2 * RETRY_NEWEST_SECONDS) == NEWEST


@pytest.mark.parametrize(("status", "body", "refused"), [
    (404, b"", True),
    (404, b'{"error": "Not found"}', True),
    (400, b'{"error": "Bad request. api-version is invalid or was not specified in the request.", '
          b'"newest-versions": ["2020-07-01"]}', True),
    (400, b'{"error": "Bad request. Required metadata header not specified"}', False),
    (500, b"api-version", False),
    (503, b"", False),
    (429, b"", False),
    (403, b"", False),
])
def test_only_a_404_or_a_400_naming_the_api_version_is_a_version_answer(status: int, body: bytes,
                                                                        refused: bool) -> None:
    """5xx, 429 and other 400s are outages or other faults, not "this version is not served"."""
    assert apiversion.refuses_version(status, body) is refused


def test_which_version_lists_which_type() -> None:
    """SpotRebalanceRecommendation only under 2024-07-09; Preempt from 2017-11-01; every documented type has rows."""
    assert "SpotRebalanceRecommendation" in EVENT_TYPES
    assert apiversion.unlisted_types(FALLBACK) == {"SpotRebalanceRecommendation"}
    assert apiversion.unlisted_types(NEWEST) == frozenset()
    assert apiversion.unlisted_types("2017-08-01") == {"Preempt", "Terminate", "SpotRebalanceRecommendation"}


def test_documents_of_two_versions_diff_as_one_timeline() -> None:
    """Falling back to 2020-07-01 while a SpotRebalanceRecommendation is open makes no transition (it is kept, not
    canceled); events both versions list keep their records; reading 2024-07-09 again ends it for real."""
    rec, reboot = event("R1", "SpotRebalanceRecommendation"), event("B1", "Reboot")
    first = diff({}, doc(1, rec, reboot), 10.0, unlisted=apiversion.unlisted_types(NEWEST))
    assert [t.kind for t in first.transitions] == [SCHEDULED, SCHEDULED]
    fallback = diff(first.records, doc(1, reboot), 20.0, first.ended, apiversion.unlisted_types(FALLBACK))
    assert fallback.transitions == ()
    assert fallback.records == first.records
    back = diff(fallback.records, doc(2, reboot), 30.0, fallback.ended, apiversion.unlisted_types(NEWEST))
    assert [(t.kind, t.event.event_id, t.record.gone_at) for t in back.transitions] == [(CANCELED, "R1", 30.0)]


def test_an_event_that_skips_scheduled_is_one_started_transition_with_zero_notice() -> None:
    """An auto-approved user reboot listed Started at first sight: one transition, started, zero notice, marked
    as having had no Scheduled (not a missed one)."""
    step = diff({}, doc(1, event("U1", "Reboot", "Started", source="User")), 50.0)
    (transition,) = step.transitions
    assert (transition.kind, transition.record.notice_seconds, transition.record.skipped_scheduled) == (
        STARTED, 0.0, True)
    later = diff({}, doc(1, event("U2", "Reboot")), 50.0)
    started = diff(later.records, doc(2, event("U2", "Reboot", "Started")), 80.0, later.ended)
    assert (started.transitions[0].record.notice_seconds, started.transitions[0].record.skipped_scheduled) == (
        30.0, False)


def records_of(*steps: tuple[float, Document]) -> tuple[list[dict[str, EventRecord]], dict[str, EventRecord]]:
    """Run documents through the diff; each step's Preempt links, and the last step's records and ended."""
    records: Mapping[str, EventRecord] = {}
    ended: Mapping[str, EventRecord] = {}
    found = []
    for now, document in steps:
        step = diff(records, document, now, ended)
        found.append(spot.links(step.transitions, step.records, step.ended))
        records, ended = step.records, step.ended
    return found, {**records, **ended}


def test_a_preempt_is_linked_to_the_recommendation_before_it_on_the_same_vm() -> None:
    """The Preempt first seen 38 s after the recommendation is linked to it, once, even after the recommendation
    has gone; a Preempt of another VM, or before any recommendation, is not."""
    rec, preempt = event("R1", "SpotRebalanceRecommendation"), event("P1", "Preempt")
    other_vm = event("P2", "Preempt", resources=("spot-2",))
    links, _ = records_of((2.0, doc(1, rec)), (40.0, doc(2, rec, preempt, other_vm)),
                          (70.0, doc(3, {**preempt, "EventStatus": "Started", "NotBefore": ""})))
    assert [{key: (r.event.event_id, r.first_seen) for key, r in step.items()} for step in links] == [
        {}, {"p1": ("R1", 2.0)}, {}]
    gone_first, _ = records_of((2.0, doc(1, rec)), (20.0, doc(2)), (40.0, doc(3, preempt)))
    assert [r.event.event_id for r in gone_first[2].values()] == ["R1"]
    alone, _ = records_of((40.0, doc(1, preempt)))
    assert alone == [{}]


def test_the_latest_recommendation_within_the_window_is_the_one_linked() -> None:
    """Of two recommendations the later one is linked; one older than LINK_WINDOW_SECONDS is not."""
    old, new = event("R1", "SpotRebalanceRecommendation"), event("R2", "SpotRebalanceRecommendation")
    preempt = event("P1", "Preempt")
    links, _ = records_of((0.0, doc(1, old)), (100.0, doc(2, old, new)), (200.0, doc(3, old, new, preempt)))
    assert [r.event.event_id for r in links[2].values()] == ["R2"]
    late = spot.LINK_WINDOW_SECONDS + 1
    links, _ = records_of((0.0, doc(1, old)), (late, doc(2, old, preempt)))
    assert links[1] == {}
