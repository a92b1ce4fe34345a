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
from tests.support.helpers import Sidecar, free_port

if TYPE_CHECKING:  # the AMQP test server needs python-qpid-proton, an integration dependency: imported when used
    from tests.support.eventhubs_server import EventHubsTestServer, Store

SimulatorFactory = Callable[..., tuple[Simulator, SimulatorServer]]
Reliability = Callable[[str, str, str], None]
# The reliability fixture and the full-run rule behind docs/reliability.md's table (pytester tests that rule); every
# test leaving the process as it found it; loopback only (tests/support/loopback.py); a failing test showing the logs
# of the processes it started (tests/support/process_logs.py).
pytest_plugins = ["tests.support.reliability", "tests.support.process_state", "tests.support.loopback",
                  "tests.support.process_logs", "pytester"]


# Modules whose tests share one expensive module-scoped set-up: under pytest-xdist each runs whole on one worker,
# so the set-up is made once, not once per worker that gets one of its tests.
SHARED_SET_UP = {
    "tests/integration/test_image.py": "the image, built with buildah (1 to 6 minutes)",
    "tests/integration/test_alerting.py": "Prometheus, Alertmanager and seven sidecars",
}


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A gzip'd parameter is named by its size, not by its bytes: gzip writes the time into its header, so the bytes
    (pytest's default id) differ between two processes collecting the suite, and pytest-xdist refuses to run when
    its workers collect different tests. (pytest numbers equal ids apart.)"""
    if isinstance(val, bytes) and val.startswith(b"\x1f\x8b"):
        return f"gzip-{len(val)}B"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On pytest-xdist's workers (``make test``), the long tests come first, costliest first: those marked
    ``long(seconds=...)`` (unit or integration tests of tens of seconds to minutes: the fuzz test's 10,000 documents,
    install.sh's virtualenv builds, the benchmarks' smoke runs), by the cost their mark gives; then the other
    integration tests (seconds each, mostly waiting on processes), then the other unit tests, each in their usual
    order, so that the short ones fill the workers' time at the end instead of one long test running alone. (The
    ``SHARED_SET_UP`` modules go first anyway: xdist hands out the scopes with most tests first.) A long test that
    started late was the run's tail: each worker is handed its next test before it runs the current one, so two long
    tests collected side by side ran one after the other on one worker while the others ran out of work. Every
    worker collects alike, so all agree on the order; a serial run keeps the collection order.

    A ``long`` test gets twice the per-test time limit (pytest-timeout's, a guard against hangs) unless it sets its
    own: CPU-bound, it shares two cores with the other workers' tests, and with busy loops beside them (make
    test-contended) the fuzz test, about 35 s of CPU, passed the 180 s limit on a machine loaded by other runs
    besides."""
    limit = float(config.getini("timeout") or 0)
    for item in items:
        if limit and item.get_closest_marker("long") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(2 * limit))
    if hasattr(config, "workerinput"):
        def rank(item: pytest.Item) -> tuple[int, float]:
            long = item.get_closest_marker("long")
            if long is not None:
                return 0, -float(long.kwargs.get("seconds", 0))
            return (1 if item.get_closest_marker("integration") is not None else 2), 0.0

        items.sort(key=rank)  # stable: the order within each rank (and among equal costs) is kept


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's default distribution (``-n`` without ``--dist``), except that each module of
    ``SHARED_SET_UP`` goes to one worker whole: every other test is handed, one at a time, to the next worker
    free. (xdist's own ``--dist loadgroup`` marks do not group with this pytest: it renames node ids through an
    attribute pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for by name: xdist's own
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 - only a parallel run gets here

    class SharedSetUpTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in SHARED_SET_UP else nodeid

    return SharedSetUpTogether(config, log)  # type: ignore[arg-type]


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
        from tests.support.eventhubs_server import EventHubsTestServer  # noqa: PLC0415 - only tests that start a hub need it

        server = EventHubsTestServer(store, port=port or free_port(), settle=settle)
        if start:
            server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
