"""Settings of ``se-exporter run``: one frozen object, resolved flag -> environment -> default, validated once.

``RUN_OPTIONS`` declares every setting of the command (the machinery and the options other commands share are in
``infra/options.py``).
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from se_exporter.core import apiversion, watch
from se_exporter.core.errors import ConfigError
from se_exporter.infra.host_os import DEFAULT_STATE_DIR
from se_exporter.infra.options import (
    DEFAULT_PORT,
    EVENTHUB_OPTIONS,
    LOG_OPTIONS,
    SPEED,
    Bounded,
    EventHubs,
    Listen,
    Option,
    check_eventhubs,
    choice,
    given,
    parse_listen,
    parse_name,
    parse_path,
    parse_url,
    resolve,
    show_duration,
)
from se_exporter.sidecar.forwarding.targets import enabled_targets, target_flags
from se_exporter.sidecar.metrics import METRIC_GROUPS

DEFAULT_IMDS_URL = "http://169.254.169.254"
DEFAULT_HEARTBEAT = 300.0  # seconds; with Event Hubs: a quiet VM still reaches `se-exporter fleet` 3 times in 15 min
# Four times the chart's scrape interval (30 s): covers a Prometheus scraping every minute, with jitter to spare.
DEFAULT_SCRAPE_HOLD = 120.0
_API_VERSION = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


@dataclass(frozen=True)
class SpanBatching:
    """Batching of spans (``OTEL_BSP_*``) or log records (``OTEL_BLRP_*``, ``LOG_BATCHING``) where set, else these
    defaults. The spans' schedule delay differs from the SDK's (5 s): an update span reaches the backend within
    about half a second."""

    schedule_delay_millis: int = 500
    max_queue_size: int = 2048
    max_export_batch_size: int = 512


LOG_BATCHING = SpanBatching(schedule_delay_millis=1000)  # the SDK's defaults for log records


@dataclass(frozen=True)
class Settings(EventHubs):
    """Settings of ``se-exporter run``. Two bounds are raised rather than refused (``raised_bounds``), so that
    ``--poll-interval 10`` alone just works."""

    imds_url: str = DEFAULT_IMDS_URL
    api_version: str = apiversion.AUTO
    poll_interval: float = 1.0
    imds_timeout: float = 2.0
    first_call_timeout: float = 120.0
    max_backoff: float = 5.0
    max_document_bytes: int = 4 * 1024 * 1024
    listen: Listen = Listen("", DEFAULT_PORT)  # noqa: RUF009 - Listen is frozen: one shared default is safe
    vm_name: str | None = None
    disable_metrics: tuple[str, ...] = ()
    max_scrape_interval: float = DEFAULT_SCRAPE_HOLD
    log_level: str = "info"
    log_format: str = "text"
    simulate: str | None = None
    speed: float = 1.0
    state_dir: Path | None = None  # None: DEFAULT_STATE_DIR if writable (see state_path)
    forward_file: Path | None = None
    spool_dir: Path | None = None
    spool_max_bytes: int = 64 * 1024 * 1024
    eventhub_send_timeout: float = 10.0
    eventhub_retry_max: float = 30.0
    heartbeat_interval: float | None = None  # None: DEFAULT_HEARTBEAT with Event Hubs, else off; 0: off
    otel_traces_exporter: str = "none"
    otel_endpoint: str | None = None
    otel_traces_endpoint: str | None = None
    otel_protocol: str = "http/protobuf"
    otel_service_name: str = "se-exporter"
    otel_batch: SpanBatching = SpanBatching()
    otel_logs_exporter: str = "none"
    otel_logs_endpoint: str | None = None
    otel_logs_protocol: str = "http/protobuf"
    otel_log_batch: SpanBatching = LOG_BATCHING
    kubernetes: bool = False  # in a Kubernetes pod (KUBERNETES_SERVICE_HOST set): cloud.platform azure.aks
    k8s_node_name: str | None = None  # k8s.node.name, from the downward API (K8S_NODE_NAME)

    @property
    def heartbeat_seconds(self) -> float | None:
        """Seconds between heartbeats, or None for none (see ``--heartbeat-interval``)."""
        if self.heartbeat_interval is None:
            return DEFAULT_HEARTBEAT if self.eventhubs_enabled else None
        return self.heartbeat_interval or None

    @property
    def state_path(self) -> Path:
        return self.state_dir or Path(DEFAULT_STATE_DIR)

    @property
    def spool_path(self) -> Path:
        return self.spool_dir or self.state_path / "spool"

    @property
    def first_api_version(self) -> str:
        """The api-version asked for first, shown until IMDS answers: the pinned one, or auto's newest."""
        return apiversion.NEWEST if self.api_version == apiversion.AUTO else self.api_version

    @property
    def effective_max_backoff(self) -> float:
        """``--max-backoff`` as used: never below the poll interval."""
        return max(self.max_backoff, self.poll_interval)

    @property
    def watch_gap(self) -> float:
        """The longest time between two successful reads (or a restart's downtime) that keeps the watch:
        ``core/watch.py``."""
        return watch.allowed_gap(self.poll_interval, self.effective_max_backoff)

    @property
    def effective_first_call_timeout(self) -> float:
        """``--first-call-timeout`` as used: never below ``--imds-timeout``."""
        return max(self.first_call_timeout, self.imds_timeout)

    @property
    def raised_bounds(self) -> tuple[str, ...]:
        """One sentence per bound given below its floor and raised to it, for the start-up log: the sidecar starts
        (a sidecar that refuses to start watches nothing) but says what it uses instead of what was asked."""
        notes = []
        if self.max_backoff < self.poll_interval:
            notes.append(f"--max-backoff {self.max_backoff:g} is shorter than --poll-interval "
                         f"{self.poll_interval:g}: using {self.effective_max_backoff:g}")
        if self.first_call_timeout < self.imds_timeout:
            notes.append(f"--first-call-timeout {self.first_call_timeout:g} is shorter than --imds-timeout "
                         f"{self.imds_timeout:g}: using {self.effective_first_call_timeout:g}")
        return tuple(notes)


