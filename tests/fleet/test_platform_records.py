"""The platform picture: per EventId, statuses only forward whatever the order, duplicates dropped, retention,
bounds."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from se_exporter.fleet.platform.counting import Counted, top_up
from se_exporter.fleet.platform.records import PictureState, PlatformLimits, PlatformPicture, PlatformRecord, merge
from se_exporter.fleet.platform.saved import state_from_json, state_to_json
from tests.fleet.platform_helpers import KEY, T0, platform_event, platform_text

STARTED_AT, ENDED_AT = T0 + 300, T0 + 305  # a Reboot of 5 s on two VMs: 10 s of impact
TIMES = {"Scheduled": T0, "Started": STARTED_AT, "Completed": ENDED_AT, "Canceled": STARTED_AT}
LIFECYCLES = [("Scheduled", "Started", "Completed"), ("Scheduled", "Canceled"), ("Scheduled", "Started", "Canceled"),
              ("Started", "Completed")]


def applied_in(order: tuple[str, ...], picture: PlatformPicture | None = None, now: float = T0 + 400,
               ) -> tuple[PlatformPicture, list[str], float]:
    """The picture after ``order``, and what the counters added on the way (``top_up`` after each message)."""
    picture = picture or PlatformPicture()
    statuses: list[str] = []
    impact = 0.0
    counted = Counted()
    for status in order:
        result = picture.apply(platform_event(status, at=TIMES[status]), now)
        for increment in top_up(counted, result.record) if result.record else ():
            if increment.counter == "platform_events":
                statuses.append(increment.labels[1])
            elif increment.counter == "impact_seconds":
                impact += increment.amount
    return picture, statuses, impact


def only(picture: PlatformPicture) -> PlatformRecord:
    [record] = picture.records()
    return record


@pytest.mark.parametrize("order", [order for lifecycle in LIFECYCLES for order in itertools.permutations(lifecycle)],
                         ids="-".join)
def test_statuses_only_move_forward_whatever_order_they_arrive_in(order: tuple[str, ...]) -> None:
    """Every arrival order of one lifecycle gives the same record: the furthest status, every status's time, each
    status counted once, the impact once; an end held from when it was read."""
    lifecycle = next(lifecycle for lifecycle in LIFECYCLES if set(lifecycle) == set(order))
    record_in_order = only(applied_in(lifecycle)[0])
    picture, statuses, impact = applied_in(order)
    record = only(picture)
    assert record.status == lifecycle[-1]
    assert record.times == tuple((status, TIMES[status]) for status in lifecycle)
    assert record.times == record_in_order.times and record.event == record_in_order.event
    assert sorted(statuses) == sorted(lifecycle)
    assert impact == (10.0 if lifecycle[-2:] == ("Started", "Completed") else 0.0)
    assert record.announced_at == TIMES[lifecycle[0]]
    assert record.ended and record.ended_at == T0 + 400


def test_an_open_event_shows_its_fields_and_not_before_survives_the_start() -> None:
    """Scheduled carries NotBefore; Started (NotBefore empty) moves the status on and keeps it."""
    picture, _statuses, _impact = applied_in(("Scheduled", "Started"))
    record = only(picture)
    assert (record.status, record.ended, record.ended_at) == ("Started", False, None)
    assert record.event.not_before is not None
    assert record.event.resources == ("web_3", "web_7")


def test_a_duplicate_is_dropped_and_a_repeat_of_a_known_status_counts_nothing() -> None:
    """The same Event Grid id again is a duplicate; the same status under a new id adds no status change."""
    picture = PlatformPicture()
    first = picture.apply(platform_event("Scheduled"), T0)
    assert first.outcome == "applied" and first.record is not None and first.record.status == "Scheduled"
    assert picture.apply(platform_event("Scheduled"), T0 + 1).outcome == "duplicate"
    again = picture.apply(platform_event("Scheduled", grid_id="another", resources=["web_9", "WEB_3"]), T0 + 2)
    assert again.outcome == "repeat" and again.record is not None and again.record.times == first.record.times
    assert {name.casefold() for name in only(picture).event.resources} == {"web_3", "web_7", "web_9"}
    assert len(only(picture).event.resources) == 3
    assert only(picture).changed_at == T0


def test_two_ends_keep_the_earlier() -> None:
    """Completed and Canceled both arriving (never expected) leave the one the platform said first."""
    picture = PlatformPicture()
    picture.apply(platform_event("Canceled", at=T0 + 50), T0 + 100)
    picture.apply(platform_event("Completed", at=T0 + 40), T0 + 100)
    assert only(picture).status == "Completed"
    picture = PlatformPicture()
    picture.apply(platform_event("Completed", at=T0 + 40), T0 + 100)
    picture.apply(platform_event("Canceled", at=T0 + 50), T0 + 100)
    assert only(picture).status == "Completed"


def test_an_ended_event_stays_for_the_retention_then_goes_and_stays_gone() -> None:
    """Kept for retention after its end was read, then forgotten; a late copy of one of its statuses does not revive
    it."""
    picture, _statuses, _impact = applied_in(("Scheduled", "Started", "Completed"), now=ENDED_AT + 1)
    assert picture.expire(ENDED_AT + 3600) == []
    [gone] = picture.expire(ENDED_AT + 3601)
    assert gone.key == KEY and picture.records() == []
    assert picture.apply(platform_event("Started", grid_id="late", at=STARTED_AT), ENDED_AT + 3700).outcome == \
        "forgotten"
    assert picture.records() == []


def test_an_end_dated_in_the_future_is_held_only_from_when_it_was_applied() -> None:
    """The platform's clock cannot keep an event listed longer: the end counts from when it was applied at latest."""
    picture = PlatformPicture()
    picture.apply(platform_event("Completed", at=T0 + 10**6), T0)
    assert only(picture).ended_at == T0
    assert len(picture.expire(T0 + 3600)) == 1


