"""The sidecar (``se-exporter run``) assembled in one place from one ``Settings``: built, started, stopped.

Order matters and is kept here alone:

1. ``listen``: the built-in simulator (``--simulate``: started by the factory the CLI hands in, so the sidecar
   never imports the simulator), then the HTTP port. A taken port stops start-up before
   anything else is built, and the address is known for the demo banner, which comes before any log line. Until
   ``start`` has built the poller the server answers 503 ``starting``.
2. ``start``: the registry's collectors, the IMDS client, the snapshot's owner (``CurrentState``), which the
   metrics read and the poller and identity watcher write, the claimed state directory, the sinks (forwarding and
   tracing only when configured: their libraries are imported only then), the poller; then the two threads.
3. ``stop`` (or leaving the ``with`` block): whatever was started is stopped in reverse order, also when start-up
   failed half-way: the sinks flushed and shut down, the state directory released, the transport, the HTTP server
   and the simulator closed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Protocol, TypeVar

import prometheus_client
from prometheus_client import CollectorRegistry, ProcessCollector

from se_exporter import __version__
from se_exporter.infra import http_server
from se_exporter.infra.held import HeldFamilies
from se_exporter.sidecar.endpoints import make_http_app
from se_exporter.sidecar.imds import ImdsClient
from se_exporter.sidecar.metrics import NAMESPACE, Metrics
from se_exporter.sidecar.pauses import PauseDetector
from se_exporter.sidecar.poller import IdentityWatcher, Poller
from se_exporter.sidecar.settings import THROTTLED_BELOW, Settings
from se_exporter.sidecar.sinks import FanOut, ImdsHealth
from se_exporter.sidecar.sinks.table import Wiring, build_sinks
from se_exporter.sidecar.snapshot import CurrentState, Snapshot
from se_exporter.sidecar.statedir import StateDir
from se_exporter.sidecar.transport import KeepAliveTransport

log = logging.getLogger("se_exporter")
_S = TypeVar("_S")


class SimulatedImds(Protocol):
    """An IMDS double started for ``run --simulate`` (the CLI's ``SimulatedImds``): where it listens, how to stop it."""

    url: str

    def close(self) -> None: ...


class Sidecar:
    """Everything ``se-exporter run`` runs. ``settings`` is final once ``listen`` has run (the simulator's URL)."""

    def __init__(self, settings: Settings, simulate: Callable[[Settings], SimulatedImds] | None = None) -> None:
        self.settings = settings
        # auto_describe: a collector without describe() (prometheus-client's ProcessCollector) is collected once at
        # registration for its names, so /metrics?name[]=... finds its families too.
        self.registry = CollectorRegistry(auto_describe=True)
        self.held = HeldFamilies(settings.max_scrape_interval)  # registered by Metrics, once its families exist
        self.simulated: SimulatedImds | None = None
        self._simulate = simulate
        self.metrics_url = ""
        self._http = _Starting()
        self._cleanup = contextlib.ExitStack()

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def listen(self) -> None:
        """The simulator if asked for, then the HTTP port (see the module docstring)."""
        if self.settings.simulate is not None:
            if self._simulate is None:
                raise ValueError("--simulate needs the simulator factory (the CLI's SimulatedImds)")
            self.simulated = self._simulate(self.settings)
            self._cleanup.callback(self.simulated.close)
            self.settings = replace(self.settings, imds_url=self.simulated.url)
        listen = self.settings.listen
        rejected = http_server.rejection_counter(self.registry, NAMESPACE, self.held)
        server = http_server.bind(listen, lambda: http_server.serve(listen, self._http, on_reject=rejected))
        self._cleanup.callback(server.server_close)
        self.metrics_url = listen.metrics_url(server.server_port)

    def start(self, stop: threading.Event) -> None:
        """Build the rest and start polling; the threads end when ``stop`` is set."""
        settings, cleanup = self.settings, self._cleanup
        # *_created series double the output and help nobody here (the function is untyped upstream).
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        if "process" not in settings.disable_metrics:
            ProcessCollector(registry=self.registry)
        transport = KeepAliveTransport()
        cleanup.callback(transport.close)
        imds = ImdsClient(transport, settings.imds_url, settings.first_api_version, settings.imds_timeout,
                          settings.effective_first_call_timeout, settings.max_document_bytes)
        state = CurrentState(Snapshot(vm_name=settings.vm_name, api_version=settings.first_api_version))
        metrics = Metrics(self.registry, state.get, held=self.held, disabled=settings.disable_metrics)
        # One sidecar per state directory, claimed before any state is read.
        state_dir = StateDir.claim(settings.state_path, settings.state_dir is not None,
                                   settings.spool_path if settings.eventhubs_enabled else None, cleanup)
        store = state_dir.lifecycle_store(settings.imds_url)
        outputs = build_sinks(Wiring(settings, state_dir, self.registry, metrics,
                                     imds_health=lambda: imds_health(state.get())))
        sinks = FanOut(outputs, on_error=lambda name: metrics.sink_errors.labels(name).inc())
        cleanup.callback(sinks.shutdown)
        pauses = PauseDetector(metrics)
        cleanup.callback(pauses.close)
        poller = Poller(imds, metrics, sinks, settings, state, store=store, pauses=pauses)
        self._http.app = make_http_app(self.registry, poller)

        watcher = IdentityWatcher(imds, poller, metrics)
        threading.Thread(target=watcher.run, args=(stop,), name="identity", daemon=True).start()

        def poll() -> None:
            watcher.first_attempt.wait(settings.imds_timeout)  # milliseconds on a VM; bounded if IMDS is slow
            poller.run(stop)

        threading.Thread(target=poll, name="poll", daemon=True).start()
        threading.Thread(target=pauses.run, args=(stop,), name="pauses", daemon=True).start()
        if settings.poll_interval < THROTTLED_BELOW and settings.simulate is None:
            log.warning("--poll-interval %g is below %g s: IMDS throttles above about 5 requests a second",
                        settings.poll_interval, THROTTLED_BELOW)
        for note in settings.raised_bounds:
            log.warning("%s", note)
        log.info("se-exporter %s polling %s every %gs; metrics at %s", __version__, imds.events_url,
                 settings.poll_interval, self.metrics_url)

    def stop(self) -> None:
        """Stop whatever was started, newest first: spans flushed, documents written, counts final."""
        self._cleanup.close()


def imds_health(snapshot: Snapshot) -> ImdsHealth:
    """What heartbeats say of IMDS: the poll loop keeps both in the snapshot (``up`` is the latest poll's outcome)."""
    return ImdsHealth(snapshot.last_success, failing=not snapshot.up)


class _Starting:
    """The HTTP app until the poller exists (a few milliseconds after the port is bound): 503, starting."""

    app: http_server.Handler | None = None

    async def __call__(self, request: http_server.HttpRequest) -> http_server.Response | None:
        if self.app is not None:
            return await self.app(request)
        return http_server.Response(503, b"starting\n")
