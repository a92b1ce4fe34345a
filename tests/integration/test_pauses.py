"""The real sidecar, paused with SIGSTOP/SIGCONT: what it felt, whose pause it was, and what a loaded machine is not."""

from __future__ import annotations

import multiprocessing
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from se_exporter.simulator.faults import Fault
from tests.conftest import SimulatorFactory
from tests.support.helpers import Sidecar, pause_process, series, wait_until
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP and SIGCONT are POSIX signals")]
FREEZE_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"  # live-migration's Freeze
FREEZE_STARTS = 902.0  # scenario seconds: appears at 2, 900 s of notice
HISTOGRAM = "azure_scheduled_events_pause_seconds"
A = "azure.scheduled_event."


def otlp(receiver: OtlpReceiver) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_BLRP_SCHEDULE_DELAY": "100"}


def felt(process: Sidecar, event_type: str) -> tuple[float, float] | None:
    """The histogram's count and sum for ``event_type``, once it has any."""
    samples = process.samples()
    count = samples.get((f"{HISTOGRAM}_count", frozenset({("event_type", event_type)})))
    total = samples.get((f"{HISTOGRAM}_sum", frozenset({("event_type", event_type)})))
    return None if count is None or total is None else (count, total)


def test_a_pause_during_a_started_freeze_is_that_freezes(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                                         receiver: OtlpReceiver) -> None:
    """One pause on the histogram, the event's gauge, a span in the event's trace and a log record."""
    sim, server = simulator("live-migration", held=True)
    sim.advance(FREEZE_STARTS)
    process = sidecar("--imds-url", server.url, env=otlp(receiver))
    wait_until(lambda: process.value("azure_scheduled_event_info", event_id=FREEZE_ID, event_type="Freeze",
                                     event_status="Started", event_source="Platform",
                                     resource_type="VirtualMachine", affects_this_vm="true"),
               what="the Freeze listed as Started")
    assert process.value("azure_scheduled_event_longest_pause_seconds", event_id=FREEZE_ID, event_type="Freeze") == 0
    stopped = pause_process(process, 2.0)
    count, seconds = wait_until(lambda: felt(process, "Freeze"), what="the pause on the histogram")
    assert count == 1
    assert 1.7 <= seconds <= 2.6 and seconds <= stopped + 0.05, (seconds, stopped)
    longest = wait_until(lambda: process.value("azure_scheduled_event_longest_pause_seconds", event_id=FREEZE_ID,
                                               event_type="Freeze"), what="the Freeze's longest pause")
    assert longest == pytest.approx(seconds)
    assert felt(process, "none") is None
    assert "paused for" in process.log() and FREEZE_ID in process.log()
    (span,) = wait_until(lambda: receiver.named("scheduled_event.pause"), what="the pause span")
    (root,) = receiver.named("scheduled_event.update")
    assert span.trace_id == root.trace_id and span.parent_id == root.parent_id  # under the event's root span
    assert span.attributes[A + "pause_seconds"] == pytest.approx(seconds, abs=0.001)
    assert (span.end_ns - span.start_ns) / 1e9 == pytest.approx(seconds, abs=0.001)
    (record,) = wait_until(lambda: receiver.events(A + "pause"), what="the pause's log record")
    assert (record.trace_id, record.attributes[A + "id"]) == (span.trace_id, FREEZE_ID)


def test_a_pause_with_nothing_listed_is_unannounced(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                                   receiver: OtlpReceiver) -> None:
    """Idle (nothing listed: no detector thread awake), the poll loop's own lateness finds it: P-1 to P seconds.
    A log record in no trace, no span."""
    _, server = simulator("live-migration", held=True)  # the Freeze appears at 2 s of scenario time: not yet
    process = sidecar("--imds-url", server.url, env=otlp(receiver))
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="a first document")
    stopped = pause_process(process, 3.0)
    count, seconds = wait_until(lambda: felt(process, "none"), what="the pause on the histogram")
    assert count == 1
    assert stopped - 1.2 <= seconds <= stopped + 0.05, (seconds, stopped)
    assert not series(process.samples(), "azure_scheduled_event_longest_pause_seconds")
    (record,) = wait_until(lambda: receiver.events(A + "pause"), what="the pause's log record")
    assert not record.trace_id and record.attributes[A + "pause_seconds"] == pytest.approx(seconds, abs=0.001)
    assert not receiver.named("scheduled_event.pause")


