"""deploy/systemd/install.sh run as an operator runs it, as root, under a scratch root (INSTALL_ROOT): the real
wheelhouse `make linux-wheels` builds, real virtualenvs and pip, the real se-exporter started from the real unit's
ExecStart against the simulator on loopback. systemd is not PID 1 where the suite runs, so ``systemctl`` is
tests/support/systemctl_stand_in.py (the unit itself passes ``systemd-analyze verify`` in test_deploy.py)."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.server import Simulator, start
from tests.conftest import Reliability, SimulatorFactory
from tests.support.container import snapshot
from tests.support.helpers import free_port, http_get, wait_until

ROOT = Path(__file__).parent.parent.parent
SCRIPT = ROOT / "deploy" / "systemd" / "install.sh"
ARCHIVE = ROOT / "dist" / "linux-wheels.tar.gz"
STAND_IN = ROOT / "tests" / "support" / "systemctl_stand_in.py"
SH = shutil.which("sh") or "/bin/sh"
SETUP = "/var/tmp/se-exporter-setup"  # noqa: S108 - where the custom data writes install.sh, not a file we open
# Each install builds a virtualenv and pip-installs the whole wheelhouse: with two busy loops beside them on 2 shared
# cores under other work, the two tests that install twice took 111 s and 149 s. The suite's 180 s is too close.
INSTALLS_TWICE = pytest.mark.timeout(400)
# The template's build (built_release) can meet another worker's waiting on it: both within one limit.
INSTALLS_SEEDED = pytest.mark.timeout(600)
BROKEN = '''

_serving_main = main


def main(argv=None, env=None):  # this release never serves: its health check must fail and be rolled back
    import sys
    if "run" in (sys.argv[1:] if argv is None else list(argv)):
        raise SystemExit("this release never serves")
    return _serving_main(argv, env)
'''


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _archive() -> Path:
    if not ARCHIVE.is_file():
        pytest.fail("no dist/linux-wheels.tar.gz: run make linux-wheels (make test does)")
    return ARCHIVE


def _repack(source: Path, target: Path, change: Callable[[Path], None]) -> Path:
    """The wheelhouse unpacked, changed, packed again (another archive, so another hash)."""
    scratch = target.with_suffix(".d")
    with tarfile.open(source) as bundle:
        bundle.extractall(scratch, filter="data")
    (house,) = [p.parent for p in scratch.rglob("requirements.txt")]
    change(house)
    with tarfile.open(target, "w:gz") as bundle:
        bundle.add(house, house.name)
    shutil.rmtree(scratch)
    return target


def _break_own_wheel(house: Path) -> None:
    """se-exporter's wheel rebuilt so ``run`` exits at once (``--help`` still works), its RECORD and the
    requirements.txt hash updated: a release that installs cleanly and never answers /healthz."""
    (wheel,) = house.glob("se_exporter-*.whl")
    old_hash = sha256(wheel)
    with zipfile.ZipFile(wheel) as bundle:
        files = {info.filename: bundle.read(info) for info in bundle.infolist()}
    cli = files["se_exporter/cli.py"] + BROKEN.encode()
    files["se_exporter/cli.py"] = cli
    digest = base64.urlsafe_b64encode(hashlib.sha256(cli).digest()).rstrip(b"=").decode()
    (record,) = [name for name in files if name.endswith(".dist-info/RECORD")]
    files[record] = "\n".join(f"se_exporter/cli.py,sha256={digest},{len(cli)}" if line.startswith(
        "se_exporter/cli.py,") else line for line in files[record].decode().splitlines()).encode() + b"\n"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, data in files.items():
            bundle.writestr(name, data)
    requirements = house / "requirements.txt"
    requirements.write_text(requirements.read_text().replace(old_hash, sha256(wheel)))


class Machine:
    """A scratch root, the settings file an operator would write, and install.sh run against them."""

    def __init__(self, base: Path, imds_url: str, host: str = "127.0.0.1") -> None:
        self.host = host
        self.root = base / "root"
        self.stand_in = base / "systemctl"
        self.stand_in.mkdir(parents=True)
        (self.stand_in / "bin").mkdir()
        systemctl = self.stand_in / "bin" / "systemctl"
        systemctl.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STAND_IN}" "$@"\n')
        systemctl.chmod(0o755)
        self.port = free_port()
        self.state = base / "state"
        etc = self.root / "etc" / "se-exporter"
        etc.mkdir(parents=True)
        (etc / "se-exporter.env").write_text(
            f"SE_EXPORTER_LISTEN={host}:{self.port}\nSE_EXPORTER_IMDS_URL={imds_url}\n"
            f"SE_EXPORTER_STATE_DIR={self.state}\nSE_EXPORTER_POLL_INTERVAL=0.2\n")
        self.prefix = self.root / "opt" / "se-exporter"

    def seed(self, built: Path) -> None:
        """Put a release install.sh built elsewhere (``built_release``) where it would build this one: copied, with
        the paths its scripts' shebangs, activate scripts and pyvenv.cfg name moved to here, byte for byte what a
        build here writes but for the bytecode's recorded source paths (which the import system corrects on load).
        install.sh then finds it built (its ``.built`` mark, as after a run killed before its switch) and goes
        straight to switching, restarting and checking it."""
        target = self.prefix / "releases" / built.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(built, target, symlinks=True)
        old, new = str(built).encode(), str(target).encode()
        for path in [*(target / "bin").iterdir(), target / "pyvenv.cfg"]:
            if path.is_file() and not path.is_symlink() and old in (data := path.read_bytes()):
                path.write_bytes(data.replace(old, new))

    def environment(self, env: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, "INSTALL_ROOT": str(self.root), "STAND_IN_DIR": str(self.stand_in),
                "PATH": f"{self.stand_in / 'bin'}:{os.environ['PATH']}", "HEALTH_TIMEOUT": "60", **(env or {})}

    def run(self, *args: str, env: dict[str, str] | None = None,
            script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SH, str(script), *args], capture_output=True, text=True, env=self.environment(env),
                              timeout=300, check=False)

    def unit(self) -> str:
        return (self.root / "etc/systemd/system/se-exporter.service").read_text()

    def pid(self) -> int | None:
        try:
            pid = int((self.stand_in / "pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def release_of(self, pid: int) -> str:
        """The release whose interpreter the process runs (its shebang names the release's own directory)."""
        interpreter = Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode())
        return interpreter.parent.parent.name

    def current(self) -> str:
        return os.readlink(self.prefix / "current").removeprefix("releases/")

    def healthy(self) -> bool:
        return http_get(f"http://{self.host}:{self.port}/healthz")[0] == 200

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def machine(tmp_path: Path, simulator: SimulatorFactory) -> Iterator[Machine]:
    _, server = simulator("live-migration")
    made = Machine(tmp_path, server.url)
    yield made
    made.stop()


