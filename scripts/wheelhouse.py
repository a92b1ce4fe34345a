"""Offline wheelhouses from the runtime lock: every locked dependency as a wheel for each target, se-exporter's own
wheel, and a requirements.txt naming all of them by hash, so a VM installs with no index and hashes required:

    pip install --no-index --find-links DIR --require-hashes -r DIR/requirements.txt

    python scripts/wheelhouse.py linux [--dest dist/linux-wheels]      # make linux-wheels
    python scripts/wheelhouse.py windows [--dest dist/windows-wheels]  # make windows-wheels

linux: manylinux x86_64 and aarch64, CPython 3.10-3.12, dist/linux-wheels and linux-wheels.tar.gz beside it (what
deploy/systemd/install.sh and the scale-set custom data install). windows: win_amd64 or pure-Python, CPython
3.10-3.12, the lock's markers evaluated for win_amd64 (so what only Windows needs is there), dist/windows-wheels and
windows-wheels.zip (what deploy/windows/install.ps1 installs). Each pin is downloaded with ``--only-binary=:all:
--no-deps --require-hashes`` for each target, one at a time, so a package without a wheel for a target fails named;
files already in the folder are checked against the lock's hashes and not fetched again. The last line printed is
the archive's ``sha256sum`` line: the installers refuse an archive whose hash is not the one they are given.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

try:
    from scripts import lockfile
except ImportError:  # run as a script: scripts/ is on the path
    import lockfile  # type: ignore[no-redef]

ROOT = Path(__file__).parent.parent
PROJECT = "se-exporter"
# The oldest glibc a wheel may need: 2.28 (Debian 10, Ubuntu 20.04 and RHEL 8 have it or newer).
GLIBC = [(2, minor) for minor in range(28, 4, -1)]
LEGACY = {(2, 5): "manylinux1", (2, 12): "manylinux2010", (2, 17): "manylinux2014"}
TARGETS = {
    "linux": ("linux-x86_64", "linux-aarch64"),
    "windows": ("win-amd64",),
}
# What each kind is for, in the line main prints.
FOR = {"linux": "manylinux x86_64 and aarch64, CPython 3.10-3.12; for install.sh",
       "windows": "win_amd64, CPython 3.10-3.12; for install.ps1"}


def platform_tags(platform: str) -> list[str]:
    if platform == "win-amd64":
        return ["win_amd64"]
    arch = lockfile.PLATFORMS[platform]["platform_machine"]
    tags = []
    for glibc in GLIBC:
        tags.append(f"manylinux_{glibc[0]}_{glibc[1]}_{arch}")
        if glibc in LEGACY:
            tags.append(f"{LEGACY[glibc]}_{arch}")
    return tags


def supported(platform: str, python: str) -> set[Tag]:
    version = tuple(int(p) for p in python.split("."))
    platforms = platform_tags(platform)
    return {*cpython_tags(version, platforms=platforms), *compatible_tags(version, "cp" + python.replace(".", ""),
                                                                          platforms=platforms)}


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-qq", *args]
    result = subprocess.run(command, check=False)  # noqa: S603 - our own interpreter's pip with fixed arguments
    if result.returncode:
        raise SystemExit(f"wheelhouse: pip {' '.join(args[:2])} ... {args[-1]} failed (exit {result.returncode})")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(dest: Path, kind: str, pythons: Sequence[str] = lockfile.PYTHONS) -> list[Path]:
    """Fill ``dest`` for ``kind`` ("linux" or "windows"); returns the wheels it holds."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = lockfile.read(lockfile.RUNTIME)
    wanted: set[str] = set()
    for platform in TARGETS[kind]:
        for python in pythons:
            tags = supported(platform, python)
            for pin in lockfile.select(pins, platform, python):
                have = _have(dest, pin, tags)
                if have is None:
                    print(f"  {pin.name}=={pin.version} ({platform}, Python {python})", flush=True)
                    with tempfile.TemporaryDirectory() as scratch:
                        one = Path(scratch) / "pin.txt"
                        one.write_text(pin.line() + "\n")
                        pip("download", "--no-deps", "--only-binary=:all:", "--require-hashes", "--implementation",
                            "cp", "--python-version", python, *(f"--platform={t}" for t in platform_tags(platform)),
                            "--dest", str(dest), "-r", str(one))
                    have = _have(dest, pin, tags)
                    if have is None:
                        raise SystemExit(f"wheelhouse: no {platform} wheel of {pin.name}=={pin.version} for Python "
                                         f"{python}")
                wanted.add(have.name)
    for stale in dest.glob("*.whl"):
        if stale.name not in wanted and not stale.name.startswith("se_exporter-"):
            stale.unlink()  # a version the lock no longer names
    for old in dest.glob("se_exporter-*.whl"):
        old.unlink()
    pip("wheel", "--no-deps", "--wheel-dir", str(dest), str(ROOT))
    (own,) = dest.glob("se_exporter-*.whl")
    version = parse_wheel_filename(own.name)[1]
    lock = lockfile.RUNTIME.read_text()
    (dest / "requirements.txt").write_text(
        f"{lock}# se-exporter itself, built from this checkout\n{PROJECT}=={version} \\\n"
        f"    --hash=sha256:{sha256(own)}\n")
    return sorted(dest.glob("*.whl"))


def _have(dest: Path, pin: lockfile.Pin, tags: set[Tag]) -> Path | None:
    """A wheel of the pin in ``dest`` that installs on the target and whose hash the lock names."""
    for path in dest.glob("*.whl"):
        name, version, _, wheel_tags = parse_wheel_filename(path.name)
        if name == pin.name and str(version) == str(_version(pin.version)) and wheel_tags & tags:
            return path if sha256(path) in pin.hashes else None
    return None


def _version(text: str) -> object:
    from packaging.version import Version  # noqa: PLC0415

    return Version(text)


def archive(dest: Path, kind: str) -> Path:
    """The folder as one file beside it: .tar.gz for Linux (install.sh), .zip for Windows (install.ps1)."""
    files = [*sorted(dest.glob("*.whl")), dest / "requirements.txt"]
    if kind == "windows":
        target = dest.with_suffix(".zip")
        with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as bundle:  # wheels are compressed already
            for path in files:
                bundle.write(path, path.name)
        return target
    target = dest.with_suffix(".tar.gz")
    with tarfile.open(target, "w:gz") as bundle:
        for path in files:
            bundle.add(path, f"{dest.name}/{path.name}")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(TARGETS))
    parser.add_argument("--dest", type=Path, help="the folder (default: dist/KIND-wheels)")
    args = parser.parse_args(argv)
    dest = args.dest or ROOT / "dist" / f"{args.kind}-wheels"
    wheels = build(dest, args.kind)
    bundle = archive(dest, args.kind)
    print(f"{len(wheels)} wheels ({FOR[args.kind]}) in {dest} and {bundle.name}; its hash, for the installer:")
    print(checksum_line(bundle))
    return 0


def checksum_line(bundle: Path) -> str:
    """The archive's line as ``sha256sum`` prints it: the installers take the hash from it, published apart from the
    archive, so a wheelhouse rewritten together with its requirements.txt is refused."""
    return f"{sha256(bundle)}  {bundle.name}"


if __name__ == "__main__":
    sys.exit(main())
