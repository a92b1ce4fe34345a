"""``--api-version auto`` against the simulator on loopback: the version used, the fallback within the same poll,
the hourly retry, outages that are not version answers, SpotRebalanceRecommendation's series and its Preempt link."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from prometheus_client import CollectorRegistry

from se_exporter.core.apiversion import FALLBACK, NEWEST, RETRY_NEWEST_SECONDS
from se_exporter.core.errors import ImdsHttpError
from se_exporter.sidecar.imds import ERROR_BODY_BYTES, ImdsClient
from se_exporter.sidecar.metrics import Metrics
from se_exporter.sidecar.poller import Poller
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import FanOut
from se_exporter.sidecar.sinks.transition_metrics import MetricsSink
from se_exporter.sidecar.snapshot import CurrentState, Snapshot
from se_exporter.sidecar.transport import KeepAliveTransport
from se_exporter.simulator.faults import Fault
from se_exporter.simulator.server import Simulator
from tests.conftest import SimulatorFactory
from tests.support.fakes import imds_http
from tests.support.fakes.imds_http import scripted_imds
from tests.support.fakes.sinks import RecordingSink


class Clock:
    """The poller's monotonic clock, moved by the test (the hourly retry without waiting an hour)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def poller_for(simulator: SimulatorFactory) -> Iterator[Callable[..., tuple[Poller, Simulator, CollectorRegistry,
                                                                            RecordingSink, Clock]]]:
    transports = []

    def make(scenario: str, api_version: str = "auto") -> tuple[Poller, Simulator, CollectorRegistry,
                                                                RecordingSink, Clock]:
        sim, server = simulator(scenario, held=True)
        settings = Settings(imds_url=server.url, api_version=api_version, vm_name=sim.vm["name"])
        transport = KeepAliveTransport()
        transports.append(transport)
        imds = ImdsClient(transport, settings.imds_url, settings.first_api_version, 2.0, 2.0, 1 << 20)
        registry = CollectorRegistry()
        state = CurrentState(Snapshot(vm_name=settings.vm_name, api_version=settings.first_api_version))
        metrics = Metrics(registry, state.get)
        sink = RecordingSink()
        clock = Clock()
        times = iter(range(10_000, 20_000))
        poller = Poller(imds, metrics, FanOut([MetricsSink(metrics), sink], on_error=lambda name: None), settings,
                        state, clock=lambda: float(next(times)), monotonic=clock)
        return poller, sim, registry, sink, clock

    yield make
    for transport in transports:
        transport.close()


def asked(sim: Simulator) -> list[str]:
    """The api-versions of the Scheduled Events requests the simulator received, in order."""
    return [parse_qs(r.query)["api-version"][0] for r in sim.requests if r.path == "/metadata/scheduledevents"]


def build_version(registry: CollectorRegistry) -> str:
    (family,) = [f for f in registry.collect() if f.name == "azure_scheduled_events_build_info"]
    return str(family.samples[0].labels["api_version"])


def test_auto_uses_the_newest_version_where_it_is_served_and_shows_the_recommendation(poller_for: Callable[..., tuple[
        Poller, Simulator, CollectorRegistry, RecordingSink, Clock]]) -> None:
    """On a VM serving 2024-07-09 the sidecar asks for it only, lists the SpotRebalanceRecommendation in its own
    rows, and says the version on build_info."""
    poller, sim, registry, _, _ = poller_for("spot-rebalance")
    sim.advance(3)
    poller.poll_once()
    assert asked(sim) == [NEWEST]
    assert build_version(registry) == NEWEST
    assert registry.get_sample_value("azure_scheduled_events_pending", {
        "event_type": "SpotRebalanceRecommendation", "event_status": "Scheduled", "affects_this_vm": "true"}) == 1.0
    assert registry.get_sample_value("azure_scheduled_events_transitions_total", {
        "event_type": "SpotRebalanceRecommendation", "transition": "scheduled", "affects_this_vm": "true"}) == 1.0