@pytest.fixture(scope="session")
def built_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/linux-wheels.tar.gz's release as install.sh builds it (its virtualenv, the wheelhouse pip-installed, the
    unit file, the .built mark), built once per run by a real install.sh run against the simulator and shared by the
    pytest-xdist workers (a lock, in the run's temporary directory): the tests whose subject is not the build
    (a rollback, an interrupted upgrade, the health check's address) start from a copy (Machine.seed) instead of
    building it again, about 35 s of a quiet machine's time each and minutes on a busy one. install.sh's build step
    stays exercised: the install-then-upgrade test builds both its releases, and the rollback and the interrupted
    upgrade each build their new release."""
    archive = _archive()
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    template = shared / f"install-template-{sha256(archive)[:12]}"
    with (shared / "install-template.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (template / "done").exists():
            shutil.rmtree(template, ignore_errors=True)
            server = start(Simulator(scenarios.load("live-migration")), "127.0.0.1", 0)
            machine = Machine(template, server.url)
            try:
                result = machine.run("--sha256", sha256(archive), str(archive))
                assert result.returncode == 0, result.stdout + result.stderr
            finally:
                machine.stop()
                server.shutdown()
                server.server_close()
            (template / "done").touch()
    built = template / "root" / "opt" / "se-exporter" / "releases" / _release(archive)
    assert (built / ".built").is_file()
    return built


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _release(archive: Path) -> str:
    with tarfile.open(archive) as bundle:
        (wheel,) = [m for m in bundle.getnames() if "/se_exporter-" in m]
    return f"{wheel.split('/se_exporter-')[1].split('-')[0]}-{sha256(archive)[:12]}"


@pytest.mark.long(seconds=230)
@pytest.mark.integration
@INSTALLS_TWICE
def test_install_then_upgrade_switches_after_health_and_uninstall_keeps_state(
        machine: Machine, tmp_path: Path, reliability: Reliability) -> None:
    """install.sh installs a release, enables and starts it; run again with another wheelhouse it builds the new
    release beside the running one, switches, restarts, and removes the old one only once the new one answers
    /healthz; --uninstall stops and removes everything but the settings and the state, --purge those too."""
    first = _archive()
    result = machine.run("--sha256", sha256(first), str(first))
    assert result.returncode == 0, result.stdout + result.stderr
    assert machine.current() == _release(first)
    old_pid = wait_until(machine.pid, what="the service's process")
    assert machine.release_of(old_pid) == _release(first)
    assert machine.healthy()
    assert (machine.stand_in / "enabled").exists()
    assert (machine.root / "etc/systemd/system/se-exporter.service").read_text() == \
        (ROOT / "deploy/systemd/se-exporter.service").read_text()
    second = _repack(first, tmp_path / "second.tar.gz",
                     lambda house: (house / "requirements.txt").write_text(
                         (house / "requirements.txt").read_text() + "# rebuilt\n"))
    result = machine.run("--sha256", sha256(second).upper(), str(second))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"upgraded from {_release(first)}" in result.stdout
    new_pid = wait_until(machine.pid, what="the upgraded service's process")
    assert new_pid != old_pid and not _alive(old_pid)
    assert machine.release_of(new_pid) == _release(second) == machine.current()
    assert sorted(p.name for p in (machine.prefix / "releases").iterdir()) == [_release(second)]
    assert machine.healthy()
    calls = (machine.stand_in / "calls").read_text().splitlines()
    assert calls.count("restart se-exporter") == 2

    wait_until(lambda: any(machine.state.iterdir()), what="state written")
    result = machine.run("--uninstall")
    assert result.returncode == 0, result.stderr
    assert machine.pid() is None
    assert not machine.prefix.exists() and not (machine.root / "etc/systemd/system/se-exporter.service").exists()
    assert not (machine.stand_in / "enabled").exists()
    assert (machine.root / "etc/se-exporter/se-exporter.env").is_file()
    (machine.root / "var/lib/se-exporter").mkdir(parents=True)
    result = machine.run("--uninstall", "--purge")
    assert result.returncode == 0, result.stderr
    assert not (machine.root / "etc/se-exporter").exists() and not (machine.root / "var/lib/se-exporter").exists()
    reliability("Install", "install.sh: install, upgrade to another wheelhouse, uninstall, uninstall --purge",
                "the new release built beside the running one, switched, restarted and answering /healthz before "
                "the old one is removed; uninstall keeps settings and state, --purge removes them")


@pytest.mark.long(seconds=170)
@pytest.mark.integration
@INSTALLS_SEEDED
def test_a_release_that_never_answers_is_rolled_back(machine: Machine, tmp_path: Path, built_release: Path,
                                                     reliability: Reliability) -> None:
    """An upgrade whose new release installs but never answers /healthz fails, with the old release (whose files
    were never touched) switched back, restarted and answering, and the new one removed."""
    first = _archive()
    machine.seed(built_release)
    assert machine.run("--sha256", sha256(first), str(first)).returncode == 0
    installed = machine.prefix / "releases" / _release(first)
    before = snapshot(installed, skip=tuple(str(p.relative_to(installed)) for p in installed.rglob("__pycache__")))
    broken = _repack(first, tmp_path / "broken.tar.gz", _break_own_wheel)
    result = machine.run("--sha256", sha256(broken), str(broken), env={"HEALTH_TIMEOUT": "30"})
    assert result.returncode == 1
    assert f"rolled back to {_release(first)}, which is running" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert machine.current() == _release(first)
    pid = wait_until(machine.pid, what="the old release's process")
    assert machine.release_of(pid) == _release(first)
    assert machine.healthy()
    assert sorted(p.name for p in (machine.prefix / "releases").iterdir()) == [_release(first)]
    after = snapshot(installed, skip=tuple(str(p.relative_to(installed)) for p in installed.rglob("__pycache__")))
    assert {k: v for k, v in after.items() if "__pycache__" not in k} == \
        {k: v for k, v in before.items() if "__pycache__" not in k}
    assert "this release never serves" in (machine.stand_in / "service.log").read_text()
    reliability("Install", "install.sh upgrading to a release that never answers /healthz",
                "exit 1 with one line; the old release, untouched, switched back, restarted and answering")


@pytest.mark.long(seconds=170)
@pytest.mark.integration
@INSTALLS_SEEDED
def test_an_upgrade_killed_while_it_waits_for_health_ends_on_the_verified_release(
        machine: Machine, tmp_path: Path, built_release: Path, reliability: Reliability) -> None:
    """install.sh killed -9 while it waits for the new release's /healthz (an extension's timeout, a reboot) leaves
    the service on a release never verified, with that release's unit file; run again, as the extension retries it,
    it finishes the upgrade: the new release fails its health check again and the verified one is back, running,
    with the unit file it was installed with."""
    first = _archive()
    machine.seed(built_release)
    assert machine.run("--sha256", sha256(first), str(first)).returncode == 0
    verified_unit = machine.unit()
    newer = tmp_path / "newer"
    shutil.copytree(SCRIPT.parent, newer)
    (newer / "se-exporter.service").write_text(verified_unit + "# the unit file of the release never verified\n")
    broken = _repack(first, tmp_path / "broken.tar.gz", _break_own_wheel)
    upgrade = subprocess.Popen([SH, str(newer / "install.sh"), "--sha256", sha256(broken), str(broken)],
                               env=machine.environment({"HEALTH_TIMEOUT": "300"}), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (machine.stand_in / "calls").read_text().splitlines().count("restart se-exporter") == 2,
                   timeout=300, what="the upgrade waiting for the new release's /healthz")
    finally:
        os.killpg(upgrade.pid, signal.SIGKILL)
        upgrade.wait()
    assert machine.current() == _release(broken) and machine.unit() != verified_unit  # what the kill left

    result = machine.run("--sha256", sha256(broken), str(broken), env={"HEALTH_TIMEOUT": "20"},
                         script=newer / "install.sh")
    assert result.returncode == 1
    assert f"rolled back to {_release(first)}, which is running" in result.stderr
    assert machine.current() == _release(first)
    assert machine.unit() == verified_unit
    pid = wait_until(machine.pid, what="the verified release's process")
    assert machine.release_of(pid) == _release(first)
    assert machine.healthy()
    assert sorted(p.name for p in (machine.prefix / "releases").iterdir()) == [_release(first)]
    reliability("Install", "install.sh killed -9 while it waits for an upgrade's /healthz, then run again",
                "the next run finishes the upgrade: the unverified release fails its check and the verified one is "
                "back with its own unit file, running")


@pytest.mark.long(seconds=30)
@pytest.mark.integration
@INSTALLS_SEEDED
def test_the_health_check_asks_the_address_the_service_listens_on(tmp_path: Path, built_release: Path,
                                                                 simulator: SimulatorFactory) -> None:
    """A service bound to one address (the VM's private one, as docs/install.md advises; here 127.0.0.2, which
    Linux routes to loopback) is asked for /healthz there: polling 127.0.0.1 never got an answer, so a first install
    failed and every upgrade was rolled back."""
    _, server = simulator("live-migration")
    machine = Machine(tmp_path, server.url, host="127.0.0.2")
    machine.seed(built_release)
    try:
        first = _archive()
        result = machine.run("--sha256", sha256(first), str(first), env={"HEALTH_TIMEOUT": "30"})
        assert result.returncode == 0, result.stdout + result.stderr
        assert machine.healthy()
        with pytest.raises(ConnectionRefusedError):  # bound to 127.0.0.2 only: the old check's address is closed
            socket.create_connection(("127.0.0.1", machine.port), timeout=5).close()
    finally:
        machine.stop()


def test_an_archive_rewritten_with_its_requirements_is_refused(tmp_path: Path) -> None:
    """A wheelhouse whose wheels and requirements.txt were rewritten together is refused by the hash given apart
    from it, in one line, before anything is written."""
    house = tmp_path / "linux-wheels"
    house.mkdir()
    (house / "requirements.txt").write_text("se-exporter==0.1.0 --hash=sha256:" + "0" * 64 + "\n")
    genuine = tmp_path / "genuine.tar.gz"
    with tarfile.open(genuine, "w:gz") as bundle:
        bundle.add(house, house.name)
    (house / "requirements.txt").write_text("se-exporter==0.1.0 --hash=sha256:" + "1" * 64 + "\n")
    rewritten = tmp_path / "linux-wheels.tar.gz"
    with tarfile.open(rewritten, "w:gz") as bundle:
        bundle.add(house, house.name)
    machine = Machine(tmp_path / "m", "http://127.0.0.1:9")
    written = snapshot(machine.root)
    result = machine.run("--sha256", sha256(genuine), str(rewritten))
    assert result.returncode == 1
    assert result.stderr == f"install.sh: {rewritten} has sha256 {sha256(rewritten)}, not the {sha256(genuine)} " \
                            "given: refused, nothing changed\n"
    assert snapshot(machine.root) == written
    assert not (machine.stand_in / "calls").exists()


@pytest.mark.parametrize("args", [[], ["linux-wheels.tar.gz"], ["--sha256", "abc", "linux-wheels.tar.gz"]])
def test_no_install_without_the_archives_hash(tmp_path: Path, args: list[str]) -> None:
    """Without a wheelhouse and a well-formed sha256 for it, install.sh says what to give, in one line."""
    (tmp_path / "linux-wheels.tar.gz").write_bytes(b"")
    machine = Machine(tmp_path / "m", "http://127.0.0.1:9")
    result = subprocess.run([SH, str(SCRIPT), *args], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                            env={**os.environ, "INSTALL_ROOT": str(machine.root)}, check=False)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and ("--sha256" in result.stderr), result.stderr


def test_a_python_without_ensurepip_gets_one_line_naming_python3_venv(tmp_path: Path) -> None:
    """A python3 that has venv but not ensurepip (Debian without python3-venv) is caught before anything is done,
    with one line that says what to install."""
    shadow = tmp_path / "shadow"
    (shadow / "ensurepip").mkdir(parents=True)
    (shadow / "ensurepip" / "__init__.py").write_text("raise ImportError('No module named ensurepip')\n")
    archive = tmp_path / "linux-wheels.tar.gz"
    archive.write_bytes(b"x")
    machine = Machine(tmp_path / "m", "http://127.0.0.1:9")
    result = machine.run("--sha256", sha256(archive), str(archive), env={"PYTHONPATH": str(shadow)})
    assert result.returncode == 1
    assert result.stderr == "install.sh: python3 cannot create virtualenvs (no ensurepip): apt-get install " \
                            "python3-venv, then run this again\n"
    assert not machine.prefix.exists()
    old_guard = [shutil.which("python3") or "python3", "-c", "import venv"]
    assert subprocess.run(old_guard, env={**os.environ, "PYTHONPATH": str(shadow)}, timeout=60,
                          check=False).returncode == 0, "the old guard would have passed"


def test_a_python_the_wheelhouse_has_no_wheels_for_gets_one_line_naming_the_versions(tmp_path: Path) -> None:
    """A python3 newer or older than every CPython the wheelhouse's compiled wheels are built for (Debian 13's 3.13
    against 3.10-3.12) is refused before a virtualenv is made, in one line naming the versions the wheels are for:
    those every compiled package has a wheel for (abi3 and pure-Python wheels fit any)."""
    python3 = shutil.which("python3")
    assert python3 is not None
    have = subprocess.run([python3, "-c", "import platform; print(platform.python_version())"], capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()
    minor = int(have.split(".")[1])
    house = tmp_path / "linux-wheels"
    house.mkdir()
    (house / "requirements.txt").write_text("se-exporter==0.1.0\n")
    names = ["se_exporter-0.1.0-py3-none-any.whl", "cryptography-50.0-cp39-abi3-manylinux_2_28_x86_64.whl",
             *(f"grpcio-1.0-cp3{m}-cp3{m}-manylinux2014_x86_64.whl" for m in (minor, minor + 1, minor + 2)),
             *(f"multi_dict-7.0-cp3{m}-cp3{m}-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
               for m in (minor + 1, minor + 2))]
    for name in names:
        (house / name).write_bytes(b"")
    archive = tmp_path / "linux-wheels.tar.gz"
    with tarfile.open(archive, "w:gz") as bundle:
        bundle.add(house, house.name)
    machine = Machine(tmp_path / "m", "http://127.0.0.1:9")
    result = machine.run("--sha256", sha256(archive), str(archive))
    assert result.returncode == 1
    assert result.stderr == f"install.sh: python3 is {have}, but this wheelhouse holds wheels for CPython " \
                            f"3.{minor + 1}, 3.{minor + 2} only: run install.sh with one of those first on PATH " \
                            "as python3; nothing installed\n"
    assert not (machine.prefix / "releases").exists() and not (machine.stand_in / "calls").exists()


def test_cloud_init_runs_the_same_install_sh_with_the_hash() -> None:
    """The scale-set custom data carries install.sh and the unit verbatim and runs install.sh with the archive's
    hash, so first boot and later upgrades take one path."""
    import yaml  # noqa: PLC0415 - only this test reads YAML

    systemd = ROOT / "deploy" / "systemd"
    data = yaml.safe_load((systemd / "cloud-init.yaml").read_text())
    files = {item["path"]: item["content"] for item in data["write_files"]}
    assert files[f"{SETUP}/install.sh"] == SCRIPT.read_text(), "copy install.sh into cloud-init.yaml (indented 6)"
    assert files[f"{SETUP}/se-exporter.service"] == (systemd / "se-exporter.service").read_text()
    (run,) = [command for command in data["runcmd"] if "install.sh" in command]
    assert run.split()[:4] == ["sh", f"{SETUP}/install.sh", "--sha256", "WHEELHOUSE_SHA256"]


@pytest.mark.parametrize(("replace", "left"), [
    ({}, " WHEELHOUSE_URL WHEELHOUSE_SHA256 myns.servicebus.windows.net"),
    ({"WHEELHOUSE_URL": "https://example.invalid/w.tar.gz", "WHEELHOUSE_SHA256": "ab" * 32},
     " myns.servicebus.windows.net"),
    ({"myns": "prod-events"}, " WHEELHOUSE_URL WHEELHOUSE_SHA256"),
    ({"WHEELHOUSE_URL": "https://example.invalid/w.tar.gz", "WHEELHOUSE_SHA256": "ab" * 32, "myns": "prod-events"},
     ""),
])
def test_cloud_init_with_a_placeholder_left_stops_first_boot_in_one_line(tmp_path: Path, replace: dict[str, str],
                                                                          left: str) -> None:
    """Custom data whose placeholders were not all replaced (an Event Hubs namespace that does not exist, no
    wheelhouse) fails its first runcmd, before the download and the install, with one line on stderr (cloud-init's
    output and the console log) naming those left; replaced the way an operator does (a text substitution of the
    whole file), it passes."""
    import yaml  # noqa: PLC0415 - only these tests read YAML

    text = (ROOT / "deploy" / "systemd" / "cloud-init.yaml").read_text()
    for placeholder, value in replace.items():
        text = text.replace(placeholder, value)
    data = yaml.safe_load(text)
    env = tmp_path / "se-exporter.env"
    env.write_text({item["path"]: item["content"] for item in data["write_files"]}["/etc/se-exporter/se-exporter.env"])
    check = data["runcmd"][0]
    assert "/etc/se-exporter/se-exporter.env" in check
    # cloud-init writes each string item into one shell script, in order: an exit here ends it before the download.
    script = "\n".join([check.replace("/etc/se-exporter/se-exporter.env", str(env)), "echo reached the download"])
    result = subprocess.run([SH, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    if left:
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr == f"se-exporter: nothing installed: the custom data still holds the placeholder(s)" \
                                f"{left}; replace them (cloud-init.yaml says how)\n"
    else:
        assert (result.returncode, result.stdout, result.stderr) == (0, "reached the download\n", "")


def test_a_second_install_at_the_same_time_stops_in_one_line(tmp_path: Path) -> None:
    """While one install.sh holds the machine's install lock, another (cloud-init's first boot meeting a Custom
    Script upgrade) stops with one line before it unpacks or changes anything."""
    archive = tmp_path / "linux-wheels.tar.gz"
    archive.write_bytes(b"x")
    machine = Machine(tmp_path / "m", "http://127.0.0.1:9")
    machine.prefix.mkdir(parents=True)
    with (machine.prefix / ".lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        before = snapshot(machine.root)
        result = machine.run("--sha256", sha256(archive), str(archive))
    assert result.returncode == 1
    assert result.stderr == f"install.sh: another install.sh is running on this machine (it holds " \
                            f"{machine.prefix}/.lock); nothing changed\n"
    assert snapshot(machine.root) == before
