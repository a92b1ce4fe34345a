"""Counting an EventId once, whatever the order and lateness of its messages: the late end, the Scheduled that
names more VMs after the end, two ends at one eventTime, Event Grid's copy on another partition. Through the
fleet service and its blobs (in memory), as ``test_platform_service.py`` drives it."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from se_exporter.fleet.collector import FleetMetrics
from se_exporter.fleet.platform import counting
from se_exporter.fleet.platform.counting import (
    Counted,
    Verdict,
    judge,
    merged,
    top_up,
    top_up_unannounced,
)
from se_exporter.fleet.platform.fields import STATUSES
from se_exporter.fleet.platform.homes import Homes
from se_exporter.fleet.platform.hubs import OwnedPlatform, home
from se_exporter.fleet.platform.reader import PlatformEvent
from se_exporter.fleet.platform.records import PictureState, PlatformPicture, merge
from se_exporter.fleet.platform.saving import decode_platform, encode_platform
from se_exporter.fleet.report import Report
from tests.fleet.platform_helpers import T0, body, grid, platform_event
from tests.fleet.test_platform_service import Replica, homed
from tests.fleet.test_service import Event, run, save

IMPACT = "azure_scheduled_fleet_impact_seconds_total"
EVENTS = "azure_scheduled_fleet_platform_events_total"
DUPLICATES = "azure_scheduled_fleet_platform_duplicates_total"
LABELS = {"event_type": "Reboot", "scope_name": "web", "location": "westeurope"}


def message(status: str, sequence_number: int, at: float, resources: list[str], **kwargs: Any) -> Event:
    return Event(sequence_number, body=body([grid(status, at=at, resources=resources, **kwargs)]))


def events_total(replica: Replica) -> float:
    return sum(replica.value(EVENTS, event_type="Reboot", event_status=status)
               for status in ("Scheduled", "Started", "Completed", "Canceled"))


def test_an_event_whose_end_is_read_past_the_retention_after_its_event_time_is_counted() -> None:
    """A fleet replaying the hub (or Event Grid retrying) two hours late: Scheduled, Started and Completed dated
    2 h ago add their 600 s and their 3 statuses; the event is listed for --platform-retention from when its end
    was read."""
    replica = Replica(now=[T0 + 7200])
    run(replica.claim())
    run(replica.read(message("Scheduled", 1, T0 - 600, ["web_3"]), message("Started", 2, T0, ["web_3"]),
                     message("Completed", 3, T0 + 600, ["web_3"])))
    gauges = replica.gauges()
    assert replica.value(IMPACT, **LABELS) == 600.0
    assert events_total(replica) == 3
    assert [dict(labels)["event_status"] for (name, labels) in gauges if name.endswith("event_info")] == ["Completed"]
    replica.now[0] = T0 + 7200 + 3601
    assert [name for name in replica.gauges() if name[0].endswith("event_info")] == []


@pytest.mark.parametrize("scheduled_first", [True, False])
def test_the_impact_counts_every_vm_any_message_named_whichever_round_it_arrives_in(scheduled_first: bool) -> None:
    """A Scheduled naming three VMs, a Started and Completed naming one, 600 s apart: 1,800 s whether the Scheduled
    comes a round before or a round after the end (the impact counted at the end is topped up, never taken once)."""
    replica = Replica(now=[T0 + 700])
    run(replica.claim())
    scheduled = message("Scheduled", 1, T0 - 60, ["web_3", "web_7", "web_9"])
    ends = (message("Started", 2, T0, ["web_3"]), message("Completed", 3, T0 + 600, ["web_3"]))
    for batch in ((scheduled,), ends) if scheduled_first else (ends, (scheduled,)):
        run(replica.read(*batch))
        replica.gauges()
    assert replica.value(IMPACT, **LABELS) == 1800.0
    assert events_total(replica) == 3


@pytest.mark.parametrize("completed_first", [True, False])
def test_a_completed_and_a_canceled_at_one_event_time_end_as_completed_whichever_comes_first(
        completed_first: bool) -> None:
    """Two ends with one eventTime: Completed (the maintenance happened), whatever the arrival order; both counted."""
    replica = Replica(now=[T0 + 700])
    run(replica.claim())
    completed = message("Completed", 2, T0 + 600, ["web_3"])
    canceled = message("Canceled", 3, T0 + 600, ["web_3"])
    for ended in (completed, canceled) if completed_first else (canceled, completed):
        run(replica.read(ended))
        gauges = replica.gauges()
    [status] = [dict(labels)["event_status"] for (name, labels) in gauges if name.endswith("event_info")]
    assert status == "Completed"
    assert replica.value(EVENTS, event_type="Reboot", event_status="Canceled") == 1
    assert replica.value(EVENTS, event_type="Reboot", event_status="Completed") == 1


def test_event_grids_copy_delivered_to_another_partition_is_counted_as_a_duplicate_once() -> None:
    """The same Event Grid message on partition 0 and partition 1 (two replicas): applied once, and counted once in
    platform_duplicates_total over the two replicas, by the EventId's home, once it read the other's picture."""
    states: dict[str, Any] = {}
    event_id = homed("0", 2)
    home_replica, other = Replica(states, partitions=2), Replica(states, partitions=2, partition_id="1")
    for replica in (home_replica, other):
        run(replica.claim())
    copy = dict(grid_id="the-same-id", event_id=event_id)
    run(home_replica.read(message("Started", 1, T0, ["web_3"], **copy)))
    run(other.read(message("Started", 1, T0, ["web_3"], **copy)))
    other.gauges()
    run(save(other.service, "1"))
    run(home_replica.platform.read_peers())
    home_replica.gauges()
    assert home_replica.value(DUPLICATES) + other.value(DUPLICATES) == 1
    assert home_replica.value(EVENTS, event_type="Reboot", event_status="Started") == 1
    assert other.value(EVENTS, event_type="Reboot", event_status="Started") == 0



@pytest.mark.parametrize("event_type", ["Reboot", "Redeploy"])
def test_a_host_failure_is_read_in_either_documented_shape(event_type: str) -> None:
    """Azure documents a host failure as Reboot + Started in one place and Redeploy + Started in another: either is
    an event that started unannounced (no Scheduled, no NotBefore), listed and counted once under its type."""
    replica = Replica(now=[T0 + 60])
    run(replica.claim())
    run(replica.read(message("Started", 1, T0, ["web_3"], event_type=event_type)))
    gauges = replica.gauges()
    [info] = [dict(labels) for (name, labels) in gauges if name.endswith("event_info")]
    assert (info["event_type"], info["event_status"]) == (event_type, "Started")
    assert replica.value(EVENTS, event_type=event_type, event_status="Started") == 1
    assert replica.value(EVENTS, event_type=event_type, event_status="Scheduled") == 0
    [record] = replica.platform.view.records
    assert record.event.not_before is None and record.announced_at == T0


@pytest.mark.parametrize("reboot_first", [True, False])
def test_one_host_failure_in_both_shapes_is_one_event_started_once(reboot_first: bool) -> None:
    """The same EventId as Reboot + Started and as Redeploy + Started (two Event Grid ids): one event, one info
    series whose type does not depend on the order, Started counted once."""
    replica = Replica(now=[T0 + 60])
    run(replica.claim())
    shapes = [message("Started", 1, T0, ["web_3"], event_type="Reboot", grid_id="a"),
              message("Started", 2, T0, ["web_3"], event_type="Redeploy", grid_id="b")]
    run(replica.read(*(shapes if reboot_first else shapes[::-1])))
    gauges = replica.gauges()
    [info] = [dict(labels) for (name, labels) in gauges if name.endswith("event_info")]
    assert info["event_type"] == "Redeploy"  # the same eventTime: the larger Event Grid id decides
    assert sum(replica.value(EVENTS, event_type=kind, event_status="Started") for kind in ("Reboot", "Redeploy")) == 1

# ---------------------------------------------------------------------------------------------- the property

VMS = ("web_3", "web_7", "web_9")
EVENT_TIMES = (T0 - 7200, T0 - 6600, T0 - 60, T0, T0 + 600)  # two hours late among them


@st.composite
def message_sets(draw: st.DrawFn) -> tuple[list[PlatformEvent], list[int], list[bool]]:
    """2-5 messages of one EventId: distinct ones (any status, eventTime and VMs, each its own Event Grid id) and
    copies of them (Event Grid's duplicates repeat the payload); the partition each lands on; where rounds end."""
    count = draw(st.integers(2, 5))
    distinct = draw(st.integers(1, count))
    messages = [platform_event(draw(st.sampled_from(STATUSES)), grid_id=f"grid-{index}",
                               at=draw(st.sampled_from(EVENT_TIMES)),
                               resources=draw(st.lists(st.sampled_from(VMS), min_size=1, max_size=3, unique=True)))
                for index in range(distinct)]
    messages += [draw(st.sampled_from(messages[:distinct])) for _ in range(count - distinct)]
    partitions = draw(st.lists(st.integers(0, 1), min_size=count, max_size=count))
    cuts = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    return messages, partitions, cuts


def counted_in(order: tuple[int, ...], messages: list[PlatformEvent], partitions: list[int],
               cuts: list[bool]) -> tuple[dict[tuple[str, tuple[str, ...]], float], str]:
    """The counters after the messages arrive in ``order`` on their partitions, a round (expire, merge the
    partitions' pictures, top up) after each position ``cuts`` marks and after the last; and the final status."""
    pictures = [PlatformPicture(), PlatformPicture()]
    counted = Counted()
    totals: dict[tuple[str, tuple[str, ...]], float] = {}
    now = T0 + 10
    for position, index in enumerate(order):
        pictures[partitions[index]].apply(messages[index], now)
        if cuts[position] or position == len(order) - 1:
            now += 60
            for picture in pictures:
                picture.expire(now)
            for record in merge(picture.records() for picture in pictures):
                for increment in top_up(counted, record):
                    key = (increment.counter, increment.labels)
                    totals[key] = totals.get(key, 0.0) + increment.amount
    [record] = merge(picture.records() for picture in pictures)
    return totals, record.status


def expected(messages: list[PlatformEvent]) -> dict[tuple[str, tuple[str, ...]], float]:
    """The rule's figures, from the set of messages alone."""
    totals: dict[tuple[str, tuple[str, ...]], float] = {
        ("platform_events", ("Reboot", status)): 1.0 for status in {m.event_status for m in messages}}
    started = [m.event_time for m in messages if m.event_status == "Started"]
    completed = [m.event_time for m in messages if m.event_status == "Completed"]
    vms = {name for m in messages for name in m.resources}
    if started and completed and max(completed) > min(started):
        totals[("impact_seconds", ("Reboot", "web", "westeurope"))] = (max(completed) - min(started)) * len(vms)
    copies = len(messages) - len({m.grid_id for m in messages})
    if copies:
        totals[("platform_duplicates", ())] = float(copies)
    return totals


@pytest.mark.long(seconds=67)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message_sets())
def test_every_order_and_split_over_rounds_and_partitions_counts_the_same(
        case: tuple[list[PlatformEvent], list[int], list[bool]]) -> None:
    """400 sets of 2-5 messages, each in every order (the rounds' ends shifted with each order), split over two
    partitions: the same counters, the rule's figures of the set, and one final status."""
    messages, partitions, cuts = case
    want = expected(messages)
    statuses = set()
    for number, order in enumerate(itertools.permutations(range(len(messages)))):
        shifted = cuts[number % len(cuts):] + cuts[:number % len(cuts)]
        totals, status = counted_in(order, messages, partitions, shifted)
        assert totals == want, order
        statuses.add(status)
    assert len(statuses) == 1


