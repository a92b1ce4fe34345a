"""One sidecar per state directory: an OS lock on ``<directory>/lock``, held for the life of the process.

Two sidecars on one ``--state-dir`` (a second manual start, a DaemonSet rolling update on a shared
hostPath) would share one spool and one sequence file: both would hand out the same sequence numbers
(message ids repeated with different bodies) and delete each other's spool segments. The kernel drops
the lock when the process ends, however it ends (``kill -9`` too), so unlike a pid file there is never a
stale lock to clean up by hand. The holder writes its pid into the file, only so that the refusal can
say who holds it.

The platform part is ``HOST_OS.try_lock`` (host_os): ``fcntl.flock`` on Linux and macOS,
``msvcrt.locking`` on a byte past the pid on Windows, where a locked range cannot be read by others.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
from pathlib import Path

from se_exporter.infra.host_os import HOST_OS

LOCK_FILE = "lock"
PID_WIDTH = 32


# What flock answers on a filesystem that has no locks (some NFS and FUSE mounts): not a reason to refuse to run.
UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


class DirectoryBusy(Exception):
    """Another process holds the lock; ``pid`` is the one it wrote, if it could be read."""

    def __init__(self, directory: Path, pid: int | None) -> None:
        super().__init__(f"{directory} is locked by process {pid if pid is not None else '(unknown)'}")
        self.directory = directory
        self.pid = pid


def lock_directory(directory: Path) -> io.FileIO:
    """Take the directory's lock without waiting: held while the lock file returned is open (closing its only
    descriptor lets it go); ``DirectoryBusy`` if another process has it, OSError if the directory cannot hold a lock
    file (not writable) or its filesystem has no locks (errno in ``UNSUPPORTED``)."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | HOST_OS.open_flags, 0o644)
    try:
        if not HOST_OS.try_lock(fd):
            raise DirectoryBusy(directory, _holder(fd))
    except BaseException:
        os.close(fd)
        raise
    # A fixed width overwrites any older pid without truncating: Windows may refuse to cut a file that has a locked
    # range. On a full disk the write fails and the lock holds all the same; a refused second process cannot name us.
    with contextlib.suppress(OSError):
        HOST_OS.pwrite(fd, f"{os.getpid():<{PID_WIDTH - 1}}\n".encode(), 0)
    return os.fdopen(fd, "r+b", buffering=0)


def _holder(fd: int) -> int | None:
    try:
        text = HOST_OS.pread(fd, PID_WIDTH, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
