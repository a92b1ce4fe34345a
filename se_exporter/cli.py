"""Command line: ``se-exporter run`` (the sidecar) and ``se-exporter simulate`` (the IMDS double).

Every failure to start is one line on stderr and exit code 2, naming the setting to fix. Whatever the commands tell
a person goes through ``logs.redact``: log records (the formatters), and what is printed here (``logs.say``: the
start-up error, argparse's, the banners; a crash, through the log), since a value given in a flag or a variable can
reach each of them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn

from se_exporter import __version__
from se_exporter.consume.settings import CONSUME_OPTIONS, consume_settings
from se_exporter.core.errors import ConfigError, ForwardFileError, SpoolError, StateDirError, StorageError
from se_exporter.fleet.settings import FLEET_OPTIONS, fleet_settings
from se_exporter.infra import http_server, logs, outbound, processwide
from se_exporter.infra.host_os import HOST_OS
from se_exporter.infra.options import add_options, process_environment
from se_exporter.sidecar import demo
from se_exporter.sidecar.assembly import Sidecar
from se_exporter.sidecar.settings import Settings, run_options, run_settings
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.settings import SIMULATE_OPTIONS, SimulatorSettings, simulator_settings

if TYPE_CHECKING:
    from se_exporter.simulator.server import Simulator

log = logging.getLogger("se_exporter")
# The flag that sets the path each storage error is about.
_FLAGS: dict[type[StorageError], str] = {StateDirError: "--state-dir", SpoolError: "--spool-dir",
                                         ForwardFileError: "--forward-file"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, exit 2: what a person or an init system log needs, without the usage dump."""
        self.exit(2, logs.redact(f"{self.prog}: error: {message} (see --help)\n"))


class SimulatedImds:
    """``run --simulate``: the built-in simulator, started here for the sidecar (the one place that wires the
    simulator to the sidecar: neither program imports the other)."""

    def __init__(self, settings: Settings) -> None:
        from se_exporter.simulator.server import Simulator, start  # only with --simulate

        self.simulator: Simulator = Simulator(scenarios.load(str(settings.simulate)), speed=settings.speed)
        self._server = start(self.simulator)
        self.url: str = self._server.url

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="se-exporter", description=(
        "Read-only sidecar for Azure Scheduled Events: polls IMDS and exposes what it sees as Prometheus "
        "metrics. It never approves an event."))
    parser.add_argument("--version", action="version", version=f"se-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = commands.add_parser("run", help="poll IMDS and serve /metrics (the default command)",
                              description="Poll Scheduled Events and serve /metrics, /healthz and /readyz.")
    add_options(run, run_options(scenarios.builtin_names()))
    sim = commands.add_parser("simulate", help="serve a simulated IMDS to rehearse responders and dashboards",
                              description="Serve a faithful IMDS double (Scheduled Events, compute metadata, "
                                          "approvals) driven by a scenario, with fault injection.")
    add_options(sim, SIMULATE_OPTIONS)
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
    outbound.install()  # read-only towards IMDS, whatever a command's libraries do (for good: not restored)
    with processwide.restored():  # handlers, hooks and logging the command installs end with it
        threading.excepthook = lambda args: report_crash(args.exc_type, args.exc_value or Exception(),
                                                         args.exc_traceback)
        try:
            return _dispatch(args, environment)
        except Exception as error:  # reported here: past ``restored`` Python's own hook would print it unredacted
            report_crash(type(error), error, error.__traceback__)
            return 1


def _dispatch(args: argparse.Namespace, environment: Mapping[str, str]) -> int:
    try:
        if args.command == "simulate":
            return simulate(simulator_settings(args, environment), list_only=args.list_scenarios)
        if args.command == "consume":
            from se_exporter.consume.main import consume  # the consumer brings asyncio: imported only when asked for

            return consume(consume_settings(args, environment))
        if args.command == "fleet":
            settings = fleet_settings(args, environment)
            from se_exporter.fleet.main import run_fleet  # the SDKs are imported only when asked for

            return run_fleet(settings)
        return run(run_settings(args, environment))
    except ConfigError as error:
        logs.say(f"se-exporter: error: {error}", sys.stderr)
        return 2
    except StorageError as error:
        logs.say(f"se-exporter: error: {_FLAGS[type(error)]} {error.path}: {error.reason}", sys.stderr)
        return 2


def report_crash(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """Uncaught exceptions go through the log formatter, which redacts secrets, not straight to stderr; one that
    comes before the command set up its logging gets the text format."""
    if not logging.getLogger().handlers:
        logs.setup("info", "text")
    log.critical("se-exporter crashed: %s", exc, exc_info=(exc_type, exc, tb))


def run(settings: Settings) -> int:
    logs.setup(settings.log_level, settings.log_format)
    started = time.monotonic()
    with Sidecar(settings, simulate=SimulatedImds) as sidecar:  # whatever was started is stopped, also on failure
        sidecar.listen()
        simulated, settings = sidecar.simulated, sidecar.settings
        sim = simulated.simulator if isinstance(simulated, SimulatedImds) else None
        if sim is not None:
            logs.say(demo.banner(settings, settings.imds_url, sidecar.metrics_url, sim.scenario.name,
                                 sim.scenario.description))
        stop = threading.Event()
        sidecar.start(stop)
        HOST_OS.on_stop(stop.set)  # SIGTERM/SIGINT/SIGHUP, or Windows' console control events: an orderly stop
        HOST_OS.wait_for_stop(stop)
        log.info("stopping")
    if sim is not None:  # after the orderly stop: spans flushed, documents written, counts final
        found = demo.samples(sidecar.registry, sidecar.held)
        logs.say(demo.summary(found, time.monotonic() - started, sim.scenario_time(), settings))
    return 0


def simulate(settings: SimulatorSettings, list_only: bool = False) -> int:
    if list_only:
        for name in scenarios.builtin_names():
            print(f"{name:<18} {scenarios.load(name).description}")
        return 0
    logs.setup(settings.log_level, settings.log_format)
    from se_exporter.simulator import publish
    from se_exporter.simulator.faults import parse_fault
    from se_exporter.simulator.server import every_vm, start

    first, *others = every_vm(scenarios.load(settings.scenario), speed=settings.speed)
    first.inject(*(parse_fault(spec) for spec in settings.faults))
    copy = publish.from_settings(settings, first.timeline)
    server = http_server.bind(settings.listen, lambda: start(first, settings.listen.host, settings.listen.port,
                                                             others=others, platform=copy.stats if copy else None))
    logs.say(f"IMDS simulator ({first.scenario.name}, speed {settings.speed:g}) at {server.url}\n"
             f"Try: curl -H Metadata:true '{server.url}/metadata/scheduledevents?api-version=2020-07-01'")
    if others:
        logs.say("VMs: " + ", ".join(f"{sim.vm['name']} at {server.vm_url(sim.vm['name'])}"
                                     for sim in (first, *others)))
    if copy is not None:
        copy.start()
        outputs = " and ".join(output.name for output in copy.outputs)
        logs.say(f"Platform copy ({settings.platform_schema}) to {outputs}; counts at {server.url}/_simulator/platform")
    stop = threading.Event()
    HOST_OS.on_stop(stop.set)
    HOST_OS.wait_for_stop(stop)
    server.server_close()
    if copy is not None:
        copy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
