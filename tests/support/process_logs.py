"""A failing test shows the logs of the processes it started: the tail of each child's log file goes into pytest's
failure report as a section of its own ("log of sidecar0 (se-exporter run, pid ...)").

A failing phase (setup, call or teardown) of a test shows every log attached during the test
(``tests.support.child_logs.attach``), and those of processes started earlier (a module's fixture) that still run. Each
log is cut to its last ``TAIL_BYTES``: the end of a log is where a failure shows, and a report stays readable.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.support.child_logs import ATTACHED, tail


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    ATTACHED[:] = [log for log in ATTACHED if log.running()]  # what earlier tests left running
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for log in ATTACHED:
            report.sections.append((f"log of {log.name} ({call.when})", tail(log.path) or "(empty)"))
    return report