@pytest.mark.parametrize("rule", ["COUNTING", "COVERAGE"])
def test_each_rule_is_stated_in_three_lines_where_users_and_maintainers_read_it(rule: str) -> None:
    """COUNTING and COVERAGE, three numbered rules each in counting.py's docstring, word for word in
    docs/platform-stream.md; the duplicates counter's help says what it counts across partitions."""
    def flat(text: str) -> str:
        return " ".join(text.split())

    docstring = counting.__doc__ or ""
    numbered = docstring[docstring.index(f"(``{rule}``"):].split("\n\n", 2)[1]
    lines = [flat(line) for line in re.split(r"\n(?=\d\. )", numbered)]
    assert [line[:3] for line in lines] == ["1. ", "2. ", "3. "]
    docs = flat((Path(__file__).parents[2] / "docs" / "platform-stream.md").read_text(encoding="utf-8"))
    for line in lines:
        assert line in docs, line
    registry = CollectorRegistry()
    FleetMetrics(registry)
    [family] = [family for family in registry.collect() if family.name.endswith("platform_duplicates")]
    assert "any partition" in family.documentation and "home replica" in family.documentation


def test_what_was_counted_sits_on_its_home_partition_and_moves_when_the_hubs_partitions_are_added() -> None:
    """Each EventId's counting is kept on its home partition's OwnedPlatform (so in that partition's blob); when the
    hub's partitions are added, it moves to its new home when next counted, not started afresh; it is forgotten past the
    expiry unless still listed."""
    registry = CollectorRegistry()
    metrics = FleetMetrics(registry)
    partitions = [4]
    side = Replica(partitions=4).platform.hubs["platform"]
    side.partitions = lambda: partitions[0]
    side.held.update({str(number): OwnedPlatform() for number in range(8)})
    homes = Homes({"platform": side}, metrics, Report(metrics), 100.0)
    keys = [f"{index:08x}-0000-0000-0000-000000000000" for index in range(200)]

    def placed() -> bool:
        return all(key in side.held[home(key, partitions[0])].counted for key in keys) \
            and sum(len(held.counted) for held in side.held.values()) == len(keys)

    for key in keys:
        homes.remember(key).statuses.add("Scheduled")
    assert placed()
    partitions[0] = 8
    assert all(homes.remember(key).statuses == {"Scheduled"} for key in keys) and placed()
    homes.forget(set(), 0.0)
    homes.forget(set(keys[:50]), 200.0)  # gone since 0: past the expiry of 100 s, unless listed again
    assert {key for held in side.held.values() for key in held.counted} == set(keys[:50])


