"""Sending the platform copy: a full disk or a failing hub is counted and logged, never blocks, never tears a line."""

from __future__ import annotations

import errno
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from se_exporter.cli import main
from se_exporter.core.errors import ConfigError
from se_exporter.fleet.platform.reader import read_platform
from se_exporter.infra.files import Disk
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.hub import EventHubOutput
from se_exporter.simulator.platform import PlatformCopy, Published
from se_exporter.simulator.publish import FileOutput, Publisher
from se_exporter.simulator.server import every_vm
from tests.support.helpers import wait_until

EPOCH = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = EPOCH

    def __call__(self) -> float:
        return self.now


class FillingDisk(Disk):
    """A disk with ``room`` bytes left: a short write up to it, then ENOSPC; ``room = None`` is a disk with room."""

    def __init__(self, room: int | None = None) -> None:
        self.room = room

    def write(self, fd: int, data: memoryview) -> int:
        if self.room is None:
            return super().write(fd, data)
        if self.room == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        written = super().write(fd, data[: self.room])
        self.room -= written
        return written


def messages(count: int) -> list[Published]:
    scenario = scenarios.load("fleet")
    copy = PlatformCopy(scenario)
    out = [m for t in range(0, 1200, 5) for m in copy.due(float(t), {}, lambda at: EPOCH + at) if not m.duplicate]
    assert len(out) >= count
    return out[:count]