def test_an_event_that_never_ends_is_forgotten_after_open_expiry() -> None:
    """A lost Completed does not keep an event listed for ever."""
    picture = PlatformPicture(PlatformLimits(open_expiry=1000.0))
    picture.apply(platform_event("Started"), T0)
    assert picture.expire(T0 + 999) == []
    assert len(picture.expire(T0 + 1000)) == 1


def test_duplicates_are_remembered_for_the_retention_only_apart_from_a_records_own_messages() -> None:
    """Event Grid ids older than the retention are forgotten: memory does not grow with the stream's age; a record
    knows its own messages while it lives, and counts each copy of one."""
    picture = PlatformPicture(PlatformLimits(retention=100.0))
    picture.apply(platform_event("Scheduled", event_id="A"), T0)
    picture.expire(T0 + 101)
    assert picture.sizes()["ids"] == 0
    result = picture.apply(platform_event("Scheduled", event_id="A"), T0 + 102)
    assert result.outcome == "duplicate" and only(picture).duplicates == 1


def test_events_past_the_bound_are_refused_and_counted_unless_an_ended_one_can_go() -> None:
    """At the events bound, the event that ended first makes room; with none ended, the new one is refused."""
    picture = PlatformPicture(PlatformLimits(events=2))
    picture.apply(platform_event("Completed", event_id="A"), T0)
    picture.apply(platform_event("Scheduled", event_id="B"), T0)
    assert picture.apply(platform_event("Scheduled", event_id="C"), T0).outcome == "applied"
    assert sorted(record.event.event_id for record in picture.records()) == ["B", "C"]
    assert picture.apply(platform_event("Scheduled", event_id="D"), T0).outcome == "platform_events"
    assert picture.bound_hits["platform_events"] == 1
    assert picture.apply(platform_event("Started", event_id="A"), T0).outcome == "forgotten"


def test_a_hundred_thousand_distinct_event_ids_stay_within_the_bounds() -> None:
    """A flood of distinct EventIds keeps at most ``events`` records and ``ids`` remembered ids, counting hits."""
    limits = PlatformLimits(events=1000, ids=5000)
    picture = PlatformPicture(limits)
    base = platform_event("Completed")
    for number in range(100_000):
        picture.apply(dataclasses.replace(base, grid_id=f"g{number}", event_id=f"E{number}", key=f"e{number}"),
                      T0 + number)
    sizes = picture.sizes()
    assert sizes["events"] == 1000 and sizes["ids"] <= 5000 and sizes["forgotten"] <= 5000
    assert picture.bound_hits["platform_ids"] > 0


def test_pictures_of_several_partitions_merge_into_what_one_would_hold() -> None:
    """One EventId's statuses split over two partitions merge into the record one partition would have."""
    one = applied_in(("Scheduled", "Started", "Completed"))[0]
    first = applied_in(("Completed",))[0]
    second = applied_in(("Started", "Scheduled"))[0]
    [merged] = merge([first.records(), second.records()])
    assert (merged.event, merged.times) == (only(one).event, only(one).times)
    assert merge([second.records(), first.records()])[0].times == merged.times


