"""The state through the service and the in-memory state store: a base, then deltas of what changed,
compaction into a new base, a conflict answered by a base or by giving way, and no change lost to a failed write."""

from __future__ import annotations

import gzip
import hashlib
import json

import pytest

from scripts import state_bytes
from se_exporter.fleet import statestore
from se_exporter.fleet.settings import FleetSettings
from se_exporter.fleet.stateformat import decode
from tests.fleet.memory_store import Stored
from tests.fleet.test_service import NAME, NOW, Event, Replica, run, save, stored_state


def document(vm: int, version: int = 1) -> bytes:
    """A VM's own document of 20 events, as incompressible across VMs as real ones (ids and times differ)."""
    def digest(n: int) -> str:
        return hashlib.sha256(f"{vm}-{version}-{n}".encode()).hexdigest()

    return json.dumps({"DocumentIncarnation": version, "Events": [
        {"EventId": digest(n), "EventType": "Freeze", "ResourceType": "VirtualMachine", "Resources": [digest(-n)],
         "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT", "EventSource": "Platform",
         "DurationInSeconds": 5} for n in range(20)]}).encode()


def fleet_of_ten(replica: Replica) -> None:
    """vm-1 .. vm-10 at positions 1 .. 10, each with its own document."""
    run(replica.read(*(Event(n, f"vm-{n}", body=document(n)) for n in range(1, 11))))


def blocks(states: dict[str, Stored]) -> list[dict[str, object]]:
    """The stored blocks, each inflated."""
    return [json.loads(gzip.decompress(data)) for _block, data in states[NAME].blocks]


def written(replica: Replica, kind: str) -> float:
    return replica.value("azure_scheduled_fleet_state_bytes_written_total", kind=kind) or 0.0


def claimed(states: dict[str, Stored] | None = None) -> Replica:
    replica = Replica({} if states is None else states)
    run(replica.claim())
    return replica


def test_the_first_write_is_a_base_and_the_next_ones_deltas_of_what_changed() -> None:
    """A base holds every VM; then a heartbeat is a delta touching only that VM, a new document a delta holding it
    whole; the stored blocks read back as the picture, and each checkpoint follows a state that covers it."""
    replica = claimed()
    fleet_of_ten(replica)
    run(save(replica.service, "0"))
    base_bytes = written(replica, "base")
    run(replica.read(Event(11, "vm-1", sequence=2, body=document(1))))  # a heartbeat
    run(save(replica.service, "0"))
    run(replica.read(Event(12, "vm-2", sequence=2, body=document(2, 2))))  # a change
    run(save(replica.service, "0"))
    kinds = [("format" in block, block.get("touched"), len(block["vms"])) for block in blocks(replica.states)]
    assert kinds == [(True, None, 10), (False, [["vm-1", 2, NOW - 60, None, None, None]], 0), (False, [], 1)]
    decoded = decode(replica.states[NAME].data, "0", NOW)
    assert decoded.position == 12 and decoded.vms["vm-2"].body == document(2, 2)
    assert {key: vm.sequence for key, vm in decoded.vms.items() if vm.sequence > 1} == {"vm-1": 2, "vm-2": 2}
    assert replica.checkpoints.written == [(10, 10), (11, 11), (12, 12)]
    assert base_bytes > 10 * len(document(1)) // 4 and written(replica, "base") == base_bytes
    heartbeat, change = (len(data) for _block, data in replica.states[NAME].blocks[1:])
    assert heartbeat * 4 < change and change * 5 < base_bytes
    assert written(replica, "delta") < heartbeat + change + 500  # the blocks, and two short block lists


def test_a_restored_state_takes_deltas_and_one_with_rows_left_out_a_base() -> None:
    """A clean state read back is appended to; one whose rows were left out is replaced whole, so the
    damage is not carried on."""
    states: dict[str, Stored] = {}
    first = claimed(states)
    run(first.read(Event(1, "vm-a"), Event(2, "vm-b")))
    run(save(first.service, "0"))
    second = claimed(states)
    run(second.read(Event(3, "vm-a", sequence=2)))
    run(save(second.service, "0"))
    assert len(states[NAME].blocks) == 2 and second.keys() == ["vm-a", "vm-b"]
    damaged = json.loads(gzip.decompress(states[NAME].blocks[0][1]))
    damaged["vms"][1]["sequence"] = 0
    states[NAME] = Stored(gzip.compress(json.dumps(damaged).encode()) + states[NAME].blocks[1][1], 3, 1,
                          [states[NAME].blocks[0], states[NAME].blocks[1]])
    third = claimed(states)
    assert third.value("azure_scheduled_fleet_state_damaged_total", reason="row") == 1
    run(third.read(Event(4, "vm-c")))
    run(save(third.service, "0"))
    assert len(states[NAME].blocks) == 1 and sorted(decode(states[NAME].data, "0", NOW).vms) == ["vm-a", "vm-c"]