def test_a_404_falls_back_within_the_same_poll_and_is_said_once(
        poller_for: Callable[..., tuple[Poller, Simulator, CollectorRegistry, RecordingSink, Clock]],
        caplog: pytest.LogCaptureFixture) -> None:
    """IMDS 404s 2024-07-09: the same poll reads 2020-07-01 (an ok poll, no failure), the Preempt is shown, the
    recommendation never; later polls ask for the fallback only, and the log says so once."""
    poller, sim, registry, sink, _ = poller_for("spot-rebalance-unserved")
    sim.advance(41)
    with caplog.at_level(logging.INFO, "se_exporter"):
        for _ in range(3):
            poller.poll_once()
    assert asked(sim) == [NEWEST, FALLBACK, FALLBACK, FALLBACK]
    assert registry.get_sample_value("azure_scheduled_events_polls_total", {"outcome": "ok"}) == 3.0
    assert registry.get_sample_value(  # never counted: no series
        "azure_scheduled_events_polls_total", {"outcome": "http_error"}) is None
    assert build_version(registry) == FALLBACK
    assert [(t.event.event_type, t.kind.value) for c in sink.changes for t in c.transitions] == [
        ("Preempt", "scheduled")]
    assert sink.changes[0].api_version == FALLBACK
    assert sum("does not serve Scheduled Events api-version 2024-07-09" in r.getMessage()
               for r in caplog.records) == 1
    assert sum("api-version in use: 2020-07-01" in r.getMessage() for r in caplog.records) == 1


def test_the_newer_version_is_asked_for_again_after_an_hour_and_used_when_served(poller_for: Callable[..., tuple[
        Poller, Simulator, CollectorRegistry, RecordingSink, Clock]]) -> None:
    """Still refused after an hour: one request of it, then the fallback in the same poll; served after the next
    hour: it is used from then on, the recommendation appears, and nothing else makes a transition."""
    poller, sim, registry, sink, clock = poller_for("spot-rebalance-unserved")
    sim.advance(3)
    poller.poll_once()
    clock.now += RETRY_NEWEST_SECONDS - 1
    poller.poll_once()
    clock.now += 1
    poller.poll_once()
    assert asked(sim) == [NEWEST, FALLBACK, FALLBACK, NEWEST, FALLBACK]
    sim.newest_served = NEWEST
    sim.advance(40)  # the Preempt is listed now, too
    poller.poll_once()  # not an hour yet since the last retry: the fallback
    clock.now += RETRY_NEWEST_SECONDS
    poller.poll_once()
    poller.poll_once()
    assert asked(sim)[5:] == [FALLBACK, NEWEST, NEWEST]
    assert build_version(registry) == NEWEST
    assert [(t.event.event_type, t.kind.value) for c in sink.changes for t in c.transitions] == [
        ("Preempt", "scheduled"), ("SpotRebalanceRecommendation", "scheduled")]


def test_falling_back_with_a_recommendation_open_makes_no_transition(poller_for: Callable[..., tuple[
        Poller, Simulator, CollectorRegistry, RecordingSink, Clock]]) -> None:
    """IMDS stops serving 2024-07-09 while a recommendation is listed: the poller falls back in the same poll, no
    poll fails, and the recommendation is kept (not canceled) while the fallback cannot list it."""
    poller, sim, registry, sink, _ = poller_for("spot-rebalance")
    sim.advance(3)
    poller.poll_once()
    sim.newest_served = FALLBACK
    poller.poll_once()
    poller.poll_once()
    assert asked(sim) == [NEWEST, NEWEST, FALLBACK, FALLBACK]
    assert [(t.event.event_type, t.kind.value) for c in sink.changes for t in c.transitions] == [
        ("SpotRebalanceRecommendation", "scheduled")]
    assert [r.event.event_type for r in poller.snapshot.records.values()] == ["SpotRebalanceRecommendation"]
    assert registry.get_sample_value("azure_scheduled_events_polls_total", {"outcome": "ok"}) == 3.0


