"""Fixtures: in-process simulators on loopback (which must never see a POST from the sidecar) and sidecars."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from se_exporter.sidecar.imds import USER_AGENT
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.server import Simulator, SimulatorServer, start
from tests.helpers import Sidecar, free_port

if TYPE_CHECKING:  # the AMQP test server needs python-qpid-proton, an integration dependency: imported when used
    from tests.eventhubs_server import EventHubsTestServer, Store

SimulatorFactory = Callable[..., tuple[Simulator, SimulatorServer]]
Reliability = Callable[[str, str, str], None]
# The reliability fixture and the full-run rule behind docs/reliability.md's table (pytester tests that rule); every
# test leaving the process as it found it; loopback only (tests/loopback.py); a failing test showing the logs of the
# processes it started (tests/process_logs.py).
pytest_plugins = ["tests.reliability", "tests.process_state", "tests.loopback", "tests.process_logs", "pytester"]


@pytest.fixture
def simulator() -> Iterator[SimulatorFactory]:
    """Start simulators on 127.0.0.1:<free port>; on teardown, prove none received a POST from se-exporter."""
    started: list[tuple[Simulator, SimulatorServer]] = []

    def make(scenario: str = "live-migration", speed: float = 1.0, held: bool = False,
             **kwargs: object) -> tuple[Simulator, SimulatorServer]:
        """``held``: scenario time moves only when the test advances it (``step_through``), not with the wall
        clock, so a sidecar slow to start on a busy machine still reads the scenario's first document."""
        if held:
            kwargs["clock"] = functools.partial(float, time.time())  # its wall clock stands at the start too
        sim = Simulator(scenarios.load(scenario), speed=speed, **kwargs)  # type: ignore[arg-type]
        server = start(sim, "127.0.0.1", 0)
        started.append((sim, server))
        return sim, server

    yield make
    for sim, server in started:
        server.shutdown()
        server.server_close()
        non_get = [r for r in sim.requests if r.method != "GET" and r.user_agent.startswith("se-exporter")]
        assert sim.posts_from(USER_AGENT.split("/")[0]) == 0, f"the sidecar sent {non_get}"


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    running: list[Sidecar] = []

    def make(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Sidecar:
        process = Sidecar(list(args), tmp_path / f"sidecar{len(running)}", env, cwd)
        running.append(process)
        return process

    yield make
    for process in running:
        process.stop()


@pytest.fixture
def hubs() -> Iterator[Callable[..., EventHubsTestServer]]:
    started: list[EventHubsTestServer] = []

    def make(store: Store | None = None, port: int = 0, settle: bool = True, start: bool = True) -> EventHubsTestServer:
        from tests.eventhubs_server import EventHubsTestServer  # noqa: PLC0415 - only tests that start a hub need it

        server = EventHubsTestServer(store, port=port or free_port(), settle=settle)
        if start:
            server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
