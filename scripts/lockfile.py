"""The hash-pinned locks in requirements/ (written by ``make lock`` with uv): read, and narrowed to one platform.

A lock is universal: one file for every platform and Python 3.10+, each pin with its environment marker and the
sha256 of every file the index has for that version. The wheelhouses and the suite read it here; pip installs it
(``--require-hashes``) as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker, default_environment
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parent.parent
RUNTIME = ROOT / "requirements" / "runtime.txt"
TEST = ROOT / "requirements" / "test.txt"
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+?)(?:\s*;\s*(?P<marker>.+?))?\s*\\?$")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
VIA = re.compile(r"^#\s+(?:via\s+)?(?P<parent>[A-Za-z0-9][\w.-]*)(?: \((?P<where>[^)]+)\))?$")
# The targets the runtime lock must serve: (platform, Python).
PYTHONS = ("3.10", "3.11", "3.12")
PLATFORMS = {
    "linux-x86_64": {"os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
                     "platform_machine": "x86_64"},
    "linux-aarch64": {"os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
                      "platform_machine": "aarch64"},
    "win-amd64": {"os_name": "nt", "sys_platform": "win32", "platform_system": "Windows",
                  "platform_machine": "AMD64"},
}


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    marker: Marker | None
    hashes: tuple[str, ...]
    via: tuple[str, ...]  # what requires it, as uv wrote it ("se-exporter" for pyproject.toml's own list)

    def line(self) -> str:
        """The pin as a requirements line pip reads with --require-hashes (marker dropped: already applied)."""
        return " ".join([f"{self.name}=={self.version}", *(f"--hash=sha256:{h}" for h in self.hashes)])


def read(path: Path = RUNTIME) -> list[Pin]:
    pins: list[Pin] = []
    current: dict[str, object] | None = None
    for raw in [*path.read_text().splitlines(), ""]:
        line = raw.strip()
        match = PIN.match(line)
        if (match or not raw.startswith((" ", "\t"))) and current is not None:
            pins.append(Pin(**current))  # type: ignore[arg-type]
            current = None
        if match:
            marker = match.group("marker")
            current = {"name": canonicalize_name(match.group("name")), "version": match.group("version"),
                       "marker": Marker(marker) if marker else None, "hashes": (), "via": ()}
            continue
        if current is None:
            continue
        current["hashes"] = (*current["hashes"], *HASH.findall(line))  # type: ignore[misc]
        via = VIA.match(line)
        if via and via.group("parent") not in ("via", "-c", "-r"):
            parent = via.group("parent")
            current["via"] = (*current["via"], canonicalize_name(parent))  # type: ignore[misc]
    return pins


def environment(platform: str, python: str) -> dict[str, str]:
    """The marker environment of CPython ``python`` on ``platform`` (a key of PLATFORMS)."""
    env = dict(default_environment())
    env.update(PLATFORMS[platform], python_version=python, python_full_version=f"{python}.0",
               implementation_name="cpython", platform_python_implementation="CPython", platform_release="",
               platform_version="")
    return env


def select(pins: list[Pin], platform: str, python: str) -> list[Pin]:
    """The pins that apply on one target (the lock has at most one version of a package per target)."""
    env = {**environment(platform, python), "extra": ""}
    return [p for p in pins if p.marker is None or p.marker.evaluate(env)]
