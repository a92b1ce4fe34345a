"""The rows behind the Reliability table (docs/reliability.md), recorded by a full run of the suite only.

A test calls the ``reliability`` fixture after its assertions, so only what held is recorded. At the end of the
session the rows are written to ``.test-results/reliability.json`` under the rootdir (git-ignored; never setuptools'
``build/``) only when the run was full: every test under ``testpaths`` collected, none deselected or ignored, and
the session passed. A partial run (a file or node id, ``-k``, ``-m``, ``--deselect``, ``--lf``, a failure, an
``-x`` stop, ``--collect-only``) leaves the last full run's rows alone, and says so in its summary.
``scripts/reliability.py`` renders the table from that file and refuses a file no full run wrote.

Run in parallel (pytest-xdist, as ``make test`` runs it), each worker records the rows of the tests it ran and
counts what it deselected, and hands both to the controller when it finishes (``workeroutput``); the controller
alone decides and writes, from every worker's rows, exactly as a serial run would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Record = Callable[[str, str, str], None]  # tests name it conftest.Reliability
RESULTS = Path(".test-results") / "reliability.json"
_RECORDER = pytest.StashKey["Recorder"]()
_ROWS, _DESELECTED = "reliability_rows", "reliability_deselected"  # keys of a pytest-xdist worker's output


def partial_reason(config: pytest.Config, exitstatus: int, deselected: int) -> str | None:
    """Why this session was not a full run of the suite, or None when it was."""
    flags = {"lf": "--lf", "stepwise": "--sw", "ignore": "--ignore", "ignore_glob": "--ignore-glob",
             "collectonly": "--collect-only"}
    given = [flag for option, flag in flags.items() if getattr(config.option, option, None)]
    if exitstatus != pytest.ExitCode.OK:
        return f"the session did not pass (exit status {int(exitstatus)})"
    if deselected:
        return f"{deselected} tests deselected (-k, -m, --deselect or --sw)"
    if given:
        return f"{given[0]} was given"
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        return None
    whole = {path.resolve() for pattern in config.getini("testpaths") for path in config.rootpath.glob(pattern)}
    asked = [(config.invocation_params.dir / arg).resolve() for arg in config.args if "::" not in arg]
    covered = all(any(path == folder or folder in path.parents for folder in asked)
                  for path in whole or {config.rootpath.resolve()})
    if len(asked) != len(config.args) or not covered:
        shown = " ".join(config.args[:3]) + (f" and {len(config.args) - 3} more" if len(config.args) > 3 else "")
        return f"only {shown} of the suite was asked for"
    return None


class Recorder:
    """One session's rows, and what decides whether the session may write them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rows: set[tuple[str, str, str]] = set()
        self.deselected = 0
        self.skipped_write: str | None = None

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += len(items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """pytest-xdist's controller: a worker finished; take its rows and its count of deselected tests (every
        worker collects, and deselects, the whole suite; a worker that crashed hands over nothing, and the session
        then did not pass)."""
        output = getattr(node, "workeroutput", None) or {}
        self.rows.update((area, tried, held) for area, tried, held in output.get(_ROWS, ()))
        self.deselected = max(self.deselected, output.get(_DESELECTED, 0))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        worker_output = getattr(self.config, "workeroutput", None)
        if worker_output is not None:  # a pytest-xdist worker: the controller decides and writes
            worker_output[_ROWS] = sorted(self.rows)
            worker_output[_DESELECTED] = self.deselected
            return
        if not self.rows:
            return
        self.skipped_write = partial_reason(self.config, exitstatus, self.deselected)
        if self.skipped_write is not None:
            return
        path = self.config.rootpath / RESULTS
        path.parent.mkdir(exist_ok=True)
        rows = [dict(zip(("area", "tried", "held"), row, strict=True)) for row in sorted(self.rows)]
        document = {"run": "full", "tests": session.testscollected, "rows": rows}
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(document, indent=1) + "\n")
        temporary.replace(path)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.skipped_write is not None:
            terminalreporter.write_line(f"Reliability rows not recorded: a partial run ({self.skipped_write}); "
                                        f"{RESULTS} keeps the last full run's")


def pytest_configure(config: pytest.Config) -> None:
    recorder = Recorder(config)
    config.stash[_RECORDER] = recorder
    config.pluginmanager.register(recorder, "reliability-recorder")


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Record:
    """Record a row of the Reliability table (docs/reliability.md): call it at the end of a test, after its assertions,
    so only what held is recorded."""
    rows = request.config.stash[_RECORDER].rows

    def record(area: str, tried: str, held: str) -> None:
        rows.add((area, tried, held))

    return record
