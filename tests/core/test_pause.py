"""Whose pause it is, how late counts as a pause, and how pauses fold into the records."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from se_exporter.core import pause
from se_exporter.core.lifecycle import EventRecord, diff
from se_exporter.core.model import parse_document


def records(*events: Mapping[str, object]) -> Mapping[str, EventRecord]:
    document = parse_document(json.dumps({"DocumentIncarnation": 1, "Events": list(events)}).encode())
    return diff({}, document, 1000.0).records


def event(event_id: str, event_type: str = "Freeze", status: str = "Scheduled",
          resources: tuple[str, ...] = ("vm0",)) -> dict[str, object]:
    return {"EventId": event_id, "EventStatus": status, "EventType": event_type, "ResourceType": "VirtualMachine",
            "Resources": list(resources), "NotBefore": "" if status == "Started" else "Mon, 11 Apr 2022 22:26:58 GMT",
            "Description": "", "EventSource": "Platform", "DurationInSeconds": 5}


def test_a_started_event_owns_a_pause_before_a_scheduled_one_of_more_impact() -> None:
    listed = records(event("A", "Reboot"), event("B", "Freeze", "Started"))
    assert pause.felt(10.0, 2.0, listed.values(), "vm0") == pause.Pause(10.0, 2.0, "b", "Freeze")


def test_among_events_of_one_status_the_most_impactful_type_owns_it_whatever_the_order() -> None:
    for order in (("F", "T"), ("T", "F")):
        listed = records(*(event(name, {"F": "Freeze", "T": "Terminate"}[name]) for name in order))
        assert pause.owner(listed.values(), "vm0").event.event_id == "T"  # type: ignore[union-attr]


def test_a_neighbours_event_neither_owns_a_pause_nor_arms_the_detector() -> None:
    listed = records(event("N", resources=("vm1",)))
    assert pause.felt(10.0, 3.0, listed.values(), "vm0").event_type == pause.UNANNOUNCED
    assert not pause.arms(listed.values(), "vm0")
    assert pause.arms(records(event("U", resources=())).values(), "vm0")  # whose it is unknown: may be ours


def test_lateness_below_the_least_counted_is_no_pause() -> None:
    assert pause.late_by(100.0, 100.0 + pause.ARMED_MIN - 0.01, pause.ARMED_MIN) is None
    assert pause.late_by(100.0, 101.5, pause.IDLE_MIN) == pytest.approx(1.5)
    assert pause.late_by(100.0, 99.0, 0.0) is None  # a thread that woke early was not paused


@pytest.mark.parametrize(("grew", "throttled"), [(None, False), (0.2, False), (1.0, True)])
def test_a_pause_mostly_spent_throttled_is_throttling(grew: float | None, throttled: bool) -> None:
    assert pause.felt(10.0, 2.0, (), "vm0", grew).throttled is throttled


def test_fold_keeps_the_longest_and_the_total_of_each_events_pauses_only() -> None:
    listed = records(event("A", status="Started"), event("B"))
    folded = pause.fold(listed, [pause.Pause(5.0, 1.0, "a", "Freeze"), pause.Pause(9.0, 3.0, "a", "Freeze"),
                                 pause.Pause(9.5, 7.0, "a", "Freeze", throttled=True),
                                 pause.Pause(12.0, 4.0), pause.Pause(13.0, 2.0, "gone", "Reboot")])
    assert (folded["a"].longest_pause, folded["a"].paused_seconds) == (3.0, 4.0)
    assert (folded["b"].longest_pause, folded["b"].paused_seconds) == (0.0, 0.0)
    assert folded.keys() == listed.keys()


def test_a_records_pauses_survive_its_next_documents() -> None:
    """The lifecycle diff carries what was folded in: a record seen again (started) keeps its pauses."""
    listed = pause.fold(records(event("A")), [pause.Pause(5.0, 2.0, "a", "Freeze")])
    started = {"DocumentIncarnation": 2, "Events": [event("A", status="Started")]}
    document = parse_document(json.dumps(started).encode())
    step = diff(listed, document, 1010.0)
    assert step.records["a"].started_at == 1010.0
    assert step.records["a"].longest_pause == 2.0
    gone = diff(step.records, parse_document(b'{"DocumentIncarnation": 3, "Events": []}'), 1020.0)
    assert gone.transitions[0].record.longest_pause == 2.0
