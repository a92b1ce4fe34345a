"""Test helpers: wait on a condition with a deadline, read /metrics, run the sidecar as a process, run a benchmark's
smoke mode."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import jwt
from prometheus_client.parser import text_string_to_metric_families

from se_exporter.core.watch import Read
from se_exporter.sidecar.lifecycle_store import LifecycleStore
from se_exporter.simulator.scenario import Scenario
from tests.support.child_logs import attach

T = TypeVar("T")
# The published schema of a forwarded document (the JSON-lines file's lines and the Event Hubs messages).
FORWARDED_SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "forwarded-document.schema.json").read_text())
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "condition",
               interval: float = 0.02) -> T:
    """Return the first truthy value of ``predicate()``; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            last_error, value = exc, None  # type: ignore[assignment]
        if value:
            return value
        time.sleep(interval)  # polling interval of the wait loop itself, not a settle-sleep
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_error})"
                                                                              if last_error else ""))


def free_port() -> int:
    """A loopback port nobody listens on right now (bind it soon, or expect it refused: both are used)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def smoke_report(script: str) -> dict[str, Any]:
    """Run ``scripts/<script> --smoke`` (a benchmark at tiny sizes, to keep it working) and return the JSON report it
    prints last; fail with its output when it exits non-zero."""
    root = Path(__file__).parents[2]
    result = subprocess.run([sys.executable, str(root / "scripts" / script), "--smoke"], capture_output=True,
                            text=True, timeout=300, check=False, cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def parse_samples(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def total(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples that carry at least ``labels`` (e.g. over affects_this_vm); None if none."""
    wanted = set(labels.items())
    found = [v for (sample_name, have), v in samples.items() if sample_name == name and wanted <= have]
    return sum(found) if found else None


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (sample_name, labels) in samples if sample_name == name]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Sidecar:
    """``se-exporter run`` as a child process on a free loopback port."""

    def __init__(self, args: list[str], log_dir: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SE_EXPORTER_")
                 and k.upper() not in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")}
        # Counters shown at once: the suite reads a count as soon as it happened (the hold of a first count at 0,
        # --max-scrape-interval, is proved on its own: tests/integration/test_series.py, tests/infra/test_held.py).
        clean["SE_EXPORTER_MAX_SCRAPE_INTERVAL"] = "0"
        clean.update(env or {})
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = log_dir / "sidecar.stderr"
        self._stderr = self.stderr_path.open("wb")
        if "--state-dir" not in args:  # never the machine's default state directory, never shared between tests
            args = [*args, "--state-dir", str(log_dir / "state")]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "se_exporter", "run", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.DEVNULL, stderr=self._stderr, env=clean, cwd=cwd)
        attach(f"{log_dir.name} (se-exporter run, pid {self.process.pid})", self.stderr_path, self._running)
        match = wait_until(lambda: self._exited() or re.search(r"metrics at (http://\S+/metrics)", self.log()),
                           timeout=20, what="the sidecar to report its metrics URL")
        if match is True:
            raise AssertionError(f"sidecar exited with {self.process.returncode}: {self.log()}")
        self.metrics_url = match.group(1)
        self.base_url = self.metrics_url[: -len("/metrics")]

    def _exited(self) -> bool:
        return self.process.poll() is not None

    def _running(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def samples(self) -> Samples:
        status, body = http_get(self.metrics_url)
        assert status == 200, body
        return parse_samples(body)

    def value(self, name: str, **labels: str) -> float | None:
        return value(self.samples(), name, **labels)

    def total(self, name: str, **labels: str) -> float | None:
        return total(self.samples(), name, **labels)

    def stop(self) -> int:
        code = stop_process(self.process)
        self._stderr.close()
        return code


def stop_process(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL after 10 s; the exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def pause_process(process: Sidecar, seconds: float) -> float:
    """Stop the sidecar for ``seconds`` (SIGSTOP, then SIGCONT: POSIX only), as a frozen VM stops every thread of
    it; how long it was stopped, as measured here."""
    import signal  # noqa: PLC0415 - SIGSTOP and SIGCONT exist on POSIX only

    began = time.monotonic()
    os.kill(process.process.pid, signal.SIGSTOP)  # type: ignore[attr-defined,unused-ignore]
    try:
        time.sleep(seconds)  # the pause under test, not a settle-sleep
    finally:
        os.kill(process.process.pid, signal.SIGCONT)  # type: ignore[attr-defined,unused-ignore]
    return time.monotonic() - began


def step_through(sim: Any, process: Sidecar, until: float | None = None) -> None:
    """Walk a simulator's scenario changes; before the first and after each, wait until the sidecar has read the
    document the simulator serves then. Without the first wait, a change made before the sidecar's first poll
    (under load that poll comes well after the sidecar reports its metrics URL) hides the document it replaced:
    the sidecar never reads it, and a test expecting it waits for ever."""
    caught_up(sim, process)
    for key_time in key_times(sim.scenario):
        if until is not None and key_time > until:
            break
        sim.advance(max(0.0, key_time + 0.01 - sim.scenario_time()))
        caught_up(sim, process)


def caught_up(sim: Any, process: Sidecar) -> None:
    """Wait until the sidecar shows the incarnation the simulator serves now (a running scenario clock may move
    on meanwhile: then the newer one)."""
    def current() -> Any:
        return sim.document()["DocumentIncarnation"]

    wait_until(lambda: process.value("azure_scheduled_events_document_incarnation") == current(),
               what=f"the sidecar to read incarnation {current()}")


def key_times(scenario: Scenario) -> tuple[float, ...]:
    """Every scenario second at which the scenario's listed events change, in order (one cycle)."""
    times: set[float] = set()
    for spec in scenario.events:
        times.add(spec.appear_at)
        times.update(r.at for r in spec.reschedule if r.at < spec.end_time())
        start = spec.start_time(None)
        if spec.cancel_at is not None and spec.cancel_at < start:
            times.add(spec.cancel_at)
        else:
            times.update((start, start + spec.started_for))
    return tuple(sorted(times))


def verify(token: str, key: bytes) -> dict[str, Any]:
    """The claims of a token the IMDS simulator signed with ``key`` (its signature only: a peer checks the rest);
    ValueError if it is not one."""
    try:
        claims: dict[str, Any] = jwt.decode(token, key, algorithms=["HS256"], options={
            "verify_exp": False, "verify_nbf": False, "verify_iat": False, "verify_aud": False})
    except jwt.InvalidTokenError as error:
        raise ValueError(f"not a valid token: {error}") from None
    return claims


# Fast polls for a sidecar that is to continue a watch saved a moment before it starts: --max-backoff (reached only
# when IMDS fails) makes the allowed gap between reads 10 s (core/watch.py), longer than a start on a busy machine.
WATCHED_FAST = ("--poll-interval", "0.05", "--max-backoff", "5")


def watched_for_an_hour(state: Path, url: str) -> float:
    """What a sidecar that watched ``url`` for an hour and stopped a moment ago leaves in ``state`` (restored state
    counts as watching, if restarted within the allowed gap); the watch's start."""
    now = time.time()
    LifecycleStore(state, scope=url).save({}, watching_since=now - 3600, last_read=Read(now, time.monotonic()))
    return now - 3600