def test_a_full_disk_drops_whole_lines_says_so_once_and_recovers(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A message that meets a full disk half-way is cut off again (no torn line), counted and logged once while the
    disk stays full; once there is room the next ones are written whole, and the recovery is logged."""
    caplog.set_level(logging.INFO, "se_exporter.simulator.platform")
    path = tmp_path / "platform.jsonl"
    disk = FillingDisk()
    output = FileOutput(path, disk)
    first, second, third, fourth = messages(4)
    output.offer(first)
    disk.room = len(second.body) // 2
    output.offer(second)
    output.offer(third)
    disk.room = None
    output.offer(fourth)
    output.close(1)
    lines = path.read_bytes().splitlines()
    assert lines == [first.body, fourth.body]
    assert (output.written, output.failed) == (2, 2)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "No space left on device" in errors[0] and str(path) in errors[0]
    assert any("works again (2 messages dropped so far)" in r.getMessage() for r in caplog.records)


def test_a_platform_file_that_cannot_be_opened_stops_start_up_in_one_line(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--platform-file in a directory that does not exist: exit 2 and one line naming the flag and the path."""
    missing = tmp_path / "no" / "such" / "platform.jsonl"
    assert main(["simulate", "--listen", "127.0.0.1:0", "--platform-file", str(missing)], env={}) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"--platform-file {missing}: cannot open it" in error


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--platform-eventhub-name", "hub"], "--platform-eventhub-name needs --platform-eventhub-connection-string"),
    (["--platform-eventhub-namespace", "ns.servicebus.windows.net"], "--platform-eventhub-name is required with"),
    (["--platform-eventhub-connection-string", "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;"
      "SharedAccessKey=c2VjcmV0"],
     "--platform-eventhub-name is required: the platform's connection string has no EntityPath"),
    (["--platform-eventhub-namespace", "ns.servicebus.windows.net", "--platform-eventhub-name", "h",
      "--platform-eventhub-connection-string", "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;"
      "SharedAccessKey=c2VjcmV0;EntityPath=h"], "exclude each other"),
    (["--platform-schema", "cloudevents"], "--platform-schema needs --platform-file"),
    (["--platform-schema", "xml", "--platform-file", "x"], "--platform-schema: 'xml' is not one of"),
])
def test_bad_platform_flags_stop_start_up_in_one_line(argv: list[str], fragment: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Each wrong combination of the platform flags is one line, exit 2, naming what to fix; no secret shown."""
    assert main(["simulate", "--listen", "127.0.0.1:0", *argv], env={}) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and fragment in error and "c2VjcmV0" not in error


class Batch:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def add(self, event: Any) -> None:
        self.events.append(event)


class Producer:
    """A producer whose sends fail (``fail``) or wait on ``release``; records what it sent."""

    def __init__(self, owner: Producers) -> None:
        self.owner = owner

    async def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Any, timeout: float) -> None:
        import asyncio  # noqa: PLC0415

        while not self.owner.release.is_set():
            await asyncio.sleep(0.01)
        if self.owner.fail:
            raise ConnectionError("refused")
        self.owner.sent.append(batch)

    async def close(self) -> None:
        self.owner.closed += 1


class Producers:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.release, self.sent, self.closed = fail, threading.Event(), [], 0
        self.release.set()

    def __call__(self) -> Producer:
        return Producer(self)


def test_a_stalled_hub_never_blocks_the_offer_and_drops_past_the_bound() -> None:
    """With the hub not answering, offers return at once; past the queue's capacity the oldest not being sent are
    dropped and counted, never the newest; when the hub answers again the queued ones go in order."""
    producers = Producers()
    producers.release.clear()
    output = EventHubOutput(producers, capacity=3, send_timeout=30)
    items = messages(6)
    for message in items:
        output.offer(message)  # returns at once: three are queued (the one being sent among them), three dropped
    assert output.stats()["dropped"] == 3
    producers.release.set()
    wait_until(lambda: output.stats()["sent"] == 3, what="the queued messages sent")
    output.close(5)
    assert output.stats() == {"sent": 3, "failed": 0, "dropped": 3, "queued": 0, "failing": None}
    bodies = [event.body_as_str().encode() for batch in producers.sent for event in batch.events]
    offered = [message.body for message in items]
    assert bodies[-2:] == offered[-2:] and bodies == sorted(bodies, key=offered.index)


def test_a_failing_hub_is_counted_logged_once_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    """Failed sends are counted, logged when they start failing (not every time), retried with backoff in order,
    and the recovery is logged."""
    caplog.set_level(logging.INFO, "se_exporter.simulator.platform")
    producers = Producers(fail=True)
    output = EventHubOutput(producers, send_timeout=1, max_retry_wait=0.05)
    first, second = messages(2)
    output.offer(first)
    output.offer(second)
    wait_until(lambda: output.stats()["failed"] >= 3, what="three failed sends")
    producers.fail = False
    wait_until(lambda: output.stats()["sent"] == 2, what="both sent after the recovery")
    output.close(5)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "connection" in errors[0]
    assert any("works again" in r.getMessage() for r in caplog.records)
    assert producers.closed >= 3  # a producer that failed is not used again


def test_the_publisher_writes_the_scenario_to_the_file_as_the_reader_reads_it(tmp_path: Path) -> None:
    """Ticking along the scenario, the file holds one message a line, each read by read_platform; the counts on
    /_simulator/platform match the lines."""
    clock = Clock()
    sims = every_vm(scenarios.load("fleet"), clock=clock)
    timeline = sims[0].timeline
    path = tmp_path / "platform.jsonl"
    publisher = Publisher(PlatformCopy(timeline.scenario), timeline, [FileOutput(path)])
    for _ in range(300):
        clock.now += 1
        publisher.tick()
    publisher.stop()
    lines = path.read_bytes().splitlines()
    read = [read_platform(line, 1 << 20, 0.0) for line in lines]
    assert all(r is not None and len(r.events) == 1 for r in read)
    stats = publisher.stats()
    assert stats["published"] + stats["duplicates"] == len(lines) == stats["file"]["written"] > 0
    assert stats["duplicates"] >= 1
    assert json.loads(lines[0])[0]["eventType"].endswith("ScheduledEventEmitted")


def test_the_settings_are_frozen_and_keep_the_secret_out_of_repr() -> None:
    """The connection string is never in the settings' repr (what a log line might show)."""
    from se_exporter.cli import build_parser  # noqa: PLC0415
    from se_exporter.simulator.settings import simulator_settings  # noqa: PLC0415

    string = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0;EntityPath=h"
    settings = simulator_settings(build_parser().parse_args(["simulate"]),
                                  {"SE_EXPORTER_SIMULATOR_PLATFORM_EVENTHUB_CONNECTION_STRING": string})
    assert settings.platform_eventhub and settings.platform and "c2VjcmV0" not in repr(settings)
    with pytest.raises(ConfigError):
        simulator_settings(build_parser().parse_args(["simulate", "--platform-eventhub-name", "h"]), {})


def test_the_cloudevents_schema_is_what_the_file_gets_when_asked_for(tmp_path: Path) -> None:
    """--platform-schema cloudevents: every line is one CloudEvents 1.0 event the reader takes as such."""
    from se_exporter.cli import build_parser  # noqa: PLC0415
    from se_exporter.simulator.publish import from_settings  # noqa: PLC0415
    from se_exporter.simulator.settings import simulator_settings  # noqa: PLC0415

    path = tmp_path / "platform.jsonl"
    settings = simulator_settings(build_parser().parse_args(
        ["simulate", "--scenario", "fleet", "--platform-file", str(path), "--platform-schema", "cloudevents"]), {})
    clock = Clock()
    timeline = every_vm(scenarios.load("fleet"), clock=clock)[0].timeline
    publisher = from_settings(settings, timeline)
    assert publisher is not None
    clock.now += 100
    publisher.tick()
    publisher.stop()
    lines = path.read_bytes().splitlines()
    assert lines and all(json.loads(line)["specversion"] == "1.0" for line in lines)
    read = [read_platform(line, 1 << 20, 0.0) for line in lines]
    assert {event.schema for message in read if message is not None for event in message.events} == {"cloudevents"}
    assert None not in read
