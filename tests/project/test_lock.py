"""The locks in requirements/ agree with pyproject.toml and with what the suite runs on, without the network: every
declared requirement is locked at a version its range allows on every target, nothing is locked as a direct
requirement that pyproject.toml no longer declares, every pin carries hashes, each target gets one version of each
package, and the test venv holds exactly the locked versions of the runtime closure."""

from __future__ import annotations

import platform as host
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scripts import lockfile
from tests.conftest import Reliability

ROOT = Path(__file__).parent.parent.parent
PROJECT = canonicalize_name("se-exporter")
TARGETS = [(platform, python) for platform in lockfile.PLATFORMS for python in lockfile.PYTHONS]


def declared(pyproject: str, extras: tuple[str, ...] = ()) -> list[Requirement]:
    project = tomllib.loads(pyproject)["project"]
    texts = [*project["dependencies"], *(t for extra in extras for t in project["optional-dependencies"][extra])]
    return [Requirement(t) for t in texts]


def disagreements(requirements: list[Requirement], pins: list[lockfile.Pin],
                  targets: list[tuple[str, str]]) -> list[str]:
    """What differs between the declared requirements and a lock, for the given targets ([] when they agree)."""
    found = []
    for platform, python in targets:
        chosen = {p.name: p for p in lockfile.select(pins, platform, python)}
        env = {**lockfile.environment(platform, python), "extra": ""}
        for requirement in requirements:
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            pin = chosen.get(canonicalize_name(requirement.name))
            if pin is None:
                found.append(f"{requirement} is not locked for {platform} Python {python}")
            elif not requirement.specifier.contains(pin.version, prereleases=True):
                found.append(f"{requirement} does not allow the locked {pin.name}=={pin.version}")
    direct = {p.name for p in pins if PROJECT in p.via}
    names = {canonicalize_name(r.name) for r in requirements}
    found += [f"{name} is locked as a requirement of se-exporter but not declared" for name in sorted(direct - names)]
    return sorted(set(found))


def test_runtime_lock_agrees_with_pyproject() -> None:
    """requirements/runtime.txt locks pyproject.toml's dependencies (no extras) for Linux x86_64 and aarch64 and
    Windows, Python 3.10-3.12, at versions the declared ranges allow."""
    pins = lockfile.read(lockfile.RUNTIME)
    assert disagreements(declared((ROOT / "pyproject.toml").read_text()), pins, TARGETS) == []


def test_test_lock_agrees_with_pyproject_and_the_runtime_lock() -> None:
    """requirements/test.txt locks the dependencies and the test extra for Python 3.11+, and pins every runtime
    package at the runtime lock's version (the suite tests what ships)."""
    pins = lockfile.read(lockfile.TEST)
    linux = [(p, v) for p, v in TARGETS if p == "linux-x86_64" and v != "3.10"]
    assert disagreements(declared((ROOT / "pyproject.toml").read_text(), ("test",)), pins, linux) == []
    for platform, python in linux:
        runtime = {p.name: p.version for p in lockfile.select(lockfile.read(lockfile.RUNTIME), platform, python)}
        tested = {p.name: p.version for p in lockfile.select(pins, platform, python)}
        assert {name: tested.get(name) for name in runtime} == runtime


@pytest.mark.parametrize("change", [
    ('"h11>=0.14,<1",', '"h11>=0.14,<1",\n    "rich>=13",'),  # a new dependency, not locked
    ('"h11>=0.14,<1",', '"h11>=0.17,<1",'),  # a range the locked version falls outside of
    ('"azure-storage-blob>=12.19,<13",', ""),  # a dependency removed from pyproject.toml, still locked
])
def test_the_agreement_check_sees_a_change_to_pyproject(change: tuple[str, str], reliability: Reliability) -> None:
    """Each kind of change to pyproject.toml made without `make lock` is reported."""
    text = (ROOT / "pyproject.toml").read_text()
    assert change[0] in text
    changed = declared(text.replace(change[0], change[1], 1))
    assert disagreements(changed, lockfile.read(lockfile.RUNTIME), TARGETS) != []
    reliability("Supply chain", "pyproject.toml changed without make lock: a dependency added, a range moved, one "
                "removed", "each reported (the lock is read offline)")


def test_every_pin_has_hashes_and_each_target_one_version() -> None:
    """pip's --require-hashes needs a hash for each pin; a target with two versions of a package is a broken lock."""
    for path in (lockfile.RUNTIME, lockfile.TEST):
        pins = lockfile.read(path)
        assert pins and all(pin.hashes for pin in pins), path.name
        for platform, python in TARGETS:
            names = [p.name for p in lockfile.select(pins, platform, python)]
            assert len(names) == len(set(names)), (path.name, platform, python)


def test_the_test_venv_runs_the_locked_runtime_closure() -> None:
    """Walking se-exporter's installed requirements in this venv reaches exactly the runtime lock's packages for
    this platform, each installed at its locked version: what the suite tests is what ships."""
    target = ("linux-aarch64" if host.machine() == "aarch64" else "linux-x86_64",
              f"{sys.version_info.major}.{sys.version_info.minor}")
    locked = {p.name: p.version for p in lockfile.select(lockfile.read(lockfile.RUNTIME), *target)}
    env = {**lockfile.environment(*target), "extra": ""}
    seen: dict[str, str] = {}
    pending = ["se-exporter"]
    while pending:
        for text in metadata.requires(pending.pop()) or []:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            name = canonicalize_name(requirement.name)
            if name not in seen:
                seen[name] = metadata.version(name)
                pending.append(name)
    assert seen == locked


def test_make_lock_writes_both_locks_with_uv() -> None:
    """`make lock` is what the locks say regenerates them, and both name it."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lock:", makefile, re.M)
    for path in (lockfile.RUNTIME, lockfile.TEST):
        header = "# This file was autogenerated by uv via the following command:\n#    make lock\n"
        assert path.read_text().startswith(header)