# ---------------------------------------------------------------- value parsers (str -> value)


def parse_api_version(text: str) -> str:
    if text.strip().lower() == apiversion.AUTO:
        return apiversion.AUTO
    if not _API_VERSION.match(text):
        raise ValueError(f"{text!r} is not an api-version like 2020-07-01, nor auto")
    return text


# The ranges of the numeric settings are in their rows of RUN_OPTIONS (help texts and docs/reference.md show them).
DOCUMENT_BYTES = Bounded(1024, 64 * 1024**2, unit="bytes")
HEARTBEAT = Bounded(0.1, 86400)
THROTTLED_BELOW = 0.2  # seconds between polls: faster than IMDS serves without throttling
SCRAPE_HOLD = Bounded(0.05, 3600)


def parse_imds_url(text: str) -> str:
    """IMDS takes no credentials, so a ``user:password@`` part can only leak: it would be printed in the start-up
    line and in every failed poll's ``url=``. Refused before anything repeats the text."""
    if re.match(r"[^/]*//[^/?#]*@", text.strip()):
        raise ValueError("holds a user name or password (user:password@); IMDS takes none: give the URL without it")
    return parse_url(text)


def parse_otlp_url(text: str) -> str:
    return parse_url(text, example="http://127.0.0.1:4318")


def parse_heartbeat(text: str) -> float:
    """Seconds between heartbeats (a duration); 0 (or 0s) or 'off' turns them off."""
    if text.strip().lower() == "off" or HEARTBEAT.read(text) == 0:
        return 0.0
    return HEARTBEAT(text)


def parse_metric_group(text: str) -> str:
    """A group of ``metrics.METRIC_GROUPS``, in any case, spaces around it ignored (``notice, impact``)."""
    return choice(*METRIC_GROUPS)(text.strip())


def parse_scrape_hold(text: str) -> float:
    """Seconds a new series is held at 0 (a duration); 0 (or 0s) holds none."""
    return 0.0 if SCRAPE_HOLD.read(text) == 0 else SCRAPE_HOLD(text)


