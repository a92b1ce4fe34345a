"""Start-up and shutdown of ``se-exporter fleet``: clients, the HTTP endpoints, signals (what SIGTERM writes and
releases: docs/operations.md, "The fleet's replicas")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import parse_qs

import prometheus_client
from azure.eventhub.aio import EventHubConsumerClient
from azure.storage.blob.aio import ContainerClient
from prometheus_client import CollectorRegistry, ProcessCollector

from se_exporter import __version__
from se_exporter.core.retry import backoff
from se_exporter.fleet.collector import FleetMetrics, PartitionCollector, PartitionView
from se_exporter.fleet.consumer import BATCH_SIZE, EMPTY_BATCH_AFTER, ObservedCheckpointStore, Service, newest_event
from se_exporter.fleet.message import VmState
from se_exporter.fleet.platform.exposition import PlatformCollector
from se_exporter.fleet.platform.service import RECONCILE_EVERY, Platform
from se_exporter.fleet.report import Report
from se_exporter.fleet.scrape import FleetExposition, scrape
from se_exporter.fleet.settings import FleetSettings, Hub
from se_exporter.fleet.statestore import StateBlobs
from se_exporter.fleet.vms import Fleet
from se_exporter.infra import generations, http_server, logs
from se_exporter.infra.azure import amqp_types
from se_exporter.infra.azure.clients import connection_options, consumer_retry_options, describe
from se_exporter.infra.azure.credential import service_credential
from se_exporter.infra.azure.storage import ensure_container, trusting
from se_exporter.infra.host_os import HOST_OS
from se_exporter.infra.options import starting_position

log = logging.getLogger("se_exporter.fleet")
CLOSE_TIMEOUT = 8.0  # SIGTERM to exit within 10 s, whatever the peers do
C = TypeVar("C", bound=ContainerClient | ObservedCheckpointStore)


def run_fleet(settings: FleetSettings) -> int:
    logs.setup(settings.log_level, settings.log_format)
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
    return asyncio.run(_main(settings))


def on_container(kind: type[C], settings: FleetSettings, credential: Callable[[str | None], Any]) -> C:
    """A client of the container of the state blobs (the checkpoint stores' too), or a checkpoint store on it (one per
    hub read: each tells its own service what its load-balancing rounds read); ``trusting`` looks the proxy up for the
    URL its requests go to (a connection string's is parsed, no request made)."""
    name, secret = settings.checkpoint_container, settings.checkpoint_connection_string
    if secret:  # the classmethod builds cls(...): ``kind`` itself
        transport = trusting(settings.checkpoint_ca_file, str(ContainerClient.from_connection_string(secret, name).url))
        return cast(C, kind.from_connection_string(secret, name, **transport))
    url = str(settings.checkpoint_account_url)
    transport = trusting(settings.checkpoint_ca_file, url)
    return kind(url, name, credential=credential(settings.storage_client_id), **transport)


def consumer_client(settings: FleetSettings, store: ObservedCheckpointStore,
                    credential: Callable[[str | None], Any], hub: Hub) -> EventHubConsumerClient:
    options: dict[str, Any] = {
        "consumer_group": hub.consumer_group, "checkpoint_store": store,
        "load_balancing_interval": settings.load_balancing_interval,
        "partition_ownership_expiration_interval": settings.ownership_timeout,
        **connection_options(hub.endpoint, settings.eventhub_ca_file, hub.connection_string),
        **consumer_retry_options()}
    if hub.connection_string:
        return EventHubConsumerClient.from_connection_string(hub.connection_string, eventhub_name=hub.name, **options)
    return EventHubConsumerClient(
        fully_qualified_namespace=str(hub.namespace), eventhub_name=str(hub.name),
        credential=credential(settings.eventhub_client_id), **options)


def make_http_app(registry: CollectorRegistry, fleets: list[Fleet], services: list[Service],
                  clock: Callable[[], float] = time.time) -> http_server.Handler:
    """/metrics (``scrape``: the registry and the fleet's per-VM series), /healthz, /readyz and /, GET and HEAD
    only. One fleet and service per hub read."""
    exposition = FleetExposition(fleets)  # each VM's lines kept from one scrape to the next while it is unchanged

    def metrics(request: http_server.HttpRequest) -> http_server.Response:
        names = parse_qs(request.query).get("name[]")  # families selected, as prometheus-client's own app does
        return http_server.metrics(request, scrape(registry, exposition, clock(), names))

    def healthz(request: http_server.HttpRequest) -> http_server.Response:
        return http_server.text(all(each.healthy for each in services), "consumer loop running",
                                "consumer loop stalled")

    def readyz(request: http_server.HttpRequest) -> http_server.Response:
        problem = next((each.storage_problem for each in services if each.storage_problem), None)
        waiting = (f"the storage account is unreachable: {problem}" if problem
                   else "waiting for the checkpoint store or a partition's state")
        return http_server.text(all(each.ready for each in services), "partitions balanced and restored", waiting)

    return http_server.pages({"/metrics": metrics, "/healthz": healthz, "/readyz": readyz,
                              "/": lambda request: http_server.html_index("se-exporter fleet")})


async def _shut_down(readings: list[HubReading], helpers: list[asyncio.Task[Any]],
                     waiting: list[asyncio.Future[Any]]) -> None:
    """The periodic tasks cancelled (a write stuck on a slow storage must not hold the exit up), then the clients
    closed (each partition's last state and checkpoint written, its ownership released), then the rest."""
    for helper in helpers:
        helper.cancel()
    await asyncio.gather(*helpers, return_exceptions=True)
    try:
        await asyncio.wait_for(asyncio.gather(*(reading.client.close() for reading in readings)), CLOSE_TIMEOUT)
    except asyncio.TimeoutError:
        log.warning("the Event Hubs client did not close within %gs; exiting anyway", CLOSE_TIMEOUT)
    for each in waiting:
        each.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


def _reading(settings: FleetSettings, hub: Hub, metrics: FleetMetrics, platform: Platform,
             container: ContainerClient, credential: Callable[[str | None], Any]) -> HubReading:
    """One hub read: its fleet of VMs, its service with the platform's reader first, its checkpoint store's
    callbacks, its consumer client (nothing contacted yet); every hub's blobs in one container, under its name."""
    store = on_container(ObservedCheckpointStore, settings, credential)
    fleet = Fleet()
    service = Service(settings, fleet, metrics, StateBlobs(container))
    reader = platform.reader(hub.role, fleet, StateBlobs(container), lambda: service.hub_partitions,
                             StateBlobs(container), partition_vms(service, fleet))
    service.first_reader, service.keeper.beside = reader, reader
    store.on_listed = service.on_listed
    client = consumer_client(settings, store, credential, hub)
    service.newest = newest_event(client)
    return HubReading(hub, fleet, service, store, client)


def partition_vms(service: Service, fleet: Fleet) -> Callable[[], dict[str, list[VmState]]]:
    """The VMs of each owned partition the fleet shows (read on the loop, which alone changes them)."""
    return lambda: {partition_id: list(partition.state.vms.values())
                    for partition_id, partition in list(service.partitions.items()) if fleet.is_shown(partition_id)}


def _views(readings: list[HubReading]) -> dict[str, PartitionView]:
    """Each owned partition's view; the platform's hub's ids as ``platform/<id>`` when both hubs are read."""
    views: dict[str, PartitionView] = {}
    for reading in readings:
        prefix = "platform/" if reading.hub.role == "platform" and len(readings) > 1 else ""
        views.update({prefix + partition_id: view for partition_id, view in reading.service.views.items()})
    return views


def _hub_partitions(services: list[Service]) -> int | None:
    """Partitions of every hub read (what ``owned_partitions`` summed over replicas should reach)."""
    counts = [service.hub_partitions for service in services]
    return None if any(count is None for count in counts) else sum(count or 0 for count in counts)


async def _count_partitions(client: EventHubConsumerClient, service: Service, stop: asyncio.Event,
                            first: float = 5.0) -> None:
    """The hub's partition count, for the 'partitions nobody reads' alert; in the background, so that a hub
    unreachable at start delays neither start-up nor SIGTERM, and asked again (backing off to 5 minutes) until it
    answers: absent, it would take that alert away for every hub read (``_hub_partitions`` needs them all)."""
    failures = 0
    while service.hub_partitions is None and not stop.is_set():
        try:
            service.hub_partitions = len(await asyncio.wait_for(client.get_partition_ids(), 60))
        except Exception as error:  # the SDK keeps trying while receiving; the gauge stays absent until then
            failures += 1
            if failures == 1:
                log.warning("cannot read the partitions of event hub %s: %s; asking again", client.eventhub_name,
                            describe(error))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff(failures, first, 300.0))
    if failures:
        log.info("event hub %s has %s partitions", client.eventhub_name, service.hub_partitions)


