"""The fleet reads a 2024-07-09 document with the core parser: a SpotRebalanceRecommendation is shown under its own
type, with its own row in the per-type family from the start."""

from __future__ import annotations

from se_exporter.fleet.vms import Fleet
from tests.fleet.test_collector import Scrape, add
from tests.fleet.test_vms import FREEZE

SPOT = (b'{"DocumentIncarnation": 4, "Events": [{"EventId": "S1", "EventType": "SpotRebalanceRecommendation", '
        b'"ResourceType": "VirtualMachine", "Resources": ["spot_1"], "EventStatus": "Scheduled", '
        b'"NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT", "Description": "", "EventSource": "Platform", '
        b'"DurationInSeconds": -1}]}')


def test_the_fleet_shows_a_spot_rebalance_recommendation_under_its_type() -> None:
    """One VM listing the recommendation: one pending VM of that type, its event_info series and blast radius."""
    fleet = Fleet()
    fleet.claim("0")
    add(fleet, "0", SPOT, "id1", "spot_1", vmss="spot")
    get = Scrape(fleet).get
    assert get("azure_scheduled_fleet_pending_vms", {"event_type": "SpotRebalanceRecommendation",
                                                     "event_status": "Scheduled"}) == 1
    # EventIds are labelled in the core's canonical case (lower)
    assert get("azure_scheduled_fleet_event_vms", {"event_id": "s1", "event_type": "SpotRebalanceRecommendation"}) == 1


def test_the_type_has_its_row_before_any_such_event() -> None:
    """A fleet that never saw one still has the SpotRebalanceRecommendation rows at 0 (increase() sees the first)."""
    fleet = Fleet()
    fleet.claim("0")
    add(fleet, "0", FREEZE, "id0", "WestNO_0")
    get = Scrape(fleet).get
    assert get("azure_scheduled_fleet_pending_vms", {"event_type": "SpotRebalanceRecommendation",
                                                     "event_status": "Scheduled"}) == 0