# ---------------------------------------------------------------- the option table


RUN_OPTIONS: tuple[Option, ...] = (
    Option("imds_url", "--imds-url", parse_imds_url,
           f"IMDS base URL (default {DEFAULT_IMDS_URL}); never reached through a proxy", "URL"),
    Option("api_version", "--api-version", parse_api_version,
           f"Scheduled Events api-version to request; auto asks for {apiversion.NEWEST} and falls back to "
           f"{apiversion.FALLBACK} where IMDS does not serve it, asking again every "
           f"{apiversion.RETRY_NEWEST_SECONDS / 3600:g} h (default auto)", "VERSION"),
    # below 0.2 s IMDS throttles; 0.05 is the benchmarks' and tests' 20 Hz
    Option("poll_interval", "--poll-interval", Bounded(0.05, 3600),
           "time between polls; Azure recommends 1s (default 1s)", "DURATION"),
    Option("imds_timeout", "--imds-timeout", Bounded(0.05, 300),
           "timeout of each whole IMDS request (connect, headers and body) once IMDS has answered (default 2s)",
           "DURATION"),
    # the first call may take two minutes: five times that is plenty
    Option("first_call_timeout", "--first-call-timeout", Bounded(0.05, 600),
           "timeout until IMDS first answers: the first call enables the service and may take "
           "up to two minutes (default 2m; never shorter than --imds-timeout)", "DURATION"),
    Option("max_backoff", "--max-backoff", Bounded(0.05, 3600),
           "longest wait between polls after failures or a 429 Retry-After; kept short because a "
           "missed notice is worse than a throttled poll (default 5s; never shorter than --poll-interval)",
           "DURATION"),
    Option("max_document_bytes", "--max-document-bytes", DOCUMENT_BYTES,
           "largest IMDS body read; larger ones are rejected unread (default 4MiB)", "BYTES"),
    Option("listen", "--listen", parse_listen,
           f"where /metrics, /healthz and /readyz are served (default :{DEFAULT_PORT}, all "
           "interfaces; use 127.0.0.1:PORT to keep it local)", "HOST:PORT"),
    Option("vm_name", "--vm-name", parse_name,
           "this VM's name as listed in event Resources (default: from IMDS compute metadata)", "NAME"),
    Option("disable_metrics", "--disable-metrics", parse_metric_group,
           "metric families not to export, to save series: " + "; ".join(
               f"{group}: {what}" for group, what in METRIC_GROUPS.items()) + " (default: none)", "GROUP",
           separator=","),
    Option("max_scrape_interval", "--max-scrape-interval", parse_scrape_hold,
           "the longest interval anything scrapes /metrics at: a counter or histogram series appears when first "
           "counted, shown at 0 for this long before it counts, so that increase() of every scraper sees the first "
           f"count (default {show_duration(DEFAULT_SCRAPE_HOLD)}; 0: shown at once, the first count missed; "
           f"{SCRAPE_HOLD.describe()})",
           "DURATION"),
    *LOG_OPTIONS,
    Option("speed", "--speed", SPEED,
           "with --simulate: how many times faster than real time the scenario runs (default 1)", "FACTOR"),
    Option("state_dir", "--state-dir", parse_path,
           "where state that must survive restarts is kept: open lifecycles, the forwarding sequence "
           f"(default {DEFAULT_STATE_DIR})", "PATH"),
    Option("forward_file", "--forward-file", parse_path,
           "append every distinct document, with its properties, to this JSON-lines file", "PATH"),
    Option("spool_dir", "--spool-dir", parse_path,
           "durable queue of documents waiting for Event Hubs (default STATE_DIR/spool)", "PATH"),
    Option("spool_max_bytes", "--spool-max-bytes", Bounded(4096, 1024**4, unit="bytes"),
           "spool size limit; past it the oldest documents are dropped and counted (default 64MiB)", "BYTES"),
    *EVENTHUB_OPTIONS,
    Option("eventhub_send_timeout", "--eventhub-send-timeout", Bounded(0.1, 600),
           "timeout of one send to Event Hubs; a timed-out batch is kept and resent (default 10s)", "DURATION"),
    Option("eventhub_retry_max", "--eventhub-retry-max", Bounded(0.1, 3600),
           "longest wait between attempts while Event Hubs is unreachable (default 30s)", "DURATION"),
    Option("heartbeat_interval", "--heartbeat-interval", parse_heartbeat,
           "forward the current document again after this long without a change, marked as a heartbeat, so "
           f"consumers know the VM is alive (default {show_duration(DEFAULT_HEARTBEAT)} with Event Hubs, else off; "
           f"0 or off: never; {HEARTBEAT.describe()})", "DURATION"),
    Option("otel_traces_exporter", "--otel-traces-exporter", choice("otlp", "console", "none"),
           "where spans go: otlp, console or none (default otlp when an OTLP endpoint is set, else none)",
           "EXPORTER", env_name="OTEL_TRACES_EXPORTER"),
    Option("otel_logs_exporter", "--otel-logs-exporter", choice("otlp", "console", "none"),
           "where lifecycle transitions go as OpenTelemetry log records (events with event.name, in the event's "
           "trace): otlp, console or none (default otlp when an OTLP endpoint is set, else none)",
           "EXPORTER", env_name="OTEL_LOGS_EXPORTER"),
    Option("otel_endpoint", "--otel-endpoint", parse_otlp_url,
           "OTLP endpoint, e.g. http://tempo:4318 (http/protobuf; /v1/traces is added) or http://tempo:4317 (grpc)",
           "URL", env_name="OTEL_EXPORTER_OTLP_ENDPOINT"),
    Option("otel_protocol", "--otel-protocol", choice("http/protobuf", "grpc"),
           "OTLP protocol: http/protobuf or grpc (default http/protobuf)", "PROTOCOL",
           env_name="OTEL_EXPORTER_OTLP_PROTOCOL"),
    Option("otel_service_name", "--otel-service-name", parse_name,
           "service.name of the spans (default se-exporter)", "NAME", env_name="OTEL_SERVICE_NAME"),
    Option("simulate", "--simulate", str,
           "start the built-in IMDS simulator in-process and poll it instead of IMDS "
           "(scenarios: {scenarios}; default demo)", "SCENARIO", const="demo"),
)


