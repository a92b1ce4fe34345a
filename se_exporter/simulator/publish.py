"""Sending the platform copy (``platform.PlatformCopy``) out: a JSON-lines file, an Event Hub, or both.

The simulated IMDS must never wait on either, so the copy runs in a thread of its own (``Publisher``), which
looks at the timeline every ``interval`` and hands what is due to each output; an output never blocks it:

* ``FileOutput`` (``--platform-file``) appends one line per message (the exact bytes a hub would carry), each
  written whole or cut off again, so a full disk leaves no torn line: the message is dropped, counted and logged
  (once when writing starts failing, once when it recovers), and the next line goes in once there is room;
* ``hub.EventHubOutput`` (``--platform-eventhub-*``) queues them for the batching processor's worker, which sends
  them with the SDK, bounded and retried, at least once as Event Grid delivers (``hub.py`` says how).

Counts are served on ``GET /_simulator/platform``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from se_exporter.core.errors import ConfigError
from se_exporter.core.retry import Health
from se_exporter.infra.files import DISK, Disk, LineFile, NotRegularFile
from se_exporter.simulator.platform import PlatformCopy, Published
from se_exporter.simulator.settings import SimulatorSettings
from se_exporter.simulator.timeline import Timeline

log = logging.getLogger("se_exporter.simulator.platform")


class Output(Protocol):
    name: str

    def offer(self, message: Published) -> None:
        """Take one message; never blocks on the peer, never raises."""

    def stats(self) -> dict[str, Any]: ...

    def close(self, timeout: float) -> None: ...


class FileOutput:
    """``--platform-file``: one message per line, appended by the publisher's thread (see the module)."""

    name = "file"

    def __init__(self, path: Path, disk: Disk = DISK) -> None:
        self.path, self._health = path, Health()
        self.written = self.failed = 0
        try:
            self._file = LineFile(path, disk)
        except NotRegularFile:
            raise ConfigError(f"--platform-file {path}: not a regular file; give the path of a regular file (or of "
                              "one to create)") from None
        except OSError as exc:
            reason = "it is a FIFO without a reader" if exc.errno == errno.ENXIO else exc.strerror or str(exc)
            raise ConfigError(f"--platform-file {path}: cannot open it for appending ({reason}); give the path of "
                              "a regular file (or of one to create) in a directory that exists") from None

    def offer(self, message: Published) -> None:
        try:
            self._file.append(message.body + b"\n")
        except OSError as exc:
            self.failed += 1
            reason = exc.strerror or str(exc)
            if self._health.fail(reason):
                log.error("platform copy: writing %s failed (%s): messages are dropped, counted in "
                          "GET /_simulator/platform, until it works again; the simulated IMDS goes on serving",
                          self.path, reason)
            return
        self.written += 1
        if self._health.recover():
            log.info("platform copy: writing %s works again (%d messages dropped so far)", self.path, self.failed)

    def stats(self) -> dict[str, Any]:
        return {"path": str(self.path), "written": self.written, "failed": self.failed,
                "failing": self._health.failing}

    def close(self, timeout: float) -> None:
        self._file.close()


class Publisher:
    """The platform copy's thread: every ``interval`` seconds, what is due goes to every output."""

    def __init__(self, copy: PlatformCopy, timeline: Timeline, outputs: Sequence[Output],
                 interval: float = 0.1) -> None:
        self.copy, self.timeline, self.outputs, self.interval = copy, timeline, tuple(outputs), interval
        self.published = self.duplicates = self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="platform-copy", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def tick(self) -> list[Published]:
        """Publish what is due now (the thread calls it; tests may too, with the thread not started)."""
        now = self.timeline.now()
        due = self.copy.due(now[1], self.timeline.approvals(), lambda t: self.timeline.wall_at(t, now))
        for message in due:
            if message.duplicate:
                self.duplicates += 1
            else:
                self.published += 1
                log.info("platform copy: %s %s", message.event_status, message.event_id)
            for output in self.outputs:
                output.offer(message)
        return due

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception:  # a bug here must not end the copy, nor the simulator
                self.errors += 1
                log.exception("platform copy: publishing failed; trying again")

    def stats(self) -> dict[str, Any]:
        return {"schema": self.copy.schema, "published": self.published, "duplicates": self.duplicates,
                "errors": self.errors, **{output.name: output.stats() for output in self.outputs}}

    def stop(self, timeout: float = 5.0) -> None:
        """One last look (what is due at the stop is sent), then the outputs close."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive():  # the copy is not thread-safe: one last look only once the thread is done
            with contextlib.suppress(Exception):
                self.tick()
        for output in self.outputs:
            output.close(timeout)


def from_settings(settings: SimulatorSettings, timeline: Timeline) -> Publisher | None:
    """The platform copy ``settings`` ask for (None: none asked for), not yet started; ConfigError says what to fix."""
    if not settings.platform:
        return None
    outputs: list[Output] = []
    if settings.platform_file is not None:
        outputs.append(FileOutput(Path(settings.platform_file)))
    if settings.platform_eventhub:
        from se_exporter.infra.azure.clients import producer_factory  # noqa: PLC0415 - the SDK, only with a hub
        from se_exporter.simulator.hub import EventHubOutput  # noqa: PLC0415 - the SDK, only with a hub

        # The sidecar forwarder's producer, with the system-assigned identity (no client id).
        outputs.append(EventHubOutput(producer_factory(settings.platform_eventhub_connection_string,
                                                       settings.platform_eventhub_name,
                                                       settings.platform_eventhub_namespace, None)))
    return Publisher(PlatformCopy(timeline.scenario, settings.platform_schema), timeline, outputs)
