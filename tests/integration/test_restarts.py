"""SIGTERM and SIGKILL at random points of a scenario, repeated: nothing accepted is lost, nothing is counted twice."""

from __future__ import annotations

import os
import random
import re
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Reliability, SimulatorFactory
from tests.integration.test_eventhubs import first_copies, forwarding
from tests.support.eventhubs_server import EventHubsTestServer
from tests.support.helpers import Sidecar, key_times, wait_until

pytestmark = pytest.mark.integration
SEED = int(os.environ.get("SE_EXPORTER_RESTART_SEED", "20261122"))
TRANSITION = re.compile(r" (\S+) (scheduled|started|completed|canceled|rescheduled) transition=")


def _all_accepted(process: Sidecar) -> bool:
    changes = process.value("azure_scheduled_events_document_changes_total") or 0
    spooled = process.value("azure_scheduled_events_spool_documents") or 0
    sent = process.value("azure_scheduled_events_forwarded_documents_total", sink="eventhubs") or 0
    return changes <= spooled + sent


def test_random_sigterm_and_sigkill(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                    hubs: Callable[..., EventHubsTestServer], tmp_path: Path,
                                    reliability: Reliability) -> None:
    """Five lives of one sidecar, each ended by SIGTERM or SIGKILL at a random point of the demo scenario:
    every accepted document reaches Event Hubs (resends only with the same message id), sequence numbers are never
    reused, and no lifecycle transition is reported twice."""
    rng = random.Random(SEED)
    sim, server = simulator("demo", held=True)  # its own clock would change the document 2 s after a step, unread
    hub = hubs()
    state = tmp_path / "state"
    times = list(key_times(sim.scenario))
    cuts = sorted(rng.sample(range(1, len(times)), 4))
    chunks = [times[a:b] for a, b in zip([0, *cuts], [*cuts, len(times)], strict=True)]
    logs: list[str] = []
    endings = []
    for index, chunk in enumerate(chunks):
        process = forwarding(sidecar, server.url, state, hub.connection_string())
        for t in chunk:
            sim.advance(max(0.0, t + 0.01 - sim.scenario_time()))
            incarnation = sim.document()["DocumentIncarnation"]
            wait_until(lambda w=incarnation, p=process: p.value("azure_scheduled_events_document_incarnation") == w,
                       what=f"incarnation {incarnation}")
            # Accepted = spooled: only then does the promise hold, so the kill comes after that, at random.
            wait_until(lambda p=process: _all_accepted(p), what="document accepted")
        if index < len(chunks) - 1:
            how = rng.choice(["SIGTERM", "SIGKILL"])
            endings.append(how)
            if how == "SIGKILL":
                process.process.send_signal(signal.SIGKILL)
                process.process.wait()
            else:
                assert process.stop() == 0
        else:
            wait_until(lambda p=process: p.value("azure_scheduled_events_spool_documents") == 0, timeout=30,
                       what="spool drained")
        logs.append(process.log())

    delivered = first_copies(hub.store.all())  # fails if a message id was reused with other content
    bodies = [event.body for event in delivered]
    expected = sim.distinct_served()
    assert set(expected) <= set(bodies)
    assert sorted(expected, key=bodies.index) == expected  # first arrivals keep IMDS's order
    sequences = [event.properties["sequence"] for event in delivered]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    reported = Counter(match.groups() for log in logs for match in TRANSITION.finditer(log))
    doubled = {key: count for key, count in reported.items() if count > 1}
    assert not doubled, doubled
    ends = sorted(kind for (_, kind), _ in reported.items() if kind in ("completed", "canceled"))
    assert ends == sorted(["canceled", "completed", "completed", "completed", "completed", "canceled"])
    reliability("Restarts", f"5 lives of one sidecar ended at random points (seed {SEED}) by "
                            f"{', '.join(endings)}",
                "every accepted document delivered, resends only with the same message id; sequence never "
                "reused; no transition reported twice; every lifecycle ended once")