def _listen(settings: FleetSettings, app: http_server.Handler, registry: CollectorRegistry) -> http_server.Server:
    server = http_server.bind(settings.listen, lambda: http_server.serve(
        settings.listen, app, on_reject=http_server.rejection_counter(registry, "azure_scheduled_fleet")))
    whose = {"sidecar": "sidecars'", "platform": "platform's"}
    hubs = " and the ".join(f"{whose[hub.role]} hub {hub.shown()} (consumer group {hub.consumer_group})"
                            for hub in settings.hubs)
    log.info("se-exporter %s fleet consuming the %s; metrics at %s", __version__, hubs,
             settings.listen.metrics_url(server.server_port))
    return server


@dataclass
class HubReading:
    """One hub read by this replica: its client, its service (callbacks, VM state) and its fleet of VMs."""

    hub: Hub
    fleet: Fleet
    service: Service
    store: ObservedCheckpointStore
    client: EventHubConsumerClient


async def _receive(settings: FleetSettings, client: EventHubConsumerClient, service: Service,
                   checking: asyncio.Task[None]) -> None:
    """Receive once the container is there: the SDK's first load-balancing round would otherwise fail on a
    container still being made and wait a whole --load-balancing-interval before it tries again."""
    await checking
    await client.receive_batch(
        service.on_batch, max_batch_size=BATCH_SIZE, max_wait_time=EMPTY_BATCH_AFTER,
        starting_position=starting_position(settings.starting_position),
        on_error=service.on_error, on_partition_initialize=service.on_initialize,
        on_partition_close=service.on_close, track_last_enqueued_event_properties=True)