def run_options(scenarios: Sequence[str]) -> tuple[Option, ...]:
    """RUN_OPTIONS with the simulator's scenarios named in --simulate's help: the CLI, which knows both programs,
    hands them in (the sidecar does not import the simulator)."""
    return tuple(replace(option, help=option.help.replace("{scenarios}", ", ".join(scenarios)))
                 if option.dest == "simulate" else option for option in RUN_OPTIONS)


def run_settings(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    values = resolve(RUN_OPTIONS, args, env)
    values.update(_otel_extras(args, env, values))
    settings = Settings(**values)
    check_eventhubs(settings)
    check_orphans(settings, given(RUN_OPTIONS, args, env))
    check_paths(settings)
    return settings


# Settings that only mean something beside another: (the setting, what it needs, the hint of the error).
_EVENTHUB_ONLY = ("spool_dir", "spool_max_bytes", "eventhub_send_timeout", "eventhub_retry_max")


def check_orphans(settings: Settings, sources: Mapping[str, str]) -> None:
    """A setting that would be ignored, or two that contradict each other, stop start-up with one line naming
    what was written (the flag or the environment variable) and what to do; nothing is ignored silently."""
    def named(dest: str) -> str:
        return sources.get(dest, "--" + dest.replace("_", "-"))

    if "speed" in sources and settings.simulate is None:
        raise ConfigError(f"{named('speed')} needs --simulate (it sets how fast the simulated scenario runs); "
                          "leave it out when polling IMDS")
    if "imds_url" in sources and settings.simulate is not None:
        raise ConfigError(f"{named('imds_url')} and {named('simulate')} exclude each other: --simulate polls its "
                          "own in-process IMDS; give one of them")
    if settings.heartbeat_interval and not enabled_targets(settings):
        raise ConfigError(f"{named('heartbeat_interval')} needs a forwarding target ({target_flags()}): "
                          "heartbeats are forwarded documents; give one, or leave it out")
    if not settings.eventhubs_enabled:
        for dest in _EVENTHUB_ONLY:
            if dest in sources:
                raise ConfigError(f"{named(dest)} is only used with Event Hubs: give --eventhub-connection-string or "
                                  f"--eventhub-namespace, or leave {named(dest)} out")


def check_paths(settings: Settings) -> None:
    """The sidecar's own files must not overlap: state saves replace files in the state directory, spool rotation
    deletes segments in the spool directory, so a forward file inside either is destroyed by the sidecar itself,
    and a spool directory that is the state directory mixes segments into the state. The spool's default place,
    STATE_DIR/spool, is the one nesting allowed."""
    state = _flag_path("--state-dir", settings.state_dir, settings.state_path)
    spool = _flag_path("--spool-dir", settings.spool_dir, settings.spool_path) if settings.eventhubs_enabled \
        else None
    if settings.forward_file is not None:
        forward = followable("--forward-file", settings.forward_file, file=True)
        for flag, (shown, directory) in (("--state-dir", state), *((("--spool-dir", spool),) if spool else ())):
            if forward.is_relative_to(directory):
                raise ConfigError(f"--forward-file {settings.forward_file} is inside {flag} {shown}: the sidecar "
                                  "replaces and deletes its own files there; choose a file outside it")
    if spool is not None:
        (spool_shown, spool_dir), (state_shown, state_dir) = spool, state
        if spool_dir == state_dir / "spool":
            return
        if spool_dir.is_relative_to(state_dir) or state_dir.is_relative_to(spool_dir):
            raise ConfigError(f"--spool-dir {spool_shown} and --state-dir {state_shown} overlap: give the spool its "
                              "own directory (the default is STATE_DIR/spool)")


def _flag_path(flag: str, given: Path | None, used: Path) -> tuple[str, Path]:
    """How an error shows a directory (the path given, or ``(default ...)``) and the directory, resolved."""
    return (str(given) if given is not None else f"(default {used})"), followable(flag, used)


def followable(flag: str, path: Path, file: bool = False) -> Path:
    """``path`` resolved, or a ``ConfigError`` saying why it cannot be: a loop of symbolic links (``resolve`` raises
    RuntimeError on Python 3.11, OSError later), or a symbolic link to nothing on the way to it, or as the directory
    itself (making it would otherwise fail with a bare "File exists"). A ``file``'s own link may point at a file yet
    to be made: appending creates it."""
    try:
        resolved = path.resolve()
    except (RuntimeError, OSError) as error:
        raise ConfigError(f"{flag} {path}: symbolic links there form a loop and cannot be followed ({error}); "
                          "give a path that leads to a real directory or file") from None
    for step in (*(() if file else (path,)), *path.parents):
        if step.is_symlink() and not step.exists():
            try:
                target = os.readlink(step)
            except OSError:
                target = "?"
            raise ConfigError(f"{flag} {path}: {step} is a symbolic link to {target}, which does not exist; create "
                              "it, or give another path")
    _check_kind(flag, path, resolved, file)
    return resolved


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISREG, "a regular file"))


