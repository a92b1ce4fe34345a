"""Command line: ``se-exporter run`` (the sidecar) and ``se-exporter simulate`` (the IMDS double).

Every failure to start is one line on stderr and exit code 2, naming the setting to fix.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import prometheus_client
from prometheus_client import CollectorRegistry, ProcessCollector

from se_exporter import __version__, demo, logs, processwide
from se_exporter.app import IdentityWatcher, Poller, claim_state, lifecycle_store, make_forwarding, make_http_app, serve
from se_exporter.config import (
    CONSUME_OPTIONS,
    RUN_OPTIONS,
    SIMULATE_OPTIONS,
    THROTTLED_BELOW,
    Listen,
    Settings,
    SimulatorSettings,
    add_options,
    consume_settings,
    process_environment,
    run_settings,
    simulator_settings,
)
from se_exporter.errors import ConfigError
from se_exporter.fleet.settings import FLEET_OPTIONS, fleet_settings
from se_exporter.imds import ImdsClient, make_transport
from se_exporter.metrics import Metrics
from se_exporter.platform_io import PLATFORM
from se_exporter.simulator import scenario as scenarios
from se_exporter.sinks import FanOut, Sink
from se_exporter.sinks.logsink import LogSink
from se_exporter.sinks.metrics import MetricsSink

if TYPE_CHECKING:
    from se_exporter.simulator.server import Simulator

log = logging.getLogger("se_exporter")
_S = TypeVar("_S")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, exit 2: what a person or an init system log needs, without the usage dump."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="se-exporter", description=(
        "Read-only sidecar for Azure Scheduled Events: polls IMDS and exposes what it sees as Prometheus "
        "metrics. It never approves an event."))
    parser.add_argument("--version", action="version", version=f"se-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = commands.add_parser("run", help="poll IMDS and serve /metrics (the default command)",
                              description="Poll Scheduled Events and serve /metrics, /healthz and /readyz.")
    add_options(run, RUN_OPTIONS)
    run.add_argument("--simulate", nargs="?", const="demo", default=None, metavar="SCENARIO",
                     help="start the built-in IMDS simulator in-process and poll it instead of IMDS "
                          f"(scenarios: {', '.join(scenarios.builtin_names())}; default demo) "
                          "[env SE_EXPORTER_SIMULATE]")
    sim = commands.add_parser("simulate", help="serve a simulated IMDS to rehearse responders and dashboards",
                              description="Serve a faithful IMDS double (Scheduled Events, compute metadata, "
                                          "approvals) driven by a scenario, with fault injection.")
    add_options(sim, SIMULATE_OPTIONS)
    sim.add_argument("--fault", dest="faults", action="append", metavar="SPEC",
                     help="inject a fault, e.g. throttle,retry_after=2,count=3 (repeatable; see README) "
                          "[env SE_EXPORTER_SIMULATOR_FAULTS, ';'-separated]")
    sim.add_argument("--list-scenarios", action="store_true", help="print the built-in scenarios and exit")
    consume = commands.add_parser("consume", help="read forwarded documents back from Event Hubs",
                                  description="Read the documents se-exporter forwarded to Event Hubs and print "
                                              "them, to check the pipeline end to end.")
    add_options(consume, CONSUME_OPTIONS)
    fleet = commands.add_parser("fleet", help="serve one live picture of every VM from the forwarded documents",
                                description="Consume the documents every sidecar forwards to Event Hubs, keep the "
                                            "latest per VM and serve the fleet on /metrics; replicas in one "
                                            "consumer group share the partitions through a Blob checkpoint store.")
    add_options(fleet, FLEET_OPTIONS)
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (args_list[0].startswith("-") and args_list[0] not in ("-h", "--help", "--version")):
        args_list.insert(0, "run")
    args = build_parser().parse_args(args_list)
    environment = process_environment() if env is None else env
    with processwide.restored():  # handlers, hooks and logging the command installs end with it
        return _dispatch(args, environment)


def _dispatch(args: argparse.Namespace, environment: Mapping[str, str]) -> int:
    try:
        if args.command == "simulate":
            return simulate(simulator_settings(args, environment), list_only=args.list_scenarios)
        if args.command == "consume":
            from se_exporter.consume import consume

            return consume(consume_settings(args, environment))
        if args.command == "fleet":
            settings = fleet_settings(args, environment)
            from se_exporter.fleet.main import run_fleet  # the SDKs are imported only when asked for

            return run_fleet(settings)
        return run(run_settings(args, environment))
    except ConfigError as error:
        print(f"se-exporter: error: {error}", file=sys.stderr)
        return 2


def report_crash(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """Uncaught exceptions go through the log formatter, which redacts secrets, not straight to stderr."""
    log.critical("se-exporter crashed: %s", exc, exc_info=(exc_type, exc, tb))


def _install_crash_hooks() -> None:
    sys.excepthook = report_crash
    threading.excepthook = lambda args: report_crash(args.exc_type, args.exc_value or Exception(), args.exc_traceback)


def run(settings: Settings) -> int:
    logs.setup(settings.log_level, settings.log_format)
    _install_crash_hooks()
    started = time.monotonic()
    sim: Simulator | None = None
    with contextlib.ExitStack() as cleanup:  # whatever was started is stopped, also when start-up fails
        if settings.simulate is not None:
            sim, settings = _simulator(settings, cleanup)
        # Bound first: a taken port stops start-up before anything else is built, and the address is known for
        # the banner, which comes before any log line. Until the poller exists the server answers 503.
        http = _Starting()
        server = _bind(settings.listen, lambda: serve(settings.listen, http))
        cleanup.callback(server.server_close)
        cleanup.callback(server.shutdown)
        metrics_url = f"http://{_display(settings.listen, server.server_port)}/metrics"
        if sim is not None:
            print(demo.banner(settings, settings.imds_url, metrics_url, sim.scenario.name, sim.scenario.description),
                  flush=True)
        # *_created series double the output and help nobody here (the function is untyped upstream).
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        transport = make_transport()
        cleanup.callback(transport.close)
        imds = ImdsClient(transport, settings.imds_url, settings.api_version, settings.imds_timeout,
                          settings.first_timeout, settings.max_document_bytes)
        poller: Poller
        metrics = Metrics(registry, lambda: poller.snapshot)
        cleanup.enter_context(claim_state(settings))  # one sidecar per state directory, before any state is read
        store = lifecycle_store(settings)
        outputs: list[Sink] = [MetricsSink(metrics), LogSink()]
        forward = make_forwarding(settings, registry)
        if forward is not None:
            outputs.append(forward)
        if settings.otel_traces_exporter != "none":
            from se_exporter.tracing import make_tracing

            outputs.append(make_tracing(settings, store.path.parent if store else None, registry))
        sinks = FanOut(outputs, on_error=lambda name: metrics.sink_errors.labels(name).inc())
        cleanup.callback(sinks.shutdown)
        poller = Poller(imds, metrics, sinks, settings, store=store)
        http.app = make_http_app(registry, poller)

        stop = threading.Event()
        _on_signals(stop)
        watcher = IdentityWatcher(imds, poller, metrics)
        threading.Thread(target=watcher.run, args=(stop,), name="identity", daemon=True).start()

        def poll() -> None:
            watcher.first_attempt.wait(settings.imds_timeout)  # milliseconds on a VM; bounded if IMDS is slow
            poller.run(stop)

        threading.Thread(target=poll, name="poll", daemon=True).start()
        if settings.poll_interval < THROTTLED_BELOW and settings.simulate is None:
            log.warning("--poll-interval %g is below %g s: IMDS throttles above about 5 requests a second",
                        settings.poll_interval, THROTTLED_BELOW)
        log.info("se-exporter %s polling %s every %gs; metrics at %s", __version__, imds.events_url,
                 settings.poll_interval, metrics_url)
        stop.wait()
        log.info("stopping")
    if sim is not None:  # after the orderly stop: spans flushed, documents written, counts final
        print(demo.summary(demo.samples(registry), time.monotonic() - started, sim.scenario_time(), settings),
              flush=True)
    return 0


def _simulator(settings: Settings, cleanup: contextlib.ExitStack) -> tuple[Simulator, Settings]:
    """The built-in simulator, started; the settings with its address as the IMDS URL."""
    from se_exporter.simulator.server import Simulator, start  # only here: the sidecar alone never needs it

    sim = Simulator(scenarios.load(str(settings.simulate)), speed=settings.speed)
    sim_server = start(sim)
    cleanup.callback(sim_server.server_close)
    cleanup.callback(sim_server.shutdown)
    return sim, replace(settings, imds_url=sim_server.url)


class _Starting:
    """The HTTP app until the poller exists (a few milliseconds after the port is bound): 503, starting."""

    app: Callable[..., Iterable[bytes]] | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if self.app is not None:
            return self.app(environ, start_response)
        start_response("503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"starting\n"]


def simulate(settings: SimulatorSettings, list_only: bool = False) -> int:
    if list_only:
        for name in scenarios.builtin_names():
            print(f"{name:<18} {scenarios.load(name).description}")
        return 0
    logs.setup(settings.log_level, settings.log_format)
    from se_exporter.simulator.faults import parse_fault
    from se_exporter.simulator.server import Simulator, start

    simulator = Simulator(scenarios.load(settings.scenario), speed=settings.speed)
    simulator.inject(*(parse_fault(spec) for spec in settings.faults))
    server = _bind(settings.listen, lambda: start(simulator, settings.listen.host, settings.listen.port))
    print(f"IMDS simulator ({simulator.scenario.name}, speed {settings.speed:g}) at {server.url}\n"
          f"Try: curl -H Metadata:true '{server.url}/metadata/scheduledevents?api-version=2020-07-01'", flush=True)
    stop = threading.Event()
    _on_signals(stop)
    stop.wait()
    server.shutdown()
    return 0


def _bind(listen: Listen, make: Callable[[], _S]) -> _S:
    try:
        return make()
    except OSError as error:
        raise ConfigError(f"--listen {listen}: cannot listen there ({error.strerror or error})") from None


def _on_signals(stop: threading.Event) -> None:
    """SIGTERM/SIGINT/SIGHUP, or Windows' console control events: the same orderly stop (platform_io)."""
    PLATFORM.on_stop(stop.set)


def _display(listen: Listen, port: int) -> str:
    host = listen.host if listen.host not in ("", "0.0.0.0", "::") else "127.0.0.1"  # noqa: S104 - display only
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


if __name__ == "__main__":
    sys.exit(main())
