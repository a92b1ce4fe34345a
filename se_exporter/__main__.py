"""``python -m se_exporter`` and the ``se-exporter`` command (``entry``).

A stop signal that arrives while the modules are still loading (~0.2 s) would otherwise print a
KeyboardInterrupt traceback (SIGINT) or end the process with 143 (SIGTERM): the command installs its own
stop handlers only once it runs. Until then a stop signal ends the process quietly with exit 0, as a stop
does once it runs (docs/traces.md, "Shutdown"); there is nothing to flush yet.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import NoReturn

from se_exporter.infra.host_os import STOP_SIGNALS


def _stopped_while_starting(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(0)


def entry() -> int:
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stopped_while_starting)
    from se_exporter.cli import main  # noqa: PLC0415 - imported after the handlers: loading it is the slow part

    return main()


if __name__ == "__main__":
    sys.exit(entry())
