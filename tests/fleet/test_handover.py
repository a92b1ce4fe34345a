"""Hand-overs, one replica's side: a claimed partition is held but shown only once its receiver holds it, and a held
partition is hidden at the first sign of its loss (link stolen, ownership recorded elsewhere, claim refused), kept
until closed and shown again only by a batch after a round that shows it ours. The SDK's contexts and errors, the
in-memory stores; no network."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from azure.eventhub import CloseReason
from azure.eventhub._pyamqp.error import AMQPLinkError, ErrorCondition  # what the SDK's link keeps
from azure.eventhub.aio import EventHubConsumerClient
from azure.eventhub.aio._eventprocessor.event_processor import EventProcessor  # what link_attached reads
from azure.eventhub.aio._eventprocessor.in_memory_checkpoint_store import InMemoryCheckpointStore
from azure.eventhub.exceptions import OwnershipLostError

from se_exporter.fleet.consumer import link_attached, link_stolen
from tests.fleet.test_service import NAME, Event, Replica, run, stored_state

ME, OTHER = "me-0000", "other-1111"


def record(partition_id: str, owner_id: str) -> dict[str, Any]:
    """One ownership record as the SDK's load balancing reads and claims it."""
    return {"fully_qualified_namespace": "ns", "eventhub_name": "hub", "consumer_group": "$Default",
            "partition_id": partition_id, "owner_id": owner_id, "last_modified_time": 0.0, "etag": "e"}


def shown_replica() -> Replica:
    """A replica that claimed partition 0 in a balancing round, restored two VMs and read its first batch."""
    replica = Replica({NAME: stored_state(5, "vm-q", "vm-a")})
    replica.service.on_claimed([record("0", ME)], [record("0", ME)])
    run(replica.claim())
    run(replica.read(Event(6, "vm-b")))
    assert replica.keys() == ["vm-a", "vm-b", "vm-q"]
    return replica


def test_a_claimed_partition_is_held_but_not_shown_until_its_first_batch() -> None:
    """Restored VMs are held (not shown, not counted) from the claim until the first batch with events, which the
    SDK hands over an attached link only, i.e. once the previous owner's link is closed."""
    replica = Replica({NAME: stored_state(5, "vm-q", "vm-a")})
    run(replica.claim())
    assert replica.held() == ["vm-a", "vm-q"] and replica.keys() == []
    assert replica.value("azure_scheduled_fleet_shown_partitions") == 0
    run(replica.read(Event(6, "vm-b")))
    assert replica.keys() == ["vm-a", "vm-b", "vm-q"]
    assert replica.value("azure_scheduled_fleet_shown_partitions") == 1


def test_an_empty_batch_shows_the_partition_only_once_its_link_is_attached() -> None:
    """The SDK's empty batch is timed from the receive call, not from the attach: while the SDK says the link is not
    attached it shows nothing; the next empty batch after the attach shows the partition."""
    replica = Replica({NAME: stored_state(5, "vm-q")})
    attached = {"0": False}
    replica.service.attached = attached.get
    run(replica.claim())
    run(replica.idle())
    assert replica.keys() == [] and replica.held() == ["vm-q"]
    attached["0"] = True
    run(replica.idle())
    assert replica.keys() == ["vm-q"]


def test_a_quiet_partition_is_shown_once_its_link_is_attached_without_waiting_for_a_batch() -> None:
    """The attach watch shows a held partition as soon as the SDK says its link is attached (a quiet partition's
    first batch is the empty one, a second later), and never one with a sign of loss."""
    replica = Replica({NAME: stored_state(5, "vm-q")})
    attached = {"0": False}
    replica.service.attached = attached.get
    run(replica.claim())
    replica.service.follow_links()
    assert replica.keys() == []
    attached["0"] = True
    replica.service.follow_links()
    assert replica.keys() == ["vm-q"]
    run(replica.service.on_error(replica.context, OwnershipLostError()))
    replica.service.follow_links()
    assert replica.keys() == []


def test_a_link_holding_a_stolen_error_hides_the_partition_before_the_sdk_raises_it() -> None:
    """The link watch hides a shown partition as soon as its link holds the stolen error (the SDK raises it to
    on_error only at that consumer's next turn), counted once however often it looks; the VMs stay held."""
    replica = shown_replica()
    stolen = {"0": False}
    replica.service.stolen = stolen.get  # type: ignore[assignment]  # a dict's get: None for other partitions
    replica.service.follow_links()
    assert replica.keys() == ["vm-a", "vm-b", "vm-q"]
    stolen["0"] = True
    replica.service.follow_links()
    replica.service.follow_links()
    run(replica.service.on_error(replica.context, OwnershipLostError()))
    assert replica.keys() == [] and replica.held() == ["vm-a", "vm-b", "vm-q"]
    assert replica.value("azure_scheduled_fleet_partition_loss_signs_total", sign="link_stolen") == 1


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