def test_a_pause_past_the_poll_timeout_is_not_an_imds_failure(simulator: SimulatorFactory,
                                                             sidecar: Callable[..., Sidecar]) -> None:
    """A request in flight when the VM stops times out when it resumes: the VM did not run, IMDS did not fail."""
    sim, server = simulator("live-migration", held=True)
    process = sidecar("--imds-url", server.url, "--imds-timeout", "1")
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="a first document")
    before = len(sim.requests)
    sim.inject(Fault("hang", seconds=10))  # the next request is never answered in time
    wait_until(lambda: len(sim.requests) > before, what="the sidecar's request to hang")
    pause_process(process, 3.0)
    wait_until(lambda: felt(process, "none"), what="the pause on the histogram")
    wait_until(lambda: len(sim.requests) > before + 1, what="the poll asked again")
    samples = process.samples()
    assert not [labels for labels in series(samples, "azure_scheduled_events_polls_total")
                if labels["outcome"] != "ok"]
    assert process.value("azure_scheduled_events_up") == 1
    assert "IMDS poll failed" not in process.log()


def _spin(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    while not stop.is_set():
        pass


@contextmanager
def busy_loops(count: int = 2) -> Iterator[None]:
    stop = multiprocessing.Event()
    loops = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(count)]
    for loop in loops:
        loop.start()
    try:
        yield
    finally:
        stop.set()
        for loop in loops:
            loop.join(5)


def test_a_loaded_machine_is_not_a_frozen_vm(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar]) -> None:
    """Armed (a Freeze Started) for 10 s beside two busy loops: no pause counted, no throttling either."""
    sim, server = simulator("live-migration", held=True)
    sim.advance(FREEZE_STARTS)
    with busy_loops():
        process = sidecar("--imds-url", server.url)
        wait_until(lambda: process.value("azure_scheduled_event_longest_pause_seconds", event_id=FREEZE_ID,
                                         event_type="Freeze") is not None, what="the Freeze listed", timeout=20)
        polls = process.total("azure_scheduled_events_polls_total")
        wait_until(lambda: process.total("azure_scheduled_events_polls_total") >= polls + 10,  # type: ignore
                   what="ten more polls", timeout=30)
        samples = process.samples()
    assert not series(samples, f"{HISTOGRAM}_count")
    assert not series(samples, "azure_scheduled_events_throttled_pauses_total")


def test_an_events_pauses_survive_a_kill_9(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                           tmp_path: Path) -> None:
    """The pause is saved with the open lifecycle: the sidecar killed after it and started again shows it still."""
    sim, server = simulator("live-migration", held=True)
    sim.advance(FREEZE_STARTS)
    state = str(tmp_path / "kept-state")
    first = sidecar("--imds-url", server.url, "--state-dir", state)
    wait_until(lambda: first.value("azure_scheduled_event_longest_pause_seconds", event_id=FREEZE_ID,
                                   event_type="Freeze") == 0, what="the Freeze listed")
    pause_process(first, 1.0)
    longest = wait_until(lambda: first.value("azure_scheduled_event_longest_pause_seconds", event_id=FREEZE_ID,
                                             event_type="Freeze"), what="the pause on the gauge")
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)
    again = sidecar("--imds-url", server.url, "--state-dir", state)
    assert wait_until(lambda: again.value("azure_scheduled_event_longest_pause_seconds", event_id=FREEZE_ID,
                                          event_type="Freeze") is not None, what="the Freeze listed again") \
        and again.value("azure_scheduled_event_longest_pause_seconds", event_id=FREEZE_ID,
                        event_type="Freeze") == pytest.approx(longest, abs=0.001)
