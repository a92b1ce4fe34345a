"""The platform picture: per EventId, statuses only forward whatever the order, duplicates dropped, retention,
bounds."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from se_exporter.fleet.platform import PlatformLimits, PlatformPicture, PlatformRecord, merge
from se_exporter.fleet.platform.picture import PictureState
from se_exporter.fleet.platform.saved import state_from_json, state_to_json
from tests.fleet.platform_helpers import KEY, T0, platform_event

STARTED_AT, ENDED_AT = T0 + 300, T0 + 305  # a Reboot of 5 s on two VMs: 10 s of impact
TIMES = {"Scheduled": T0, "Started": STARTED_AT, "Completed": ENDED_AT, "Canceled": STARTED_AT}
LIFECYCLES = [("Scheduled", "Started", "Completed"), ("Scheduled", "Canceled"), ("Scheduled", "Started", "Canceled"),
              ("Started", "Completed")]


def applied_in(order: tuple[str, ...], picture: PlatformPicture | None = None, now: float = T0 + 400,
               ) -> tuple[PlatformPicture, list[str], float]:
    picture = picture or PlatformPicture()
    statuses: list[str] = []
    impact = 0.0
    for status in order:
        result = picture.apply(platform_event(status, at=TIMES[status]), now)
        statuses.extend(result.statuses)
        impact += result.impact_seconds
    return picture, statuses, impact


def only(picture: PlatformPicture) -> PlatformRecord:
    [record] = picture.records()
    return record


@pytest.mark.parametrize("order", [order for lifecycle in LIFECYCLES for order in itertools.permutations(lifecycle)],
                         ids="-".join)
def test_statuses_only_move_forward_whatever_order_they_arrive_in(order: tuple[str, ...]) -> None:
    """Every arrival order of one lifecycle gives the same record: the furthest status, every status's time, each
    status counted once, the impact once."""
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
    assert record.ended and record.ended_at == TIMES[lifecycle[-1]]


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
    assert (first.outcome, first.statuses) == ("applied", ("Scheduled",))
    assert picture.apply(platform_event("Scheduled"), T0 + 1).outcome == "duplicate"
    again = picture.apply(platform_event("Scheduled", grid_id="another", resources=["web_9", "WEB_3"]), T0 + 2)
    assert (again.outcome, again.statuses, again.impact_seconds) == ("repeat", (), 0.0)
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
    """Kept for retention after its end, then forgotten; a late copy of one of its statuses does not revive it."""
    picture, _statuses, _impact = applied_in(("Scheduled", "Started", "Completed"), now=ENDED_AT + 1)
    assert picture.expire(ENDED_AT + 3599) == []
    [gone] = picture.expire(ENDED_AT + 3600)
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


def test_duplicates_are_remembered_for_the_retention_only() -> None:
    """Event Grid ids older than the retention are forgotten: memory does not grow with the stream's age."""
    picture = PlatformPicture(PlatformLimits(retention=100.0))
    picture.apply(platform_event("Scheduled", event_id="A"), T0)
    picture.expire(T0 + 101)
    result = picture.apply(platform_event("Scheduled", event_id="A"), T0 + 102)
    assert result.outcome == "repeat"


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
    assert restored.apply(platform_event("Completed"), T0 + 3601).statuses == ("Completed",)


@pytest.mark.parametrize("damage", [
    {"event_status": "Done"}, {"scope_type": "galaxy"}, {"event_id": ""}, {"resources": "web_3"},
    {"resources": [3]}, {"times": {}}, {"times": {"Later": 1.0}}, {"times": {"Started": "x"}},
    {"event_time": None}, {"event_time": 1e300}, {"changed_at": None}, {"not_before": True},
    {"duration_seconds": float("inf")}, {"location": 5}, {"event_type": "x" * 5000}])
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
