"""The simulator's api-versions: 2024-07-09 lists SpotRebalanceRecommendation, a VM that does not serve it answers
404, an unknown version 400 naming the api-version, and the control API changes what a VM serves."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.conftest import SimulatorFactory


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers or {"Metadata": "true"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def post(url: str, body: object) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def types(document: dict[str, Any]) -> list[str]:
    return [event["EventType"] for event in document["Events"]]


def test_the_recommendation_is_listed_under_2024_07_09_only(simulator: SimulatorFactory) -> None:
    """Both events listed under 2024-07-09; 2020-07-01 shows the Preempt alone, same incarnation."""
    sim, server = simulator("spot-rebalance", held=True)
    sim.advance(41)
    new = get(f"{server.url}/metadata/scheduledevents?api-version=2024-07-09")
    old = get(f"{server.url}/metadata/scheduledevents?api-version=2020-07-01")
    assert (new[0], types(new[1])) == (200, ["SpotRebalanceRecommendation", "Preempt"])
    assert (old[0], types(old[1])) == (200, ["Preempt"])
    assert new[1]["DocumentIncarnation"] == old[1]["DocumentIncarnation"]


def test_a_vm_that_does_not_serve_the_version_answers_404_until_told_otherwise(simulator: SimulatorFactory) -> None:
    """spot-rebalance-unserved: 404 for 2024-07-09, 200 for 2020-07-01; POST /_simulator/versions makes it serve
    2024-07-09; the scenario-only key is not compute metadata."""
    _, server = simulator("spot-rebalance-unserved", held=True)
    assert get(f"{server.url}/metadata/scheduledevents?api-version=2024-07-09")[0] == 404
    assert get(f"{server.url}/metadata/scheduledevents?api-version=2020-07-01")[0] == 200
    status, compute = get(f"{server.url}/metadata/instance/compute?api-version=2021-02-01")
    assert status == 200 and "scheduledEventsNewest" not in compute
    assert post(f"{server.url}/_simulator/versions", {"newest": "2024-07-09"}) == 200
    assert get(f"{server.url}/metadata/scheduledevents?api-version=2024-07-09")[0] == 200
    assert post(f"{server.url}/_simulator/versions", {"newest": "2099-01-01"}) == 400


def test_an_unknown_version_is_a_400_naming_the_api_version(simulator: SimulatorFactory) -> None:
    """As IMDS answers: 400, an error naming the api-version, and the newest versions, 2024-07-09 first."""
    _, server = simulator("spot-rebalance")
    status, body = get(f"{server.url}/metadata/scheduledevents?api-version=2030-01-01")
    assert status == 400 and "api-version" in body["error"]
    assert body["newest-versions"][0] == "2024-07-09"


@pytest.mark.parametrize(("name", "expected"), [
    ("auto-approved", [(2.5, "Reboot", "Started", "User"), (90.5, "Redeploy", "Started", "User")]),
    ("os-image", [(2.5, "Reboot", "Scheduled", "Platform"), (902.5, "Reboot", "Started", "Platform")]),
])
def test_events_that_skip_scheduled_and_os_image_events(name: str, expected: list[tuple[float, str, str, str]],
                                                         simulator: SimulatorFactory) -> None:
    """An auto-approved user reboot or redeploy is Started at first sight; the OS image event has 15 minutes'
    notice and starts when NotBefore passes (auto-approved)."""
    sim, server = simulator(name, held=True)
    for t, event_type, status, source in expected:
        sim.advance(t - sim.scenario_time())
        (event,) = get(f"{server.url}/metadata/scheduledevents?api-version=2020-07-01")[1]["Events"]
        assert (event["EventType"], event["EventStatus"], event["EventSource"]) == (event_type, status, source)
        if status == "Scheduled":
            assert event["NotBefore"]