async def _until_stopped(receiving: asyncio.Future[Any], stopping: asyncio.Task[Any],
                         checking: asyncio.Task[None]) -> BaseException | None:
    """Wait for a stop signal or the end of receiving; the container check's error when that comes first (a
    container that can be neither found nor made: bad configuration)."""
    waiting: set[asyncio.Future[Any]] = {receiving, stopping, checking}
    while stopping in waiting and receiving in waiting:
        done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if checking in done and checking.exception() is not None:
            return checking.exception()
    return None


def _start_helpers(settings: FleetSettings, readings: list[HubReading], platform: Platform,
                   stop: asyncio.Event) -> list[asyncio.Task[Any]]:
    """The periodic work beside receiving: each hub's checkpoints, expiry, watchdog and partition count, and the
    platform's reconciliation and reading of its peers' blobs."""
    helpers = [asyncio.create_task(work) for reading in readings for work in (
        reading.service.checkpoints(stop), reading.service.expiry(stop), reading.service.watchdog(stop),
        _count_partitions(reading.client, reading.service, stop))]
    helpers.append(asyncio.create_task(platform.run(stop, min(RECONCILE_EVERY, settings.checkpoint_interval))))
    helpers.append(asyncio.create_task(platform.peers(stop, settings.checkpoint_interval)))
    return helpers


def _failed(receiving: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Whether receiving ended on its own (not asked to stop): logged with its cause."""
    failed = receiving.done() and not stop.is_set()
    if failed:
        log.error("the Event Hubs client stopped unexpectedly: %s", describe(
            (receiving.exception() if not receiving.cancelled() else None) or Exception("no error")))
    return failed


async def _main(settings: FleetSettings, credential: Callable[[str | None], Any] = service_credential) -> int:
    filled = amqp_types.install()  # else one message with an AMQP char property stops its partition for good
    if filled:
        log.debug("AMQP decoders added to the Event Hubs SDK for constructors %s", ", ".join(map(hex, filled)))
    # auto_describe: the process collector has no describe(); collected once at registration for its names, so
    # /metrics?name[]=... finds its families too.
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    metrics = FleetMetrics(registry)
    platform = Platform(metrics, Report(metrics), settings.platform_retention, settings.reconcile_grace,
                        settings.vm_expiry, settings.max_message_bytes, time.time)
    registry.register(PlatformCollector(lambda: platform.view))
    async with contextlib.AsyncExitStack() as cleanup:
        credentials: dict[str | None, Any] = {}

        def shared(client_id: str | None) -> Any:
            """One credential per identity, for Event Hubs and storage alike, closed at exit (an HTTP session)."""
            if client_id not in credentials:
                credentials[client_id] = credential(client_id)
                cleanup.push_async_callback(credentials[client_id].close)
            return credentials[client_id]

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        HOST_OS.on_stop_async(loop, stop.set)  # SIGTERM/SIGINT/SIGHUP, or Windows' console control events
        container = on_container(ContainerClient, settings, shared)
        cleanup.push_async_callback(container.close)
        readings = [_reading(settings, hub, metrics, platform, container, shared) for hub in settings.hubs]
        for reading in readings:
            cleanup.push_async_callback(reading.store.close)  # the consumer client does not close it
        fleets, services = [reading.fleet for reading in readings], [reading.service for reading in readings]
        metrics.shown_partitions.set_function(lambda: sum(len(fleet.shown()) for fleet in fleets))
        # Listening (and the signal handlers above) before any contact with the storage or Event Hubs: a busy
        # port fails at once, /healthz answers and SIGTERM works while they are unreachable.
        server = _listen(settings, make_http_app(registry, fleets, services), registry)
        cleanup.callback(server.server_close)
        registry.register(PartitionCollector(lambda: _views(readings), lambda: _hub_partitions(services)))
        helpers = _start_helpers(settings, readings, platform, stop)

        def storage_problem(cause: str | None) -> None:
            for service in services:
                service.storage_problem = cause

        # Everything made so far lives as long as the process: out of full collections' sight (docs/performance.md).
        cleanup.callback(generations.freeze_from_now().remove)  # and each full collection's survivors after them
        checking = asyncio.create_task(ensure_container(container, settings.checkpoint_container, storage_problem))
        receiving = asyncio.gather(*(_receive(settings, reading.client, reading.service, checking)
                                     for reading in readings))
        stopping = asyncio.create_task(stop.wait())
        unusable = await _until_stopped(receiving, stopping, checking)
        failed = unusable is None and _failed(receiving, stop)  # an unusable container is raised below instead
        log.info("stopping: releasing %d partitions", sum(len(fleet.owned()) for fleet in fleets))
        stop.set()
        await _shut_down(readings, helpers, [receiving, stopping, checking])
    if unusable is not None:
        raise unusable
    return 1 if failed else 0
