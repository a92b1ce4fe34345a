"""`make test-contended`'s wrapper (scripts/contended.py): busy loops beside a command, never left spinning."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import wait_until

SCRIPT = Path(__file__).parent.parent.parent / "scripts" / "contended.py"


def start(*command: str, loops: int = 2) -> tuple[subprocess.Popen[str], list[int]]:
    """The wrapper around ``command`` in a process group of its own (as make's is under a shell), and its loops."""
    wrapper = subprocess.Popen([sys.executable, str(SCRIPT), "--loops", str(loops), "--", *command],
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert wrapper.stderr is not None
    line = wrapper.stderr.readline()
    match = re.fullmatch(rf"{loops} busy loops beside the command: pids ([\d ]*)\n", line)
    assert match, line
    return wrapper, [int(pid) for pid in match.group(1).split()]


def spinning(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) busy loop: the shell itself (setpriv, before it, has set its guard)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X") and cmdline == b"sh\0-c\0while :; do :; done\0"


def test_the_loops_spin_while_the_command_runs_and_stop_with_it() -> None:
    """Two loops spin beside the command; when it exits, failing, they are gone and its exit code is the result."""
    wrapper, loops = start("sh", "-c", "read line; exit 3")  # the command waits for the test to look
    assert len(loops) == 2
    wait_until(lambda: all(spinning(pid) for pid in loops), what="both loops to spin")
    wrapper.communicate("go on\n", timeout=30)
    assert wrapper.returncode == 3
    assert not any(spinning(pid) for pid in loops)


@pytest.mark.parametrize(("signum", "to_group"), [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_ctrl_c_or_sigterm_stops_the_loops_and_the_command(signum: int, to_group: bool) -> None:
    """Ctrl-C (SIGINT to the whole process group) or a SIGTERM to the wrapper alone: the loops and the command
    stop and the wrapper exits as a shell reports a signal's end (130, 143)."""
    wrapper, loops = start("sleep", "60")
    [command] = wait_until(lambda: _children(wrapper.pid, b"sleep"), what="the command to start")
    if to_group:
        os.killpg(wrapper.pid, signum)
    else:
        wrapper.send_signal(signum)
    wrapper.communicate(timeout=30)
    assert not any(spinning(pid) for pid in loops)
    assert not Path(f"/proc/{command}").exists() or "Z" in Path(f"/proc/{command}/stat").read_text().split(")")[1]
    assert wrapper.returncode == 128 + signum


@pytest.mark.skipif(not shutil.which("setpriv"), reason="the kill -9 guard needs util-linux's setpriv")
def test_kill_9_of_the_wrapper_stops_the_loops() -> None:
    """Even a wrapper killed outright (it can run no cleanup) leaves no loop spinning: the kernel kills them."""
    wrapper, loops = start("sleep", "60")
    [command] = wait_until(lambda: _children(wrapper.pid, b"sleep"), what="the command to start")
    wait_until(lambda: all(spinning(pid) for pid in loops), what="both loops to spin")
    try:
        wrapper.kill()  # the wrapper alone: the loops are left to the kernel's guard
        wrapper.wait(timeout=30)  # (not communicate: the orphaned command holds the pipe open)
        wait_until(lambda: not any(spinning(pid) for pid in loops), what="the loops to die with their parent")
    finally:
        for pid in [command, *filter(spinning, loops)]:  # orphaned by the kill -9; loops only if the guard failed
            os.kill(pid, signal.SIGKILL)
        wrapper.communicate(timeout=30)


def _children(pid: int, name: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if ppid == pid and cmdline.startswith(name):
                found.append(int(entry.name))
    return found