@pytest.mark.parametrize("status", [500, 503, 429])
def test_an_outage_is_not_a_version_answer(status: int, poller_for: Callable[..., tuple[
        Poller, Simulator, CollectorRegistry, RecordingSink, Clock]]) -> None:
    """A 5xx or a 429 on 2024-07-09 is a failed poll, and the next poll asks for 2024-07-09 again."""
    poller, sim, registry, _, _ = poller_for("spot-rebalance")
    sim.inject(Fault("status" if status != 429 else "throttle", status=status))
    poller.poll_once()
    poller.poll_once()
    assert asked(sim) == [NEWEST, NEWEST]
    outcome = "throttled" if status == 429 else "http_error"
    assert registry.get_sample_value("azure_scheduled_events_polls_total", {"outcome": outcome}) == 1.0
    assert build_version(registry) == NEWEST


def test_an_outage_during_a_retry_reads_the_fallback_in_the_same_poll(poller_for: Callable[..., tuple[
        Poller, Simulator, CollectorRegistry, RecordingSink, Clock]]) -> None:
    """The hourly retry meets a 503 (the version may be served by now, but IMDS is failing): that poll still reads
    the fallback, and the retry waits another hour."""
    poller, sim, registry, _, clock = poller_for("spot-rebalance-unserved")
    poller.poll_once()
    clock.now += RETRY_NEWEST_SECONDS
    sim.newest_served = NEWEST
    sim.inject(Fault("status", status=503))
    poller.poll_once()
    poller.poll_once()
    assert asked(sim) == [NEWEST, FALLBACK, NEWEST, FALLBACK, FALLBACK]
    assert registry.get_sample_value("azure_scheduled_events_polls_total", {"outcome": "ok"}) == 3.0


@pytest.mark.parametrize("fault", [Fault("non_json"), Fault("malformed"), Fault("invalid"), Fault("empty"),
                                   Fault("body", text="null"), Fault("huge")], ids=lambda fault: fault.kind)
def test_a_200_that_is_not_a_document_is_a_failed_retry(fault: Fault, poller_for: Callable[..., tuple[
        Poller, Simulator, CollectorRegistry, RecordingSink, Clock]], caplog: pytest.LogCaptureFixture) -> None:
    """The hourly retry of 2024-07-09 answered 200 with something that is not a document (a captive portal's page,
    cut or wrong JSON, nothing, a body past the cap): that poll reads 2020-07-01 and is ok, the retry waits another
    hour (no poll asks for 2024-07-09 again before), and the log says so once; served properly at the next retry,
    it is used."""
    poller, sim, registry, _, clock = poller_for("spot-rebalance-unserved")
    poller.poll_once()
    clock.now += RETRY_NEWEST_SECONDS
    sim.newest_served = NEWEST
    sim.inject(fault)
    with caplog.at_level(logging.WARNING, "se_exporter"):
        for _ in range(3):
            poller.poll_once()
            clock.now += 60
    assert asked(sim) == [NEWEST, FALLBACK, NEWEST, FALLBACK, FALLBACK, FALLBACK]
    assert registry.get_sample_value("azure_scheduled_events_polls_total", {"outcome": "ok"}) == 4.0
    assert registry.get_sample_value(  # never counted: no series
        "azure_scheduled_events_polls_total", {"outcome": "invalid_document"}) is None
    assert (build_version(registry), poller.snapshot.up) == (FALLBACK, True)
    assert sum("retry of Scheduled Events api-version 2024-07-09 with no document" in r.getMessage()
               for r in caplog.records) == 1
    clock.now += RETRY_NEWEST_SECONDS
    poller.poll_once()
    poller.poll_once()
    assert asked(sim)[6:] == [NEWEST, NEWEST]
    assert build_version(registry) == NEWEST


