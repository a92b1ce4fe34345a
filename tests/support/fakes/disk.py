"""A disk that fills up, for the whole-or-nothing writes of the spool and the forward file."""

from __future__ import annotations

import errno
import os
import threading

from se_exporter.infra.files import Disk


class FullDisk(Disk):
    """A disk with ``room`` bytes left: a write past it is short, the next one fails with ENOSPC, as on a full
    filesystem. ``fail_sync``/``fail_truncate`` make those calls fail the same way (delayed allocation, EIO)."""

    def __init__(self, room: float = float("inf")) -> None:
        self.room = room
        self.fail_sync = False
        self.fail_truncate = 0  # how many ftruncate calls fail from now on
        self.lock = threading.Lock()

    def write(self, fd: int, data: memoryview) -> int:
        with self.lock:
            if self.room <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            part = data[: int(min(len(data), self.room))]
            written = os.write(fd, part)
            self.room -= written
            return written

    def fdatasync(self, fd: int) -> None:
        if self.fail_sync:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fdatasync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        if self.fail_truncate:
            self.fail_truncate -= 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.ftruncate(fd, size)