def _check_kind(flag: str, path: Path, resolved: Path, file: bool) -> None:
    """A path that exists must be what the flag needs: a forward file a regular file (a FIFO blocked start-up for
    good, opening it waits for a reader; /dev/stdout cannot be read back or cut), a directory a directory."""
    try:
        mode = resolved.stat().st_mode
    except OSError:
        return  # not there yet (made at start-up) or not reachable: the open or the lock says why
    if stat.S_ISREG(mode) if file else stat.S_ISDIR(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file or directory")
    shown = f"{path} ({resolved})" if resolved != path.absolute() else str(path)
    if file:
        raise ConfigError(f"{flag} {shown} is {kind}, not a regular file: the sidecar appends to the file and reads "
                          "its end back at start-up; give the path of a regular file (or of one to create)")
    raise ConfigError(f"{flag} {shown} is {kind}, not a directory; give the path of a directory (or of one to "
                      "create)")


# The signal-specific OTEL variables: (variable, the setting it gives, the flag that wins over it, how it is read).
_OTLP_PROTOCOL = choice("http/protobuf", "grpc")
_TRACES_VARIABLES = (("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "otel_traces_endpoint", "otel_endpoint", parse_otlp_url),
                     ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "otel_protocol", "otel_protocol", _OTLP_PROTOCOL))
_LOGS_VARIABLES = (("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "otel_logs_endpoint", "otel_endpoint", parse_otlp_url),
                   ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "otel_logs_protocol", "otel_protocol", _OTLP_PROTOCOL))


def _otel_extras(args: argparse.Namespace, env: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, Any]:
    """The signal-specific OTEL variables win over the general ones, as the specification says."""
    extras = {**_signal_variables(args, env, _TRACES_VARIABLES), **_signal_variables(args, env, _LOGS_VARIABLES)}
    extras.setdefault("otel_logs_protocol", values.get("otel_protocol", "http/protobuf"))
    for signal in ("traces", "logs"):  # an exporter not named is otlp where an endpoint is set
        if f"otel_{signal}_exporter" not in values:
            endpoint_set = values.get("otel_endpoint") or extras.get(f"otel_{signal}_endpoint")
            extras[f"otel_{signal}_exporter"] = "otlp" if endpoint_set else "none"
    if (extras.get("otel_traces_exporter") or values.get("otel_traces_exporter")) != "none":
        extras["otel_batch"] = _batching(env, "OTEL_BSP", SpanBatching())
    if (extras.get("otel_logs_exporter") or values.get("otel_logs_exporter")) != "none":
        extras["otel_log_batch"] = _batching(env, "OTEL_BLRP", LOG_BATCHING)
    # Where the sidecar runs, for the resource: a pod (the API server's variable, set in every pod) on an AKS node,
    # and the node's name from the downward API (the DaemonSet sets K8S_NODE_NAME from spec.nodeName).
    extras["kubernetes"] = bool(env.get("KUBERNETES_SERVICE_HOST"))
    node = env.get("K8S_NODE_NAME", "").strip()
    if node:
        extras["k8s_node_name"] = node[:253]  # a Kubernetes name is at most 253 characters
    return extras


def _signal_variables(args: argparse.Namespace, env: Mapping[str, str],
                      variables: tuple[tuple[str, str, str, Any], ...]) -> dict[str, Any]:
    """The settings ``variables`` give (see ``_TRACES_VARIABLES``): each one set and not overridden by its flag,
    read, or refused with a ConfigError naming it."""
    found: dict[str, Any] = {}
    for name, key, flag, read in variables:
        text = env.get(name)
        if not text or getattr(args, flag, None) is not None:
            continue
        try:
            found[key] = read(text)
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return found


def _batching(env: Mapping[str, str], prefix: str, defaults: SpanBatching) -> SpanBatching:
    """``OTEL_BSP_*`` or ``OTEL_BLRP_*`` (the SDK's own variables) checked at start-up, where the SDK would log and
    fall back at the first span or record; ``defaults`` for those not set."""
    given: dict[str, int] = {}
    for suffix, key in (("SCHEDULE_DELAY", "schedule_delay_millis"), ("MAX_QUEUE_SIZE", "max_queue_size"),
                        ("MAX_EXPORT_BATCH_SIZE", "max_export_batch_size")):
        name = f"{prefix}_{suffix}"
        text = env.get(name)
        if text is None or not text.strip():
            continue
        if not text.strip().isdigit() or int(text) <= 0:
            raise ConfigError(f"{name}={text[:40]!r}: give a positive whole number")
        given[key] = int(text)
    batching = replace(defaults, **given)
    if batching.max_export_batch_size > batching.max_queue_size:
        raise ConfigError(f"{prefix}_MAX_EXPORT_BATCH_SIZE {batching.max_export_batch_size} exceeds the queue "
                          f"({batching.max_queue_size}, {prefix}_MAX_QUEUE_SIZE): give a batch no larger than it")
    return batching