def test_ownership_recorded_elsewhere_hides_the_partition_until_a_round_shows_it_ours() -> None:
    """A balancing round that reads another owner on a held partition hides it; batches do not show it again until a
    round reads it as ours, then the next batch does."""
    replica = shown_replica()
    replica.service.on_listed([record("0", OTHER), record("1", OTHER)])
    assert replica.keys() == [] and replica.held() == ["vm-a", "vm-b", "vm-q"]
    assert replica.value("azure_scheduled_fleet_partition_loss_signs_total", sign="owned_elsewhere") == 1
    run(replica.read(Event(7, "vm-c")))
    run(replica.idle())
    assert replica.keys() == []
    replica.service.on_listed([record("0", ME)])
    assert replica.keys() == []  # ours again: shown by the receiver's next batch, not by the round
    run(replica.idle())
    assert replica.keys() == ["vm-a", "vm-b", "vm-c", "vm-q"]


def test_a_refused_claim_hides_the_partition_and_a_release_hides_nothing() -> None:
    """A round that claims a held partition and does not win it hides it; a release (the SDK's claim with the owner
    id emptied) says nothing about the others; a later round that wins it lets the next batch show it."""
    replica = shown_replica()
    replica.service.on_claimed([record("1", "")], [record("1", "")])  # another partition released
    assert replica.keys() == ["vm-a", "vm-b", "vm-q"]
    replica.service.on_claimed([record("0", ME), record("1", ME)], [record("1", ME)])
    assert replica.keys() == [] and replica.held() == ["vm-a", "vm-b", "vm-q"]
    assert replica.value("azure_scheduled_fleet_partition_loss_signs_total", sign="claim_failed") == 1
    run(replica.idle())
    assert replica.keys() == []
    replica.service.on_claimed([record("0", ME)], [record("0", ME)])
    run(replica.idle())
    assert replica.keys() == ["vm-a", "vm-b", "vm-q"]


def test_ownership_is_not_judged_before_the_first_claim_names_this_processor() -> None:
    """Before its first claim a replica does not know its owner id: a round's records hide nothing then."""
    replica = Replica({NAME: stored_state(5, "vm-q")})
    run(replica.claim())
    run(replica.idle())
    replica.service.on_listed([record("0", OTHER)])
    assert replica.keys() == ["vm-q"] and replica.service.balanced


def test_link_attached_and_stolen_read_the_installed_sdks_consumer() -> None:
    """link_attached finds the partition's consumer where azure-eventhub keeps it and reads its running flag (set
    once the link is attached); no consumer for the partition: not attached; an SDK built otherwise: unknown.
    link_stolen reads the error the SDK's link keeps from a detach frame: the stolen condition only."""
    client = EventHubConsumerClient.from_connection_string(
        "Endpoint=sb://127.0.0.1/;SharedAccessKeyName=k;SharedAccessKey=a2V5;EntityPath=hub", "$Default")
    attached = link_attached(client)
    assert attached("0") is False
    async def handle(*args: Any) -> None:
        """The SDK's event handler, never called here."""

    processor = EventProcessor(client, "$Default", handle, checkpoint_store=InMemoryCheckpointStore())
    client._event_processors[("$Default", "-1")] = processor
    processor._consumers["0"] = processor.create_consumer("0", "-1", False, handle)
    assert attached("0") is False and attached("1") is False  # created, its link not opened yet
    processor._consumers["0"].running = True  # what the consumer's _open sets once the link is attached
    assert attached("0") is True
    assert link_attached(object())("0") is None
    stolen = link_stolen(client)
    assert not stolen("0") and not stolen("1") and not link_stolen(object())("0")
    link = SimpleNamespace(_error=AMQPLinkError(ErrorCondition.LinkDetachForced))  # what _incoming_detach keeps
    processor._consumers["0"]._handler = SimpleNamespace(_link=link)
    assert not stolen("0")
    link._error = AMQPLinkError(ErrorCondition.LinkStolen, description="a receiver took this partition over")
    assert stolen("0")
    link._error = AMQPLinkError(b"amqp:link:stolen")  # a condition the enum does not map
    assert stolen("0")
