"""Hand-overs, one replica's side, through azure-eventhub's public callbacks only: a claimed partition is held but
shown only from its first batch, and hidden when ``on_error`` reports its link stolen, kept until ``on_close`` drops
it. What users query counts distinct VMs, which makes a hand-over exact there
(tests/integration/test_fleet_handover.py). The SDK's contexts and errors, the in-memory stores; no network."""

from __future__ import annotations

from azure.eventhub import CloseReason
from azure.eventhub.exceptions import OwnershipLostError

from tests.fleet.test_service import NAME, Event, Replica, run, stored_state


def shown_replica() -> Replica:
    """A replica that claimed partition 0, restored two VMs and read its first batch."""
    replica = Replica({NAME: stored_state(5, "vm-q", "vm-a")})
    run(replica.claim())
    run(replica.read(Event(6, "vm-b")))
    assert replica.keys() == ["vm-a", "vm-b", "vm-q"]
    return replica


def test_a_claimed_partition_is_held_but_not_shown_until_its_first_batch() -> None:
    """Restored VMs are held (not shown, not counted) from the claim until the partition's first batch, with events
    or the SDK's empty one."""
    for first in ([Event(6, "vm-b")], []):
        replica = Replica({NAME: stored_state(5, "vm-q", "vm-a")})
        run(replica.claim())
        assert replica.held() == ["vm-a", "vm-q"] and replica.keys() == []
        assert replica.value("azure_scheduled_fleet_shown_partitions") == 0
        run(replica.read(*first) if first else replica.idle())
        assert replica.keys() == sorted(["vm-a", "vm-q", *(["vm-b"] if first else [])])
        assert replica.value("azure_scheduled_fleet_shown_partitions") == 1


def test_a_stolen_link_hides_the_partition_at_once_and_close_drops_it() -> None:
    """on_error with the partition's context and ownership lost hides its VMs before on_close; they are held (a
    false alarm costs nothing but a moment), a later batch does not show them, and on_close drops them."""
    replica = shown_replica()
    run(replica.service.on_error(replica.context, OwnershipLostError()))
    assert replica.keys() == [] and replica.held() == ["vm-a", "vm-b", "vm-q"]
    assert replica.value("azure_scheduled_fleet_partition_loss_signs_total", sign="link_stolen") == 1
    assert replica.value("azure_scheduled_fleet_shown_partitions") == 0
    run(replica.read(Event(7, "vm-c")))
    assert replica.keys() == []
    run(replica.service.on_close(replica.context, CloseReason.OWNERSHIP_LOST))
    assert replica.held() == [] and replica.service.doubted == set()


def test_an_error_of_the_load_balancing_or_another_kind_hides_nothing() -> None:
    """Only ownership lost on a partition's own context is a sign of its loss: a load-balancing error (no context)
    or a connection error leaves it shown."""
    replica = shown_replica()
    run(replica.service.on_error(None, OwnershipLostError()))
    run(replica.service.on_error(replica.context, ConnectionResetError("connection reset by peer")))
    assert replica.keys() == ["vm-a", "vm-b", "vm-q"]
