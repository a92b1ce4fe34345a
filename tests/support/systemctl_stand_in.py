"""A stand-in for ``systemctl`` where systemd is not PID 1 (the suite's machines): install.sh's tests put it first
on PATH as ``systemctl``. It does for the one unit what systemd would: ``restart`` stops the running process and
starts the unit's ExecStart with the unit's Environment= overridden by its EnvironmentFile= (systemd's order),
under ``$INSTALL_ROOT``; ``stop``, ``enable``, ``disable [--now]``, ``daemon-reload``, ``is-active``. The unit
itself is checked by ``systemd-analyze verify`` (tests/project/test_deploy.py). What it did is appended to
``$STAND_IN_DIR/calls``; the process id is in ``$STAND_IN_DIR/pid``, its output in ``$STAND_IN_DIR/service.log``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(os.environ["INSTALL_ROOT"])
HERE = Path(os.environ["STAND_IN_DIR"])
UNIT = ROOT / "etc" / "systemd" / "system" / "se-exporter.service"
STOP_SECONDS = 15  # the unit's TimeoutStopSec


def unit_settings() -> tuple[list[str], dict[str, str]]:
    command: list[str] = []
    env = {"PATH": "/usr/bin:/bin"}
    files: list[Path] = []
    for line in UNIT.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "ExecStart":
            command = value.split()
            command[0] = str(ROOT) + command[0]
        elif key == "Environment":
            name, _, setting = value.partition("=")
            env[name] = setting
        elif key == "EnvironmentFile":
            files.append(ROOT / value.lstrip("-").lstrip("/"))
    for path in files:
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    name, _, setting = line.partition("=")
                    env[name.strip()] = setting.strip().strip('"')
    return command, env


def running() -> int | None:
    try:
        pid = int((HERE / "pid").read_text())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError):
        return None
    return None if state in ("Z", "X") else pid  # an exited child waits as a zombie until init reaps it


def stop() -> None:
    pid = running()
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    while running() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    if running() is not None:
        os.kill(pid, signal.SIGKILL)
    (HERE / "pid").unlink()


def start() -> None:
    command, env = unit_settings()
    with (HERE / "service.log").open("ab") as log:
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    (HERE / "pid").write_text(str(process.pid))


def main(argv: list[str]) -> int:
    with (HERE / "calls").open("a") as calls:
        calls.write(" ".join(argv) + "\n")
    verb, rest = argv[0], argv[1:]
    if verb == "daemon-reload":
        return 0
    if verb == "enable":
        (HERE / "enabled").touch()
    elif verb == "disable":
        (HERE / "enabled").unlink(missing_ok=True)
        if "--now" in rest:
            stop()
    elif verb == "restart":
        stop()
        start()
    elif verb == "stop":
        stop()
    elif verb == "is-active":
        return 0 if running() else 3
    else:
        print(f"systemctl stand-in: {verb} is not something install.sh should need", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