def test_deltas_are_compacted_into_a_base_past_the_block_cap_or_a_share_of_the_base(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_BLOCKS blocks, or deltas past COMPACT_FRACTION of the base's bytes, the write is a new base: a
    restore reads one base and a bounded tail."""
    monkeypatch.setattr(statestore, "MAX_BLOCKS", 3)
    monkeypatch.setattr(statestore, "COMPACT_FRACTION", 0.5)  # the rule at a share of ten VMs' documents
    replica = claimed()
    fleet_of_ten(replica)
    run(save(replica.service, "0"))
    counts = []
    for n in range(11, 15):
        run(replica.read(Event(n, "vm-1", sequence=n, body=document(1))))  # heartbeats: small deltas
        run(save(replica.service, "0"))
        counts.append(len(replica.states[NAME].blocks))
    assert counts == [2, 3, 1, 2]
    monkeypatch.setattr(statestore, "MAX_BLOCKS", 64)
    run(replica.read(*(Event(n, f"vm-{n - 14}", sequence=20, body=document(n - 14, 2)) for n in range(15, 19))))
    run(save(replica.service, "0"))  # 4 of 10 VMs whole: still under half the base
    assert len(replica.states[NAME].blocks) == 3
    run(replica.read(Event(19, "vm-5", sequence=20, body=document(5, 2))))
    run(save(replica.service, "0"))  # a fifth: past half of it
    assert len(replica.states[NAME].blocks) == 1
    decoded = decode(replica.states[NAME].data, "0", NOW)
    assert [decoded.vms[f"vm-{n}"].body for n in range(1, 11)] == [document(n, 2 if n <= 5 else 1)
                                                                   for n in range(1, 11)]


def test_a_conflict_gives_way_to_a_newer_state_and_replaces_an_older_one_with_a_base() -> None:
    """Another owner's write moved the ETag: at or past our position it wins (superseded, no checkpoint); behind
    it, our whole state replaces it as a base conditional on the ETag just read."""
    states: dict[str, Stored] = {}
    old, new = claimed(states), claimed(states)
    run(old.read(Event(1, "vm-a")))
    run(save(old.service, "0"))
    run(new.claim())  # restores the old owner's base
    run(new.read(Event(2, "vm-b"), Event(3, "vm-c")))
    run(save(new.service, "0"))
    run(old.read(Event(2, "vm-b")))
    run(save(old.service, "0"))  # behind the stored 3
    assert states[NAME].position == 3 and old.checkpoints.written == [(1, 1)]
    assert old.value("azure_scheduled_fleet_checkpoints_total", outcome="superseded") == 1
    run(old.read(Event(3, "vm-c"), Event(4, "vm-d")))
    run(save(old.service, "0"))  # ahead: a base, every VM the old owner holds
    assert states[NAME].position == 4 and len(states[NAME].blocks) == 1
    assert sorted(decode(states[NAME].data, "0", NOW).vms) == ["vm-a", "vm-b", "vm-c", "vm-d"]


def test_a_failed_write_loses_no_change_and_a_block_list_not_there_becomes_a_base() -> None:
    """The store refusing a delta: the next write carries the change; a stored blob without the blocks we know (it
    was written whole since) refuses the block list, and the write is a base."""
    replica = claimed()
    fleet_of_ten(replica)
    run(save(replica.service, "0"))
    run(replica.read(Event(11, "vm-1", sequence=2, body=document(1))))
    replica.store.failures = [OSError("connection reset")]
    run(save(replica.service, "0"))
    assert replica.value("azure_scheduled_fleet_checkpoints_total", outcome="error") == 1
    run(replica.read(Event(12, "vm-2", sequence=2, body=document(2))))
    run(save(replica.service, "0"))
    touched = sorted(entry[0] for entry in blocks(replica.states)[1]["touched"])  # type: ignore[attr-defined]
    assert touched == ["vm-1", "vm-2"] and len(replica.states[NAME].blocks) == 2
    assert replica.checkpoints.written == [(10, 10), (12, 12)]
    stored = replica.states[NAME]
    replica.states[NAME] = Stored(stored.data, stored.position, stored.revision)  # same ETag, no blocks
    run(replica.read(Event(13, "vm-1", sequence=3, body=document(1))))
    run(save(replica.service, "0"))
    assert len(replica.states[NAME].blocks) == 1 and replica.states[NAME].position == 13


def test_the_state_bytes_script_runs_and_an_interval_writes_a_fraction_of_the_whole_state() -> None:
    """scripts/state_bytes.py's smoke size: in steady state with heartbeats, each interval uploads under a fifth of
    the bytes of the whole state, all of it deltas."""
    figures = state_bytes.measure(200, 10, 5)
    assert figures["bytes_per_interval"] * 5 < figures["first_base"] and figures["base_per_interval"] == 0


def test_heartbeats_alone_wait_for_the_heartbeat_interval_and_any_other_change_is_written_at_once() -> None:
    """The periodic round writes a partition where only heartbeats arrived once the first of them has waited
    --heartbeat-checkpoint-interval (6 checkpoint intervals by default); a VM new, changed or gone is written at the
    next round, with the heartbeats waiting beside it."""
    replica = claimed()
    interval = replica.service.keeper.heartbeat_interval
    assert interval == 6 * FleetSettings().checkpoint_interval
    fleet_of_ten(replica)
    run(replica.service.write_due())  # ten new VMs: written at once
    assert replica.checkpoints.written == [(10, 10)]
    run(replica.read(Event(11, "vm-1", sequence=2, body=document(1))))  # a heartbeat
    replica.now += interval - 1
    run(replica.service.write_due())
    assert replica.checkpoints.written == [(10, 10)]  # it waits
    replica.now += 1
    run(replica.service.write_due())
    assert replica.checkpoints.written == [(10, 10), (11, 11)]
    run(replica.read(Event(12, "vm-2", sequence=2, body=document(2))))  # a heartbeat, then a change beside it
    run(replica.read(Event(13, "vm-3", sequence=2, body=document(3, 2))))
    run(replica.service.write_due())
    assert replica.checkpoints.written[-1] == (13, 13)
    assert replica.states[NAME].position == 13
    stored = decode(replica.states[NAME].data, "0", replica.now)
    assert stored.vms["vm-2"].sequence == 2 and stored.vms["vm-3"].body == document(3, 2)
    run(replica.read(Event(14, "vm-4", sequence=2, body=document(4))))
    run(replica.service.write_due())
    assert replica.checkpoints.written[-1] == (13, 13)
    replica.now += FleetSettings().vm_expiry + 61  # every VM silent past the expiry: gone, written at once
    assert len(run(replica.service.expire_now())) == 10
    run(replica.service.write_due())
    assert replica.checkpoints.written[-1] == (14, 14) and decode(replica.states[NAME].data, "0", replica.now).vms == {}


def test_heartbeats_wait_the_heartbeat_interval_on_the_monotonic_clock_whatever_the_wall_clock_does() -> None:
    """The replica's wall clock stepped back an hour while a heartbeat waited: it is written once it has waited the
    heartbeat interval on the monotonic clock, not an hour later; the checkpoint age gauge counts the same wait."""
    replica = claimed()
    interval = replica.service.keeper.heartbeat_interval
    fleet_of_ten(replica)
    run(replica.service.write_due())
    run(replica.read(Event(11, "vm-1", sequence=2, body=document(1))))  # a heartbeat
    replica.wall_step -= 3600
    replica.now += interval - 1
    run(replica.service.write_due())
    assert replica.checkpoints.written == [(10, 10)]  # it waits
    replica.now += 1
    run(replica.service.write_due())
    assert replica.checkpoints.written == [(10, 10), (11, 11)]


def test_the_heartbeat_interval_is_its_flag_and_never_shorter_than_the_checkpoint_interval() -> None:
    assert FleetSettings(checkpoint_interval=2).heartbeat_write_interval == 12
    assert FleetSettings(checkpoint_interval=2, heartbeat_checkpoint_interval=30).heartbeat_write_interval == 30
    assert FleetSettings(checkpoint_interval=20, heartbeat_checkpoint_interval=5).heartbeat_write_interval == 20
    # the default stays far below the 300 s of SeExporterFleetCheckpointsStale, and never under the checkpoint interval
    assert [FleetSettings(checkpoint_interval=c).heartbeat_write_interval for c in (50, 100, 600)] == [120, 120, 600]


def test_a_stored_position_past_the_partitions_newest_event_is_followed_by_a_base_the_next_owner_reads() -> None:
    """A state claiming sequence number 10**9 in a partition whose newest event is 3 (the hub recreated
    under its name): the position is reset, and the next write is a base at 3, not a delta behind the base at
    10**9, so the next owner restores every VM rather than finding the state damaged."""
    states = {NAME: stored_state(10**9, "vm-p", "vm-q", "vm-r", "vm-s")}
    first = claimed(states)
    run(first.read(Event(1, "vm-a"), Event(2, "vm-b"), Event(3, "vm-p", sequence=2)))
    assert first.value("azure_scheduled_fleet_state_damaged_total", reason="position") == 1
    run(save(first.service, "0"))
    assert states[NAME].position == 3 and len(states[NAME].blocks) == 1
    second = claimed(states)
    assert second.value("azure_scheduled_fleet_state_damaged_total", reason="wrong_shape") == 0
    assert second.held() == ["vm-a", "vm-b", "vm-p", "vm-q", "vm-r", "vm-s"]
