"""Run se-exporter (``python scripts/named_threads.py run ...``) with each Python thread's name on its OS thread.

Python 3.11 leaves every thread of a process with the process's name, so /proc/PID/task/TID cannot say which
thread is the poll loop and which the HTTP server. The benchmark reads CPU and wake-ups per thread from there;
this launcher writes each thread's name (cut to the kernel's 15 bytes) to /proc/self/task/TID/comm as the thread
starts, and otherwise runs exactly ``se-exporter``: one write per thread start, no import beyond the standard
library's, nothing else changed.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any


def name_os_thread(name: str) -> None:
    try:
        fd = os.open(f"/proc/self/task/{threading.get_native_id()}/comm", os.O_WRONLY)
    except OSError:
        return  # not Linux: the names are a convenience, the figures do not depend on them
    try:
        os.write(fd, name.encode()[:15])
    except OSError:
        pass
    finally:
        os.close(fd)


_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named_bootstrap_inner(self: threading.Thread, *args: Any) -> None:
    name_os_thread(self.name)
    _bootstrap_inner(self, *args)


threading.Thread._bootstrap_inner = _named_bootstrap_inner  # type: ignore[attr-defined]

if __name__ == "__main__":
    name_os_thread("main")
    from se_exporter.cli import main

    sys.exit(main())