# ---------------------------------------------------------------------------------------------- the coverage rule

# One round's coverage of one VM as its partition's owner judges it: listed (with the lag), missed, or alive only.
JUDGED = (("observed", -30.0), ("observed", 45.0), ("missed", None), ("imds_unreachable", None), (None, None))
Step = tuple[int, str, str | None, float | None]  # partition, VM, coverage, lag


@st.composite
def judgement_steps(draw: st.DrawFn) -> tuple[list[Step], bool, list[int], list[bool]]:
    """2-5 rounds of judging, each one VM of one of two partitions (a VM may sit in both, as in a hand-over);
    whether a partition's live VMs listed the EventId unannounced; per home round, how many rounds late it reads
    the partitions' blobs (0-2); and whether the home's replica is killed before its blob is written."""
    count = draw(st.integers(2, 5))
    steps = [(draw(st.integers(0, 1)), draw(st.sampled_from(VMS)), *draw(st.sampled_from(JUDGED)))
             for _ in range(count)]
    return (steps, draw(st.booleans()), draw(st.lists(st.integers(0, 2), min_size=count, max_size=count)),
            draw(st.lists(st.booleans(), min_size=count, max_size=count)))


def _restored(counted: Counted, record_key: str) -> Counted:
    """What the home's next owner reads back of ``counted`` from the home's blob."""
    data = encode_platform("0", 1, PictureState((), (), ()), {record_key: counted})
    return decode_platform(data, "0").memory[record_key]


