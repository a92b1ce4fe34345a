"""The log files of the processes the current test started, for its failure report (tests/support/process_logs.py).

The helpers that start a process (``Sidecar``, ``FleetProcess``, Azurite, Prometheus, Alertmanager) send its
output to a file and ``attach`` that file. Apart from the plugin so that helpers can import it before pytest
loads the plugin (pytest rewrites a plugin's asserts only if it imports it first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TAIL_BYTES = 16 * 1024


@dataclass(frozen=True)
class ChildLog:
    name: str
    path: Path
    running: Callable[[], bool]


ATTACHED: list[ChildLog] = []


def attach(name: str, path: Path, running: Callable[[], bool]) -> None:
    """Show ``path`` (the log of the process called ``name``) if the current test fails; ``running`` says whether
    the process still runs (a log outlives the test that attached it only while it does). A path attached again
    (a process restarted into the same file) is shown once, under its latest name."""
    ATTACHED[:] = [log for log in ATTACHED if log.path != path]
    ATTACHED.append(ChildLog(name, path, running))


def tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path``, from a line's start where one is near; a note when cut."""
    try:
        with path.open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(0, size - limit))
            data = file.read(limit)
    except OSError as error:
        return f"(cannot read {path}: {error})"
    if size <= limit:
        return data.decode(errors="replace")
    newline = data.find(b"\n")
    kept = data[newline + 1:] if 0 <= newline < 1024 else data
    return f"[... the first {size - len(kept)} bytes left out; whole log: {path}]\n" + kept.decode(errors="replace")