def test_garbage_to_every_retry_never_costs_a_poll() -> None:
    """IMDS answering every retry of 2024-07-09 with a 200 that is not a document, hour after hour, while 2020-07-01
    answers: each retry is followed by 2020-07-01 in the same poll, and no poll fails."""
    document = b'{"DocumentIncarnation": 1, "Events": []}'
    garbage = httpx.Response(200, content=b"<html>Sign in to the network</html>")
    hours = 3
    script = [httpx.Response(404, content=b"{}"), httpx.Response(200, content=document)]
    for _ in range(hours):  # each hour: one poll that retries, one that does not
        script += [garbage, httpx.Response(200, content=document), httpx.Response(200, content=document)]
    try:
        imds, server, _ = scripted_imds(script, api_version=NEWEST)
        registry = CollectorRegistry()
        state = CurrentState(Snapshot(api_version=NEWEST))
        metrics = Metrics(registry, state.get)
        clock = Clock()
        poller = Poller(imds, metrics, FanOut([], on_error=lambda name: None), Settings(), state, monotonic=clock)
        poller.poll_once()
        for _ in range(hours):
            clock.now += RETRY_NEWEST_SECONDS
            poller.poll_once()
            clock.now += 1
            poller.poll_once()
        assert registry.get_sample_value("azure_scheduled_events_polls_total", {"outcome": "ok"}) == 1 + 2 * hours
        assert registry.get_sample_value("azure_scheduled_events_polls_total", {"outcome": "invalid_document"}) is None
        assert (poller.snapshot.api_version, poller.snapshot.up) == (FALLBACK, True)
        assert [
            parse_qs(urlsplit(head.split()[1].decode()).query)["api-version"][0] for head in server.requests] == [
            NEWEST, FALLBACK, *[NEWEST, FALLBACK, FALLBACK] * hours]
    finally:
        imds_http.close_all()


def test_a_pinned_version_is_never_negotiated(poller_for: Callable[..., tuple[
        Poller, Simulator, CollectorRegistry, RecordingSink, Clock]]) -> None:
    """--api-version 2024-07-09 on a VM that does not serve it: failed polls (http_error), no fallback."""
    poller, sim, registry, _, clock = poller_for("spot-rebalance-unserved", api_version=NEWEST)
    poller.poll_once()
    clock.now += 2 * RETRY_NEWEST_SECONDS
    poller.poll_once()
    assert asked(sim) == [NEWEST, NEWEST]
    assert registry.get_sample_value("azure_scheduled_events_polls_total", {"outcome": "http_error"}) == 2.0
    poller2, sim2, _, _, _ = poller_for("spot-rebalance", api_version=FALLBACK)
    sim2.advance(3)
    poller2.poll_once()
    assert asked(sim2) == [FALLBACK]
    assert poller2.snapshot.records == {}


def test_the_recommendation_to_preempt_time_is_measured(poller_for: Callable[..., tuple[
        Poller, Simulator, CollectorRegistry, RecordingSink, Clock]]) -> None:
    """The Preempt that follows a recommendation is linked to it; the histogram holds the time between their first
    sightings on the monotonic clock (37 s here, where the poller's wall clock counts one second per document)."""
    poller, sim, registry, sink, clock = poller_for("spot-rebalance")
    sim.advance(3)
    poller.poll_once()
    sim.advance(37)
    clock.now += 37
    poller.poll_once()
    (change,) = [c for c in sink.changes if c.follows]
    ((key, recommendation),) = change.follows.items()
    assert (change.records[key].event.event_type, recommendation.event.event_type) == (
        "Preempt", "SpotRebalanceRecommendation")
    assert registry.get_sample_value("azure_scheduled_events_spot_rebalance_to_preempt_seconds_count") == 1.0
    assert registry.get_sample_value("azure_scheduled_events_spot_rebalance_to_preempt_seconds_sum") == 37.0


