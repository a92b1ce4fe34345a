"""The state directory, claimed and checked once at start-up; it hands out where each kind of state is kept.

State that must survive a restart: open lifecycles (``lifecycle.json``), span events of open events
(``spans.json``), the forwarding sequence (``forwarding.json``), and by default the Event Hubs spool (``spool/``).
One sidecar per directory, and what happens to a default one that cannot be written: docs/forwarding.md ("One
sidecar per state directory"). An explicit ``--state-dir`` must work.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from se_exporter.core.errors import SpoolError, StateDirError, StorageError
from se_exporter.infra.dirlock import UNSUPPORTED, DirectoryBusy, lock_directory
from se_exporter.sidecar.lifecycle_store import LifecycleStore

log = logging.getLogger("se_exporter")


class StateDir:
    """Where state is kept. ``kept`` is the directory lifecycles and span events go to, or None when the default
    directory cannot be written; ``path`` (the forwarding sequence) and ``spool`` are used whenever forwarding is."""

    def __init__(self, path: Path, spool: Path, kept: Path | None) -> None:
        self.path, self.spool, self.kept = path, spool, kept

    @classmethod
    def claim(cls, path: Path, explicit: bool, spool: Path | None, held: contextlib.ExitStack) -> StateDir:
        """Lock ``path`` (and ``spool``, given when Event Hubs is on, if outside it) until ``held`` is closed, then
        check that ``path`` can be written. Raises ``StateDirError``/``SpoolError``."""
        directories: list[tuple[type[StorageError], Path, bool]] = [(StateDirError, path, explicit)]
        if spool is not None and not spool.resolve().is_relative_to(path.resolve()):
            directories.append((SpoolError, spool, True))
        for error, directory, must in directories:
            _lock(held, error, directory, must)
        return cls(path, spool or path / "spool", path if _writable(path, explicit) else None)

    def lifecycle_store(self, scope: str) -> LifecycleStore | None:
        """Where open lifecycles are kept (belonging to the IMDS endpoint ``scope``), or None."""
        return LifecycleStore(self.kept, scope=scope) if self.kept is not None else None


def _lock(held: contextlib.ExitStack, error: type[StorageError], directory: Path, must: bool) -> None:
    """Lock ``directory`` until ``held`` is closed: one another se-exporter holds is ``error``; one that cannot be
    written is ``error`` when it ``must`` be; a filesystem without locks is said and used."""
    try:
        held.enter_context(lock_directory(directory))
    except DirectoryBusy as busy:
        holder = f"pid {busy.pid}" if busy.pid is not None else "a process whose pid is unknown"
        raise error(directory, f"already used by another se-exporter ({holder}); give each instance its "
                               "own directory") from None
    except OSError as exc:
        if exc.errno in UNSUPPORTED:
            log.warning("%s %s: its filesystem cannot lock files (%s); make sure no other se-exporter uses it",
                        "--state-dir" if error is StateDirError else "--spool-dir", directory, exc.strerror)
        elif must:
            raise error(directory, f"cannot write there ({exc.strerror or exc})") from None


def _writable(directory: Path, explicit: bool) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        if explicit:
            raise StateDirError(directory, f"cannot write there ({exc.strerror})") from None
        log.warning("cannot write %s (%s): open lifecycles will not survive a restart; set --state-dir",
                    directory, exc.strerror)
        return False
    return True