def coverage_counted(order: tuple[int, ...], steps: list[Step], unannounced: bool, late: list[int],
                     kills: list[bool]) -> tuple[dict[tuple[str, ...], float], dict[str, set[str]]]:
    """The coverage counters over replicas after the rounds are judged in ``order``: each partition's judgement
    moved on per round (``judge``), the home reading every partition's judgement as it was ``late`` rounds before,
    topping up (``top_up``) and applying its increments once its blob is written, or killed before the write (its
    successor restores what was counted from the blob); a last round once everything is read and written. Also
    the reasons each VM was judged under."""
    picture = PlatformPicture()
    picture.apply(platform_event("Scheduled", resources=list(VMS)), T0)
    [record] = picture.records()
    judgements: list[list[dict[str, Verdict]]] = [[{}, {}]]  # the two partitions' judgements after each round
    reasons: dict[str, set[str]] = {}
    written, counted = Counted(), Counted()
    totals: dict[tuple[str, ...], float] = {}
    for position, index in enumerate([*order, -1]):
        now = [dict(judged) for judged in judgements[-1]]
        if index >= 0:
            partition, name, coverage, lag = steps[index]
            now[partition][name] = judge(now[partition].get(name, (None, None)), coverage, lag)
            if coverage in ("missed", "imds_unreachable"):
                reasons.setdefault(name, set()).add(coverage)
        judgements.append(now)
        seen = judgements[max(0, len(judgements) - 1 - (late[position % len(late)] if index >= 0 else 0))]
        increments = top_up(counted, record, merged(seen))
        if unannounced and (index < 0 or position == len(order) // 2):
            increments += top_up_unannounced(counted, "Reboot")
        if index >= 0 and kills[position % len(kills)]:
            counted = _restored(written, record.key)  # killed before the write: nothing applied, nothing kept
            continue
        written = _restored(counted, record.key)  # the blob written: what a successor would read back
        for increment in increments:
            key = (increment.counter, *increment.labels[-1:]) if increment.counter == "missed_events" \
                else (increment.counter,)
            totals[key] = totals.get(key, 0.0) + (1.0 if increment.counter == "announcement_lag" else increment.amount)
    return totals, reasons


@pytest.mark.long(seconds=34)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(judgement_steps())
def test_every_order_lateness_and_kill_of_the_home_counts_each_vm_and_event_id_once(
        case: tuple[list[Step], bool, list[int], list[bool]]) -> None:
    """300 sets of 2-5 rounds of judging over two partitions, each in every order, read by the home up to two rounds
    late, its replica killed before some writes: each VM judged missed counted once (under a reason it was judged
    under), each VM that listed the EventId's lag once, an unannounced EventId once."""
    steps, unannounced, late, kills = case
    missed = {name for _partition, name, coverage, _lag in steps if coverage in ("missed", "imds_unreachable")}
    lagged = {name for _partition, name, coverage, _lag in steps if coverage == "observed"}
    for order in itertools.permutations(range(len(steps))):
        totals, reasons = coverage_counted(order, steps, unannounced, late, kills)
        assert sum(value for key, value in totals.items() if key[0] == "missed_events") == len(missed), order
        assert {key[1] for key in totals if key[0] == "missed_events"} <= set().union(*reasons.values()), order
        assert totals.get(("announcement_lag",), 0.0) == len(lagged), order
        assert totals.get(("unannounced_events",), 0.0) == float(unannounced), order
