"""The lifecycle diff over sequences of documents, including the docs' own example."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest

from se_exporter.lifecycle import (
    CANCELED,
    COMPLETED,
    RESCHEDULED,
    SCHEDULED,
    STARTED,
    EventRecord,
    Transition,
    diff,
)
from se_exporter.model import Document, parse_document


def doc(incarnation: int, *events: Mapping[str, object]) -> Document:
    return parse_document(json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}).encode())


def event(event_id: str = "E1", status: str = "Scheduled", not_before: str = "Mon, 11 Apr 2022 22:26:58 GMT",
          event_type: str = "Freeze") -> dict[str, object]:
    return {"EventId": event_id, "EventStatus": status, "EventType": event_type, "ResourceType": "VirtualMachine",
            "Resources": ["WestNO_0", "WestNO_1"], "NotBefore": "" if status == "Started" else not_before,
            "Description": "", "EventSource": "Platform", "DurationInSeconds": 5}


def run(documents: Sequence[tuple[float, Document]]) -> tuple[
        list[tuple[float, Transition]], Mapping[str, EventRecord]]:
    records: Mapping[str, EventRecord] = {}
    seen: list[tuple[float, Transition]] = []
    for now, document in documents:
        step = diff(records, document, now)
        records = step.records
        seen.extend((now, t) for t in step.transitions)
    return seen, records


def test_the_documented_live_migration_sequence() -> None:
    """Docs' example: incarnations 1-4 give scheduled, started and completed, with notice and impact times."""
    transitions, records = run([
        (100.0, doc(1)),
        (110.0, doc(2, event("C7061BAC"))),
        (1010.0, doc(3, event("C7061BAC", "Started"))),
        (1017.0, doc(4)),
    ])
    assert [(now, t.kind) for now, t in transitions] == [(110.0, SCHEDULED), (1010.0, STARTED), (1017.0, COMPLETED)]
    completed = transitions[-1][1].record
    assert (completed.first_seen, completed.started_at, completed.gone_at) == (110.0, 1010.0, 1017.0)
    assert completed.notice_seconds == 900.0
    assert completed.impact_seconds == 7.0
    assert records == {}


@pytest.mark.parametrize(("name", "documents", "expected"), [
    ("host failure: Started at first sight, no notice",
     [(1.0, doc(1, event(status="Started"))), (5.0, doc(2))],
     [STARTED, COMPLETED]),
    ("cancelled: gone while still Scheduled",
     [(1.0, doc(1, event())), (5.0, doc(2))],
     [SCHEDULED, CANCELED]),
    ("rescheduled: NotBefore moved while Scheduled",
     [(1.0, doc(1, event())), (2.0, doc(2, event(not_before="Mon, 11 Apr 2022 23:26:58 GMT"))),
      (3.0, doc(3, event(status="Started"))), (4.0, doc(4))],
     [SCHEDULED, RESCHEDULED, STARTED, COMPLETED]),
    ("an unchanged event produces nothing",
     [(1.0, doc(1, event())), (2.0, doc(2, event())), (3.0, doc(3, event()))],
     [SCHEDULED]),
    ("Started clears NotBefore: not a reschedule",
     [(1.0, doc(1, event())), (2.0, doc(2, event(status="Started")))],
     [SCHEDULED, STARTED]),
    ("a Started event listed as Scheduled again is not started twice",
     [(1.0, doc(1, event(status="Started"))), (2.0, doc(2, event())), (3.0, doc(3, event(status="Started")))],
     [STARTED]),
    ("two events, one cancelled while the other starts",
     [(1.0, doc(1, event("A"), event("B", event_type="Reboot"))),
      (2.0, doc(2, event("A", "Started")))],
     [SCHEDULED, SCHEDULED, STARTED, CANCELED]),
])
def test_transitions(name: str, documents: list[tuple[float, Document]], expected: list[str]) -> None:
    """Each document sequence yields exactly the listed transitions, in order."""
    transitions, _ = run(documents)
    assert [t.kind for _, t in transitions] == expected, name


def test_host_failure_notice_is_zero() -> None:
    """An event first seen Started gave no warning at all: notice 0, not None."""
    (_, started), (_, completed) = run([(7.0, doc(1, event(status="Started"))), (37.0, doc(2))])[0]
    assert started.record.notice_seconds == 0.0
    assert completed.record.impact_seconds == 30.0


def test_rescheduled_carries_the_previous_not_before() -> None:
    """A reschedule says where NotBefore moved from, so logs and spans can show both."""
    transitions, _ = run([(1.0, doc(1, event())), (2.0, doc(2, event(not_before="Tue, 12 Apr 2022 01:00:00 GMT")))])
    moved = transitions[-1][1]
    assert moved.kind == RESCHEDULED
    assert moved.previous_not_before is not None and moved.previous_not_before.hour == 22
    assert moved.event.not_before is not None and moved.event.not_before.hour == 1


def test_first_seen_survives_updates() -> None:
    """Later documents update the event but keep the time it was first seen."""
    _, records = run([(1.0, doc(1, event())), (2.0, doc(2, event(not_before="Tue, 12 Apr 2022 01:00:00 GMT")))])
    assert records["e1"].first_seen == 1.0
    assert records["e1"].event.not_before is not None and records["e1"].event.not_before.day == 12


def test_diff_does_not_mutate_its_input() -> None:
    """The core is pure: the previous records are left as they were."""
    step = diff({}, doc(1, event()), 1.0)
    before = dict(step.records)
    diff(step.records, doc(2), 2.0)
    assert dict(step.records) == before


def test_an_event_is_never_both_completed_and_canceled() -> None:
    """Gone events end exactly once, completed if they started, canceled otherwise."""
    transitions, _ = run([(1.0, doc(1, event("A"), event("B"))), (2.0, doc(2, event("A", "Started"))), (3.0, doc(3))])
    ends = [(t.event.event_id, t.kind) for _, t in transitions if t.kind in (COMPLETED, CANCELED)]
    assert sorted(ends) == [("A", COMPLETED), ("B", CANCELED)]
