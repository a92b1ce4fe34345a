"""Crash-safe file writes, shared by everything that keeps state on disk (spool, sequence, lifecycles, spans).

Appends that must be all-or-nothing (a spool record, a forward file line) go through ``Disk``, the three system
calls they make, so that a test can hand in a disk that fills up at any chosen byte without patching ``os``. On a
full disk ``write(2)`` first returns fewer bytes than asked and only the next call fails: ``write_all`` loops.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
from pathlib import Path

from se_exporter.core.retry import Health
from se_exporter.infra.host_os import HOST_OS

STATE_FILE_LIMIT = 256 * 1024 * 1024  # far above any state this project writes; a bound on what a read may hold


def read_state_file(path: Path, limit: int = STATE_FILE_LIMIT) -> bytes:
    """The bytes of a state file, which must be a regular file of at most ``limit`` bytes.

    Anything else in its place (a FIFO would block start-up, a link to ``/dev/zero`` read without end) fails with
    ``OSError``, as an unreadable file does. Opened non-blocking (POSIX), so that opening a FIFO cannot hang.
    """
    fd = os.open(path, os.O_RDONLY | HOST_OS.fifo_flags | HOST_OS.open_flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > limit:  # grew while read
                raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class Disk:
    """The system calls of an append: the real ones. Tests subclass it to fail at a chosen byte."""

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        HOST_OS.datasync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)


DISK = Disk()


def write_all(disk: Disk, fd: int, data: bytes) -> None:
    """Write every byte of ``data`` or raise: a short write is continued until the error that stopped it shows."""
    view = memoryview(data)
    while view:
        written = disk.write(fd, view)
        if written <= 0:  # no progress and no error: treat it as the full disk it almost certainly is
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


class NotRegularFile(OSError):
    """What ``LineFile`` found at its path is not a regular file (a FIFO, a device, a directory)."""


class LineFile:
    """A file appended to a whole line at a time: a line that fails half-way (a full disk, a failed sync) is cut off
    again, so the file never holds a line reported as failed and the next one starts clean."""

    def __init__(self, path: Path, disk: Disk = DISK, sync: bool = False) -> None:
        """``OSError`` when it cannot be appended to: ``NotRegularFile``, or ENXIO for a FIFO (POSIX: at once)."""
        self.path, self._disk, self._sync = path, disk, sync
        self._torn: int | None = None  # where the file must be cut before the next line (a cut that failed)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | HOST_OS.fifo_flags | HOST_OS.open_flags,
                          0o666)
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))

    def append(self, line: bytes) -> None:
        """Write (and with ``sync``, sync) the whole line, or raise ``OSError`` and keep nothing of it."""
        if self._torn is not None:
            self._disk.ftruncate(self.fd, self._torn)
            self._torn = None
        size = os.fstat(self.fd).st_size
        try:
            write_all(self._disk, self.fd, line)
            if self._sync:
                self._disk.fdatasync(self.fd)
        except OSError:
            try:
                self._disk.ftruncate(self.fd, size)
            except OSError:
                self._torn = size
            raise

    def close(self) -> None:
        os.close(self.fd)


def is_disk_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


def write_atomically(path: Path, data: bytes) -> None:
    """Write, fsync, rename, fsync the folder: after a crash the file is old or new, never torn.

    On Windows the rename is retried for a moment while another process holds the target (see host_os).
    """
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        HOST_OS.replace(temp, str(path))
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    HOST_OS.sync_directory(path.parent)


class StateFile:
    """A state file rewritten whole (``write_atomically``) after each change. While writes fail the process goes
    on from memory: one warning when they start failing, one info line when one succeeds again, never a line per
    attempt (``retry.Health``). ``failing`` and ``recovered`` are the two lines, with the path (and the error)."""

    def __init__(self, path: Path, log: logging.Logger, failing: str, recovered: str) -> None:
        self.path = path
        self._log, self._failing, self._recovered = log, failing, recovered
        self._health = Health()

    def save(self, data: bytes, make_parent: bool = False) -> bool:
        """Write ``data``; False (logged once) when it could not be written."""
        try:
            if make_parent:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, data)
        except OSError as exc:
            if self._health.failing is None:
                self._log.warning(self._failing, self.path, exc.strerror or exc)
            self._health.fail(str(exc))
            return False
        if self._health.recover():
            self._log.info(self._recovered, self.path)
        return True