def test_a_picture_saved_as_json_and_restored_continues_exactly() -> None:
    """Records, remembered Event Grid ids and forgotten EventIds survive a restart through JSON."""
    picture, _statuses, _impact = applied_in(("Scheduled", "Started"))
    picture.apply(platform_event("Completed", event_id="gone", at=T0), T0)
    picture.expire(T0 + 3600)
    state = picture.state()
    text = json.dumps(state_to_json(state))
    restored_state, damaged = state_from_json(json.loads(text))
    assert (restored_state, damaged) == (state, 0)
    restored = PlatformPicture.restored(restored_state)
    assert restored.records() == picture.records()
    assert restored.apply(platform_event("Started"), T0 + 3601).outcome == "duplicate"
    assert restored.apply(platform_event("Scheduled", event_id="gone", grid_id="late"), T0 + 3601).outcome == \
        "forgotten"
    assert restored.apply(platform_event("Completed"), T0 + 3601).outcome == "applied"


@pytest.mark.parametrize("damage", [
    {"event_status": "Done"}, {"scope_type": "galaxy"}, {"event_id": ""}, {"resources": "web_3"},
    {"resources": [3]}, {"times": {}}, {"times": {"Later": 1.0}}, {"times": {"Started": "x"}},
    {"event_time": None}, {"event_time": 1e300}, {"changed_at": None}, {"not_before": True},
    {"duration_seconds": float("inf")}, {"location": 5}, {"event_type": "x" * 5000}, {"event_id": "x" * 1000},
    {"event_id": " "}, {"resources": ["v" * 2000]}, {"resources": [" "]}, {"event_status": "Scheduled"},
    {"times": {"Scheduled": 1.0}}])
def test_a_damaged_saved_record_is_left_out_and_counted(damage: dict[str, object]) -> None:
    """A state row of the wrong shape costs only itself: the others are restored, it is counted."""
    picture, _statuses, _impact = applied_in(("Scheduled", "Started"))
    good = state_to_json(picture.state())
    saved = {**good, "records": [*good["records"], {**good["records"][0], **damage}],
             "ids": [*good["ids"], {"id": 5, "at": 1.0}, {"id": "x", "at": -1}, "row"]}
    state, damaged = state_from_json(json.loads(json.dumps(saved)))
    assert damaged == 4
    assert state.records == picture.state().records
    assert state_from_json([1, 2]) == (PictureState((), (), ()), 1)


def names(count: int, prefix: str = "vm") -> list[str]:
    return [f"{prefix}_{number}" for number in range(count)]


def test_vm_names_over_all_events_are_bounded_an_ended_event_making_room_first() -> None:
    """At the VM-name bound a new EventId is refused (platform_vms) unless forgetting ended events makes room; a
    status naming more VMs adds only what fits. Without it 10,000 events of 1,000 names were 10 million strings."""
    picture = PlatformPicture(PlatformLimits(vms=10))
    assert picture.apply(platform_event("Completed", event_id="A", resources=names(6, "a")), T0).outcome == "applied"
    assert picture.apply(platform_event("Scheduled", event_id="B", resources=names(4, "b")), T0).outcome == "applied"
    assert picture.apply(platform_event("Scheduled", event_id="C", resources=names(5, "c")), T0).outcome == "applied"
    assert sorted(record.event.event_id for record in picture.records()) == ["B", "C"]  # A ended: it made room
    assert picture.apply(platform_event("Scheduled", event_id="D", resources=names(2, "d")), T0).outcome == \
        "platform_vms"
    grown = picture.apply(platform_event("Started", event_id="B", resources=names(8, "b")), T0)
    assert grown.outcome == "applied" and grown.record is not None and grown.record.status == "Started"
    assert grown.record is not None and grown.record.event.resources == tuple(names(5, "b"))
    assert picture.sizes()["vms"] == 10
    assert picture.bound_hits["platform_vms"] == 2


def test_a_flood_of_event_ids_naming_a_thousand_vms_each_stays_within_every_bound() -> None:
    """100,000 distinct EventIds of 1,000 VM names each: records, names, ids and series all stay at their bounds."""
    limits = PlatformLimits(events=500, ids=2000, vms=20_000)
    picture = PlatformPicture(limits)
    base = platform_event("Scheduled", resources=names(1000))
    for number in range(100_000):
        status = "Completed" if number % 2 else "Scheduled"
        picture.apply(dataclasses.replace(base, grid_id=f"g{number}", event_id=f"E{number}", key=f"e{number}",
                                          event_status=status), T0 + number)
    sizes = picture.sizes()
    assert sizes["events"] <= 500 and sizes["vms"] <= 20_000 and sizes["ids"] <= 2000 and sizes["forgotten"] <= 2000
    assert sum(len(record.event.resources) for record in picture.records()) == sizes["vms"]
    series = platform_text(picture.records(), []).count("\nazure_scheduled_fleet_platform_event")
    assert series == 5 * sizes["events"] <= 5 * 500


