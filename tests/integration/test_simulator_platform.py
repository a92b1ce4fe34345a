"""`se-exporter simulate` plays both sides for real: the platform copy through the official SDK to the suite's AMQP
server and to a file, a full tmpfs under the file, and a hub that never answers, while every VM's IMDS serves."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from se_exporter.fleet.platform.reader import PlatformEvent, read_platform
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.scenario import lifecycle
from tests.integration.test_disk import SmallDisk, fill, small_disk  # noqa: F401 - small_disk is a fixture
from tests.support.child_logs import attach
from tests.support.eventhubs_server import EventHubsTestServer, SilentPeer, Store
from tests.support.helpers import stop_process, wait_until

pytestmark = pytest.mark.integration
API = "?api-version=2020-07-01"
FLEET = scenarios.load("fleet")
FREEZE, BLIND_REBOOT, REDEPLOY, CANCELED = (spec.event_id for spec in FLEET.events)


class Simulate:
    """``se-exporter simulate --scenario fleet`` (or ``scenario``) as a child process on a free loopback port."""

    def __init__(self, out: Path, *args: str, scenario: str = "fleet") -> None:
        self.out = out
        with out.open("wb") as stdout:
            self.process = subprocess.Popen([sys.executable, "-m", "se_exporter", "simulate", "--listen",
                                             "127.0.0.1:0", "--scenario", scenario, *args],
                                            stdout=stdout, stderr=subprocess.STDOUT)
        attach(f"se-exporter simulate (pid {self.process.pid})", out, lambda: self.process.poll() is None)
        self.url = wait_until(lambda: re.search(r"at (http://127\.0\.0\.1:\d+)", out.read_text()), timeout=20,
                              what="the simulator URL").group(1)

    def get(self, path: str, headers: dict[str, str] | None = None) -> Any:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)

    def imds(self, vm: str) -> set[str]:
        document = self.get(f"/vms/{vm}/metadata/scheduledevents{API}", {"Metadata": "true"})
        return {event["EventId"] for event in document["Events"]}

    def post(self, path: str, body: Any) -> None:
        request = urllib.request.Request(self.url + path, json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=5):
            pass

    def advance(self, seconds: float) -> None:
        self.post("/_simulator/advance", {"seconds": seconds})

    def platform(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.get("/_simulator/platform")
        return stats

    def log(self) -> str:
        return self.out.read_text(errors="replace")

    def stop(self) -> int:
        return stop_process(self.process)


@pytest.fixture
def simulate(tmp_path: Path) -> Iterator[Callable[..., Simulate]]:
    running: list[Simulate] = []

    def make(*args: str, scenario: str = "fleet") -> Simulate:
        running.append(Simulate(tmp_path / f"simulate{len(running)}.out", *args, scenario=scenario))
        return running[-1]

    yield make
    for child in running:
        child.stop()


def read(body: bytes) -> PlatformEvent:
    found = read_platform(body, 1 << 20, 0.0)
    assert found is not None and not found.skipped, body[:200]
    [event] = found.events
    return event


def first_cycle() -> dict[str, list[str]]:
    return {spec.event_id: [status for _, status in lifecycle(spec, None)] for spec in FLEET.events}


def test_the_platform_copy_reaches_a_hub_through_the_sdk_and_the_file_alike(
        simulate: Callable[..., Simulate], hubs: Callable[..., EventHubsTestServer], tmp_path: Path) -> None:
    """One run: each VM's IMDS lists its events (web_2 is blind to one); the real SDK delivers to the hub every
    message the file holds, in the same order, byte for byte; read_platform reads each as the status of the
    scenario's EventId it tells of, Event Grid's duplicates included."""
    hub = hubs(Store(hub="platform"))
    out = tmp_path / "platform.jsonl"
    sim = simulate("--platform-file", str(out), "--platform-eventhub-connection-string",
                   hub.connection_string("platform"))
    sim.advance(30)
    assert BLIND_REBOOT in sim.imds("web_0") and BLIND_REBOOT not in sim.imds("web_2")
    assert {FREEZE, REDEPLOY, CANCELED} <= sim.imds("web_2")
    sim.advance(200)  # past the first cycle's last change (155 s), well before the second cycle's first (302 s)
    stats = wait_until(lambda: (s := sim.platform())["eventhub"]["sent"] == s["published"] + s["duplicates"] >= 12
                       and s["file"]["written"] == s["eventhub"]["sent"] and s, what="both outputs caught up")
    lines = out.read_bytes().splitlines()
    bodies = [event.body for event in sorted(hub.store.all(), key=lambda e: e.enqueued_time_ms)]
    assert len(lines) == stats["file"]["written"]
    assert sorted(bodies) == sorted(lines)
    assert all(event.content_type == "application/json" for event in hub.store.all())
    statuses: dict[str, list[str]] = defaultdict(list)
    grid_ids: dict[str, int] = defaultdict(int)
    for line in lines:
        event = read(line)
        grid_ids[event.grid_id] += 1
        if grid_ids[event.grid_id] == 1:
            statuses[event.event_id].append(event.event_status)
        assert (event.scope_type, event.scope_name, event.location) == ("scale_set", "web", "norwayeast")
    assert {key: statuses[key] for key in first_cycle()} == first_cycle()
    assert sum(count - 1 for count in grid_ids.values()) == stats["duplicates"] >= 2
    assert sim.stop() == 0
    assert "SharedAccessKey" not in sim.log() and "c2VjcmV0a2V5" not in sim.log()


def test_a_full_disk_under_the_platform_file_leaves_imds_serving(simulate: Callable[..., Simulate],
                                                                small_disk: SmallDisk) -> None:  # noqa: F811
    """On a real tmpfs that fills up: a clear error in the log, the messages counted as failed, every VM's IMDS
    answering all along; once there is room again the next messages are written whole."""
    disk = small_disk("64k")
    out = disk / "platform.jsonl"
    sim = simulate("--platform-file", str(out))
    fill(disk)
    sim.advance(100)
    wait_until(lambda: sim.platform()["file"]["failed"] >= 3, what="failed writes counted")
    assert "platform copy: writing" in sim.log() and "No space left on device" in sim.log()
    assert sim.log().count("No space left on device") == 1  # said once, not per message
    for vm in ("web_0", "web_1", "web_2", "web_3"):
        assert REDEPLOY in sim.imds(vm) and FREEZE not in sim.imds(vm)  # IMDS answers, the scenario moving on
    (disk / "filler").unlink()
    written = sim.platform()["file"]["written"]
    sim.advance(200)
    wait_until(lambda: sim.platform()["file"]["written"] > written, what="writes after the disk had room again")
    assert "works again" in sim.log()
    for line in out.read_bytes().splitlines():
        read(line)  # every line whole
    assert sim.stop() == 0


def test_a_hub_that_never_answers_never_slows_imds(simulate: Callable[..., Simulate]) -> None:
    """Against a peer that accepts TCP and never says a word, the messages queue (bounded) while every VM's IMDS
    keeps answering at once, and the simulator still stops at once."""
    peer = SilentPeer()
    try:
        sim = simulate("--platform-eventhub-connection-string", peer.connection_string("platform"))
        sim.advance(100)
        wait_until(lambda: sim.platform()["eventhub"]["queued"] >= 3, what="messages queued for the silent hub")
        for _ in range(20):
            assert REDEPLOY in sim.imds("web_0")
        assert sim.platform()["eventhub"]["sent"] == 0
        assert sim.stop() == 0
    finally:
        peer.close()
