"""The offline wheelhouses `make linux-wheels` and `make windows-wheels` build (make test builds both first): each
holds, for every target, a wheel of every locked dependency whose hash the lock names, and se-exporter's own wheel;
the Linux one installs into a fresh virtualenv the way deploy/systemd/install.sh installs it (no index, hashes
required) and a wheel that is not the locked one stops that install."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from scripts import lockfile, wheelhouse
from tests.conftest import Reliability

ROOT = Path(__file__).parent.parent.parent
HOUSES = {"linux": ROOT / "dist" / "linux-wheels", "windows": ROOT / "dist" / "windows-wheels"}


def _house(kind: str) -> Path:
    house = HOUSES[kind]
    if not (house / "requirements.txt").is_file():
        pytest.fail(f"no {house.relative_to(ROOT)}: run make {kind}-wheels (make test does)")
    return house


@pytest.mark.integration  # reads the wheelhouses make test builds (dist/); make unit does not
@pytest.mark.parametrize("kind", sorted(HOUSES))
def test_wheelhouse_holds_every_locked_wheel_for_every_target(kind: str) -> None:
    """For each platform and Python 3.10-3.12, each pin the lock selects has a wheel that installs there and whose
    sha256 is one the lock names; the requirements.txt beside them is the lock plus se-exporter's own wheel."""
    house = _house(kind)
    pins = lockfile.read(lockfile.RUNTIME)
    for platform in wheelhouse.TARGETS[kind]:
        for python in lockfile.PYTHONS:
            tags = wheelhouse.supported(platform, python)
            missing = [p.name for p in lockfile.select(pins, platform, python)
                       if wheelhouse._have(house, p, tags) is None]
            assert missing == [], f"{platform} Python {python}"
    text = (house / "requirements.txt").read_text()
    assert text.startswith(lockfile.RUNTIME.read_text())
    (own,) = house.glob("se_exporter-*.whl")
    assert f"--hash=sha256:{wheelhouse.sha256(own)}" in text


def _install_command(python: Path, house: Path, requirements: Path) -> list[str]:
    """install.sh's pip step, with its arguments read from the script itself."""
    script = (ROOT / "deploy" / "systemd" / "install.sh").read_text()
    step = re.search(r"/bin/pip\" install (.+?)-r \"\$HOUSE/requirements.txt\"", script, re.S)
    assert step, "install.sh no longer installs the wheelhouse's requirements.txt"
    arguments = step.group(1).replace("\\\n", " ").replace('"$HOUSE"', str(house)).split()
    assert {"--no-index", "--require-hashes"} <= set(arguments)
    return [str(python), "-m", "pip", "install", *arguments, "-r", str(requirements)]


@pytest.mark.long(seconds=80)
@pytest.mark.integration
def test_linux_wheelhouse_installs_offline_with_hashes_required(tmp_path: Path, reliability: Reliability) -> None:
    """The wheelhouse installs into a new virtualenv with no index, every hash checked, and the console script
    starts; the installed versions are the locked ones."""
    house = _house("linux")
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    result = subprocess.run(_install_command(python, house, house / "requirements.txt"), capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert subprocess.run([str(tmp_path / "venv" / "bin" / "se-exporter"), "--help"], capture_output=True,
                          timeout=60, check=False).returncode == 0
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    frozen = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    installed = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
                 for line in frozen.split() if "==" in line}
    for pin in lockfile.select(lockfile.read(lockfile.RUNTIME), "linux-x86_64", version):
        assert installed.get(pin.name) == pin.version, pin.name
    reliability("Supply chain", "the Linux wheelhouse installed as install.sh installs it, into a new virtualenv",
                "offline (--no-index), every hash checked; exactly the locked versions; se-exporter starts")


@pytest.mark.long(seconds=30)
@pytest.mark.integration
def test_a_wheel_that_is_not_the_locked_one_stops_the_install(tmp_path: Path, reliability: Reliability) -> None:
    """One wheel replaced by other bytes under its name: pip refuses it (hash mismatch) and installs nothing."""
    house = _house("linux")
    copy = tmp_path / "house"
    shutil.copytree(house, copy)
    victim = next(p for p in sorted(copy.glob("idna-*.whl")))
    victim.write_bytes(victim.read_bytes() + b"\0")
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    result = subprocess.run(_install_command(python, copy, copy / "requirements.txt"), capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in result.stderr
    assert not list((tmp_path / "venv").glob("lib/python*/site-packages/idna"))
    reliability("Supply chain", "one wheel of the wheelhouse changed by a byte", "pip refused it (hash mismatch); "
                "nothing installed")


def test_the_printed_hash_line_is_the_one_sha256sum_prints(tmp_path: Path) -> None:
    """The line make linux-wheels and make windows-wheels print last is what ``sha256sum`` prints for the archive
    (the installers' --sha256 / -Sha256 take its first word), and ``sha256sum -c`` accepts it."""
    bundle = tmp_path / "linux-wheels.tar.gz"
    bundle.write_bytes(b"a wheelhouse\n")
    tool = shutil.which("sha256sum")
    assert tool, "sha256sum (coreutils) not found"
    expected = subprocess.run([tool, bundle.name], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              check=True).stdout
    assert wheelhouse.checksum_line(bundle) + "\n" == expected
    check = subprocess.run([tool, "-c", "-"], input=expected, cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, check=False)
    assert check.returncode == 0