def test_a_wall_clock_stepped_back_keeps_the_preempt_linked_and_its_notice_positive(
        simulator: SimulatorFactory) -> None:
    """The poller's wall clock stepped back ten minutes between the recommendation and the Preempt, and again before
    the Preempt started: the Preempt is still linked (lead 37 s, on the monotonic clock) and its notice is the
    monotonic clock's, never negative."""
    sim, server = simulator("spot-rebalance", held=True)
    settings = Settings(imds_url=server.url, api_version=NEWEST, vm_name=sim.vm["name"])
    transport = KeepAliveTransport()
    imds = ImdsClient(transport, settings.imds_url, settings.first_api_version, 2.0, 2.0, 1 << 20)
    registry = CollectorRegistry()
    state = CurrentState(Snapshot(vm_name=settings.vm_name, api_version=settings.first_api_version))
    metrics = Metrics(registry, state.get)
    sink = RecordingSink()
    wall, elapsed = Clock(), Clock()
    wall.now = 1_800_000_000.0
    poller = Poller(imds, metrics, FanOut([MetricsSink(metrics), sink], on_error=lambda name: None), settings,
                    state, clock=wall, monotonic=elapsed)
    try:
        sim.advance(3)
        poller.poll_once()
        sim.advance(37)
        wall.now -= 600 - 37
        elapsed.now += 37
        poller.poll_once()
        (start,) = [spec.start_time(None) for spec in sim.scenario.events if spec.event_type == "Preempt"]
        sim.advance(start - sim.scenario_time() + 1)
        wall.now -= 3600
        elapsed.now += 31
        poller.poll_once()
    finally:
        transport.close()
    assert registry.get_sample_value("azure_scheduled_events_spot_rebalance_to_preempt_seconds_sum") == 37.0
    assert registry.get_sample_value("azure_scheduled_events_notice_seconds_sum",
                                     {"event_type": "Preempt", "affects_this_vm": "true"}) == 31.0


@pytest.mark.parametrize(("body", "fell_back"), [
    (b'{"error": "Bad request. api-version is invalid or was not specified in the request. For more information '
     b'refer to aka.ms/azureimds", "newest-versions": ["2020-07-01", "2019-08-01", "2019-04-01"]}', True),
    (b'{"error": "Bad request. Required metadata header not specified"}', False),
])
def test_a_400_is_a_version_answer_only_when_its_body_names_the_api_version(body: bytes, fell_back: bool) -> None:
    """IMDS's 400 for an unknown api-version (its body names it) falls back within the poll; another 400 is a
    failed poll."""
    document = b'{"DocumentIncarnation": 1, "Events": []}'
    try:
        imds, _, _ = scripted_imds([httpx.Response(400, content=body), httpx.Response(200, content=document)],
                                   api_version=NEWEST)
        registry = CollectorRegistry()
        state = CurrentState(Snapshot(api_version=NEWEST))
        metrics = Metrics(registry, state.get)
        poller = Poller(imds, metrics, FanOut([], on_error=lambda name: None), Settings(), state)
        poller.poll_once()
        assert (poller.snapshot.api_version, poller.snapshot.has_document) == (
            (FALLBACK, True) if fell_back else (NEWEST, False))
    finally:
        imds_http.close_all()


def test_a_refusal_is_read_only_as_far_as_its_first_bytes() -> None:
    """A 404 with a 20 MB body is a version answer read no further than its start: the same poll reads the
    fallback, and the error kept holds at most ERROR_BODY_BYTES of it."""
    document = b'{"DocumentIncarnation": 1, "Events": []}'
    try:
        imds, _, _ = scripted_imds([httpx.Response(404, content=b"x" * 20_000_000),
                                    httpx.Response(200, content=document)], api_version=NEWEST)
        with pytest.raises(ImdsHttpError) as refused:
            imds.scheduled_events(NEWEST)
        assert refused.value.status == 404 and 0 < len(refused.value.body) <= ERROR_BODY_BYTES
        assert imds.scheduled_events(FALLBACK) == document
    finally:
        imds_http.close_all()
