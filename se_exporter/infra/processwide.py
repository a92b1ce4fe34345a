"""What a command changes in the whole process, put back when ``main()`` returns.

Running the sidecar takes over process-wide state: SIGTERM/SIGINT/SIGHUP handlers, ``sys.excepthook`` and
``threading.excepthook`` (crashes go through the redacting log formatter), the root logger's handlers and the
levels of the loggers it quiets, and warnings filters set while its libraries import. A process exits after
that, so nothing is lost there; but a program (or a test suite) that calls ``main()`` and goes on would keep
handlers aimed at a stopped sidecar and a log handler writing to a stream it may since have closed. ``restored()``
records that state before a command runs and puts it back after, however the command ends.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from se_exporter.infra.host_os import STOP_SIGNALS


@contextmanager
def restored() -> Iterator[None]:
    """Run the body, then put back signal handlers, excepthooks, logging and warnings filters as they were."""
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    excepthook, thread_excepthook = sys.excepthook, threading.excepthook
    root = logging.getLogger()
    root_handlers, levels = root.handlers[:], _levels()
    try:
        with warnings.catch_warnings():  # restores the filters on the way out
            yield
    finally:
        for added in root.handlers:
            if added not in root_handlers:
                added.close()
        root.handlers[:] = root_handlers
        for name, logger in [("", root), *logging.Logger.manager.loggerDict.items()]:
            wanted = levels.get(name, logging.NOTSET)  # a logger made meanwhile had no level of its own
            if isinstance(logger, logging.Logger) and logger.level != wanted:
                logger.setLevel(wanted)
        sys.excepthook, threading.excepthook = excepthook, thread_excepthook
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for signum, previous in handlers.items():
                if previous is not None:  # None: set from outside Python, cannot be put back from here
                    signal.signal(signum, previous)


def _levels() -> dict[str, int]:
    loggers = [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]
    return {name: logger.level for name, logger in loggers if isinstance(logger, logging.Logger)}