def test_the_same_event_grid_id_with_other_content_is_applied_not_dropped_as_a_duplicate() -> None:
    """A duplicate repeats id, EventId and status; the same id reused for another status or EventId is news, and
    the ids remembered are 32 characters however long the id was."""
    picture = PlatformPicture()
    assert picture.apply(platform_event("Scheduled", grid_id="x" * 256), T0).outcome == "applied"
    assert picture.apply(platform_event("Scheduled", grid_id="x" * 256), T0).outcome == "duplicate"
    started = picture.apply(platform_event("Started", grid_id="x" * 256), T0)
    assert started.outcome == "applied" and started.record is not None and started.record.status == "Started"
    assert picture.apply(platform_event("Scheduled", grid_id="x" * 256, event_id="OTHER"), T0).outcome == "applied"
    assert {len(seen) for seen, _at in picture.state().ids} == {32}


def test_impact_per_vm_is_capped_whatever_the_platforms_clock_says() -> None:
    """Started dated 2000 and Completed 2199 add at most 8 days per VM to the impact counter, not 199 years."""
    picture = PlatformPicture()
    picture.apply(platform_event("Started", at=946_684_800.0), T0)
    completed = picture.apply(platform_event("Completed", at=7_258_118_000.0), T0)
    assert completed.record is not None and completed.record.impact_seconds == 8 * 86400.0 * 2


def test_a_restored_state_is_held_to_the_limits_of_the_picture_it_restores() -> None:
    """A tampered state naming 100,000 VMs in one record, or more names in all than the bound, is held to the
    limits: each record cut to the names per event, then records kept while the names fit (open events first)."""
    picture = PlatformPicture()
    picture.apply(platform_event("Scheduled", resources=names(3)), T0)
    saved = state_to_json(picture.state())
    row = saved["records"][0]
    rows = [{**row, "event_id": f"E{number}", "resources": names(100_000 if number == 4 else 300, f"n{number}")}
            for number in range(5)]
    state, damaged = state_from_json({**saved, "records": rows})
    assert damaged == 0
    restored = PlatformPicture.restored(state, PlatformLimits(resources_per_event=400, vms=1000))
    assert [len(record.event.resources) for record in restored.records()] == [300, 300, 400]
    assert restored.sizes()["vms"] == 1000


@pytest.mark.parametrize("text", ["\ud800", "a\x00b"])
def test_a_remembered_id_the_reader_could_not_have_kept_is_damaged(text: str) -> None:
    """Ids and forgotten EventIds restored are held to the reader's checks: a lone surrogate (which would make the
    next write of the state, UTF-8 without escapes, fail) or a control character is left out."""
    saved = {"records": [], "ids": [{"id": text, "at": 1.0}], "forgotten": [{"key": text, "at": 1.0}]}
    state, damaged = state_from_json(json.loads(json.dumps(saved)))
    assert (state, damaged) == (PictureState((), (), ()), 2)


def test_a_state_of_another_shape_is_counted_not_taken_for_an_empty_one() -> None:
    """Lists of a newer shape (an object instead of a list) are counted damaged, not read as nothing."""
    state, damaged = state_from_json({"records": {"E": {}}, "ids": "x", "forgotten": None, "newer": [1]})
    assert (state, damaged) == (PictureState((), (), ()), 3)
    assert state_from_json({"records": [], "newer": {"field": 1}}) == (PictureState((), (), ()), 0)


def test_a_restored_records_end_is_set_exactly_when_its_status_is_an_end() -> None:
    """A tampered ended_at on an open event is ignored (it would expire it, or let it make room, as if ended); an
    ended event without one ends when it last changed, so retention still lets it go."""
    picture, _statuses, _impact = applied_in(("Scheduled", "Started"))
    row = state_to_json(picture.state())["records"][0]
    state, _damaged = state_from_json({"records": [{**row, "ended_at": T0}]})
    assert state.records[0].ended_at is None
    ended = {**row, "event_status": "Completed", "times": {**row["times"], "Completed": ENDED_AT}, "ended_at": None}
    state, _damaged = state_from_json({"records": [ended]})
    assert state.records[0].ended_at == state.records[0].changed_at
    assert len(PlatformPicture.restored(state).expire(state.records[0].changed_at + 3600)) == 1


def test_a_restored_records_vm_names_are_distinct_as_the_reader_keeps_them() -> None:
    """A tampered row naming one VM a thousand times in several spellings restores it once (the gauges would
    count it a thousand times), as the reader keeps Resources."""
    picture, _statuses, _impact = applied_in(("Scheduled",))
    row = state_to_json(picture.state())["records"][0]
    state, damaged = state_from_json({"records": [{**row, "resources": ["web_3", "WEB_3", "web_7"] * 1000}]})
    assert damaged == 0 and state.records[0].event.resources == ("web_3", "web_7")
