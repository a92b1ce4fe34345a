"""Every test leaves pytest's process as it found it: a test that calls ``main()`` in-process (or anything else)
and leaves signal handlers, excepthooks, root log handlers or logger levels behind fails.

Pytest puts the same log-capture handlers on the root logger in setup and in teardown, so state read in this
fixture's setup and again in its teardown differs only by what the test left. Warnings filters are compared by
tests/infra/test_processwide.py only: libraries add some when first imported (urllib3, requests), whichever test that
happens in, and pytest itself drops them after each test."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from se_exporter.infra.host_os import STOP_SIGNALS as SIGNALS


def snapshot() -> dict[str, Any]:
    """The process-wide state a command may change, in a form that compares with ``==``."""
    root = logging.getLogger()
    loggers = [("", root), *logging.Logger.manager.loggerDict.items()]
    return {
        "signal handlers": {signal.Signals(signum).name: signal.getsignal(signum) for signum in SIGNALS},
        "sys.excepthook": sys.excepthook,
        "threading.excepthook": threading.excepthook,
        "root log handlers": list(root.handlers),
        "logger levels": {name or "root": logger.level for name, logger in loggers
                          if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET},
    }


@pytest.fixture(autouse=True)
def _process_left_as_found() -> Iterator[None]:
    before = snapshot()
    yield
    after = snapshot()
    changed = {key: (before[key], after[key]) for key in before if before[key] != after[key]}
    if changed:
        pytest.fail(f"the test left process-wide state changed (before, after): {changed}", pytrace=False)
