"""The lifecycle diff over sequences of documents, including the docs' own example."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest

from se_exporter.core.lifecycle import (
    CANCELED,
    COMPLETED,
    ENDED_MEMORY,
    RESCHEDULED,
    SCHEDULED,
    STARTED,
    TRANSITIONS,
    EventRecord,
    Transition,
    TransitionKind,
    diff,
)
from se_exporter.core.model import Document, EventMemo, parse_document


def doc(incarnation: int, *events: Mapping[str, object], memo: EventMemo | None = None) -> Document:
    return parse_document(json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}).encode(), memo)


def event(event_id: str = "E1", status: str = "Scheduled", not_before: str = "Mon, 11 Apr 2022 22:26:58 GMT",
          event_type: str = "Freeze") -> dict[str, object]:
    return {"EventId": event_id, "EventStatus": status, "EventType": event_type, "ResourceType": "VirtualMachine",
            "Resources": ["WestNO_0", "WestNO_1"], "NotBefore": "" if status == "Started" else not_before,
            "Description": "", "EventSource": "Platform", "DurationInSeconds": 5}


def run(documents: Sequence[tuple[float, Document]]) -> tuple[
        list[tuple[float, Transition]], Mapping[str, EventRecord]]:
    records: Mapping[str, EventRecord] = {}
    ended: Mapping[str, EventRecord] = {}
    seen: list[tuple[float, Transition]] = []
    for now, document in documents:
        step = diff(records, document, now, ended)
        records, ended = step.records, step.ended
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


def test_records_and_transitions_are_exactly_what_their_constructors_make() -> None:
    """The diff builds records and transitions without ``__init__`` for speed: each holds exactly the fields and
    values that the constructor would give it, and compares and prints the same."""
    steps = [diff({}, doc(1, event("A"), event("B")), 1.0)]
    steps.append(diff(steps[0].records, doc(2, event("A", status="Started"),
                                             event("B", not_before="Tue, 12 Apr 2022 01:00:00 GMT")), 2.0))
    assert [t.kind for step in steps for t in step.transitions] == [SCHEDULED, SCHEDULED, STARTED, RESCHEDULED]
    for step in steps:
        for record in [*step.records.values(), *(t.record for t in step.transitions)]:
            made = EventRecord(record.event, record.first_seen, record.started_at, record.gone_at,
                               record.first_seen_elapsed, record.started_elapsed, record.gone_elapsed)
            assert (vars(record), record, repr(record)) == (vars(made), made, repr(made))
        for transition in step.transitions:
            made_t = Transition(transition.kind, transition.record, transition.previous_not_before)
            assert (vars(transition), transition, repr(transition)) == (vars(made_t), made_t, repr(made_t))


def test_an_unchanged_event_keeps_its_record() -> None:
    """An event the next document lists unchanged (parsing hands out the same object) keeps its very record and makes
    no transition, beside one that changed; the same event object found Started beside a record not yet started
    still starts (the identity is no shortcut past a transition)."""
    memo = EventMemo()  # the poller's: what hands an unchanged event out again
    first = diff({}, doc(1, event("A"), event("B"), memo=memo), 1.0)
    second = diff(first.records, doc(2, event("A"), event("B", status="Started"), memo=memo), 2.0)
    assert second.records["a"] is first.records["a"]
    assert [(t.kind, t.event.event_id) for t in second.transitions] == [(STARTED, "B")]
    started = doc(3, event("C", status="Started"))
    not_yet = {"c": EventRecord(started.events[0], first_seen=1.0)}
    assert [t.kind for t in diff(not_yet, started, 3.0).transitions] == [STARTED]


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


def kinds(transitions: list[tuple[float, Transition]]) -> list[tuple[str, str]]:
    return [(t.event.event_id, t.kind) for _, t in transitions]


def test_an_event_id_that_changes_only_in_case_is_the_same_event() -> None:
    """EventIds are GUIDs: 'ABC' listed again as 'abc' (or ' abc ') is neither canceled nor scheduled again; the
    record keeps its first sighting and shows the new spelling; its end is counted once."""
    transitions, _ = run([(1.0, doc(1, event("ABC-1"))), (2.0, doc(2, event("abc-1"))),
                                (3.0, doc(3, event(" abc-1 ", "Started"))), (4.0, doc(4))])
    assert kinds(transitions) == [("ABC-1", SCHEDULED), (" abc-1 ", STARTED), (" abc-1 ", COMPLETED)]
    assert transitions[1][1].record.first_seen == 1.0


def test_records_are_keyed_by_the_lower_cased_event_id() -> None:
    """The key is the one the trace id is derived from (event_key), so records, spans and metrics agree."""
    _, records = run([(1.0, doc(1, event("C7061BAC-AFDC-4513-B24B-AA5F13A16123")))])
    assert list(records) == ["c7061bac-afdc-4513-b24b-aa5f13a16123"]


def test_an_ended_event_listed_again_does_not_begin_again() -> None:
    """17 [A] -> 18 [] (A canceled) -> 10 [A] (a stale answer): A is shown again with its first sighting, but it is
    never counted scheduled twice, and when it goes again it is not counted canceled twice."""
    transitions, records = run([(1.0, doc(17, event("A"))), (2.0, doc(18)), (3.0, doc(10, event("A"))),
                                (4.0, doc(11, event("A", "Started"))), (5.0, doc(19))])
    assert kinds(transitions) == [("A", SCHEDULED), ("A", CANCELED)]
    assert records == {}


def test_an_ended_event_listed_again_is_shown_with_its_old_times() -> None:
    """While listed again it is in the records (IMDS lists it), with the first time it was seen."""
    _, records = run([(1.0, doc(1, event("A"))), (2.0, doc(2)), (3.0, doc(3, event("A")))])
    assert records["a"].first_seen == 1.0 and records["a"].gone_at is None


def test_other_events_are_unaffected_by_a_replayed_one() -> None:
    """A new event in the stale document is a new event: scheduled as usual."""
    transitions, _ = run([(1.0, doc(1, event("A"))), (2.0, doc(2)), (3.0, doc(1, event("A"), event("B")))])
    assert kinds(transitions) == [("A", SCHEDULED), ("A", CANCELED), ("B", SCHEDULED)]


def test_the_memory_of_ended_events_is_bounded() -> None:
    """At most ENDED_MEMORY ended events are remembered, the newest."""
    step = diff({}, doc(1, *[event(f"E{index}") for index in range(ENDED_MEMORY + 10)]), 1.0)
    gone = diff(step.records, doc(2), 2.0, step.ended)
    assert len(gone.transitions) == ENDED_MEMORY + 10
    assert len(gone.ended) == ENDED_MEMORY
    assert "e0" not in gone.ended and f"e{ENDED_MEMORY + 9}" in gone.ended


def test_transition_kinds_read_as_their_published_names() -> None:
    """A transition kind is its lower-case name wherever it is written: f-strings, %-formatting, str() and JSON."""
    kind = TransitionKind.RESCHEDULED
    assert (f"{kind}", "%s" % kind, str(kind), json.dumps(kind)) == (  # noqa: UP031 - the logging module's style
        "rescheduled", "rescheduled", "rescheduled", '"rescheduled"')
    assert [str(k) for k in TRANSITIONS] == ["scheduled", "started", "completed", "canceled", "rescheduled"]


def test_a_wall_clock_stepped_back_makes_no_duration_negative() -> None:
    """The wall clock stepped back an hour between first sight and start (NTP after a boot, an operator): the
    timestamps are the wall clock's, as read, and notice, impact and lifetime are the monotonic clock's."""
    first = diff({}, doc(1, event()), 5_000.0, elapsed=100.0)
    started = diff(first.records, doc(2, event(status="Started")), 5_000.0 - 3600 + 30, first.ended, elapsed=130.0)
    gone = diff(started.records, doc(3), 5_000.0 - 3600 + 37, started.ended, elapsed=137.0)
    (completed,) = gone.transitions
    record = completed.record
    assert (record.first_seen, record.started_at, record.gone_at) == (5_000.0, 1_430.0, 1_437.0)
    assert (record.notice_seconds, record.impact_seconds, record.lifetime_seconds) == (30.0, 7.0, 37.0)
    assert started.transitions[0].record.notice_seconds == 30.0


def test_a_wall_clock_stepped_forward_makes_no_duration_longer() -> None:
    """A day's step forward between first sight and start is no day of notice."""
    first = diff({}, doc(1, event()), 1_000.0, elapsed=10.0)
    started = diff(first.records, doc(2, event(status="Started")), 1_000.0 + 86_400 + 5, first.ended, elapsed=15.0)
    assert started.transitions[0].record.notice_seconds == 5.0
    assert started.transitions[0].record.skipped_scheduled is False
