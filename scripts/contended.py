"""Run a command with busy loops beside it: the CPU contention the suite must hold under (``make test-contended``).

    python scripts/contended.py --loops 2 -- make test

Each loop is the shell's ``while :; do :; done``, as a tester would start it by hand. They are stopped whatever
happens to the command: on its exit (the result is its exit code), on Ctrl-C (the command's own code: it gets the
Ctrl-C too), on SIGTERM (passed on to the command; 143), and, where util-linux's setpriv is installed, by the
kernel when this script itself is killed outright (kill -9), so no loop is left spinning on a shared machine. The
loops' process ids are printed first, on stderr.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
from types import FrameType

LOOP = ["sh", "-c", "while :; do :; done"]


def start_loops(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy loops; each gets SIGKILL from the kernel if this process dies first (setpriv --pdeathsig)."""
    guard = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
    return [subprocess.Popen([*guard, *LOOP], stdin=subprocess.DEVNULL)  # noqa: S603 - fixed argv
            for _ in range(count)]


def stop_loops(loops: list[subprocess.Popen[bytes]]) -> None:
    for loop in loops:
        if loop.poll() is None:
            loop.kill()
    for loop in loops:
        loop.wait()


def exit_code(returncode: int) -> int:
    """A shell's exit code for a child's return code: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--loops", type=int, default=2, help="busy loops beside the command (default 2)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.loops < 0:
        parser.error("give a command after -- and a number of loops of 0 or more")
    loops: list[subprocess.Popen[bytes]] = []
    started: list[subprocess.Popen[bytes]] = []  # the command, once running
    terminated: list[int] = []

    def interrupted(_signum: int, _frame: FrameType | None) -> None:
        """Ctrl-C reached the command too (one process group): stop the loops now, let it end its own way and
        report how it ended (raising here instead could lose its exit status to the interrupted wait)."""
        for loop in loops:
            loop.kill()

    def terminate(signum: int, _frame: FrameType | None) -> None:
        """SIGTERM reached only us: stop the loops and pass it on to the command (now, or once it is started)."""
        terminated.append(signum)
        for process in (*loops, *started):
            process.terminate()

    # Handlers before anything starts, and never SIG_IGN, which the command would inherit.
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, terminate)
    try:
        loops.extend(start_loops(args.loops))
        print(f"{len(loops)} busy loops beside the command: pids {' '.join(str(loop.pid) for loop in loops)}",
              file=sys.stderr, flush=True)
        if terminated:
            return 128 + terminated[0]
        started.append(subprocess.Popen(command))  # noqa: S603 - the command the user asked to run
        if terminated:  # SIGTERM came while it was being started
            started[0].terminate()
        code = exit_code(started[0].wait())
        return 128 + terminated[0] if terminated else code
    finally:
        stop_loops(loops)


if __name__ == "__main__":
    sys.exit(main())
