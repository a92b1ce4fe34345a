"""The ``se-exporter`` command's entry (``se_exporter.__main__``): a stop signal while it is still starting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

# Sends the signal to itself the moment the command's first module is being imported, deterministically inside
# the window a Ctrl-C used to print a traceback in, then runs the command's entry as the console script does.
PROGRAM = """
import os, signal, sys
from importlib.abc import MetaPathFinder

SIGNAL = getattr(signal, sys.argv[1])

class SignalOnImport(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "se_exporter.cli":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), SIGNAL)
        return None

from se_exporter.__main__ import entry
sys.meta_path.insert(0, SignalOnImport())
sys.argv[1:] = ["run", "--listen", "127.0.0.1:0", "--imds-url", "http://127.0.0.1:9"]
sys.exit(entry())
"""


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_signal_while_modules_load_ends_quietly_with_exit_0(name: str) -> None:
    """README 'Shutdown': a stop signal exits 0, also while the command is still loading; no traceback, no 143."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SE_EXPORTER_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-c", PROGRAM, name], capture_output=True, text=True, timeout=60,
                          check=False, env=env)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert hasattr(signal, name)
