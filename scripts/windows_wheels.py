"""Prove every runtime dependency installs on Windows (win_amd64), and collect the wheels ``install.ps1`` uses.

    python scripts/windows_wheels.py [--dest dist/windows-wheels] [--python-version 3.11]

The runtime set is read from this virtualenv: se-exporter's own requirements (extras left out: those are the test
tools) and theirs, recursively, with environment markers evaluated for Windows, pinned at the versions installed
here, so a VM gets what the suite tested. Each is downloaded for ``win_amd64`` with ``--only-binary=:all:
--no-deps``: one with neither a Windows wheel nor a pure-Python one fails, named. Then the same requirements are
resolved once more for Windows *with* dependencies, constrained to those pins: that adds what only Windows needs
(requirements behind ``sys_platform == "win32"``, which this Linux virtualenv never installed), so the folder is a
complete offline wheelhouse, se-exporter's own wheel included, also zipped beside it (``windows-wheels.zip``, what
``deploy/windows/install.ps1`` installs from). Files already in ``--dest`` are not fetched again.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parent.parent
PROJECT = "se-exporter"


def windows_environment(python_version: str) -> dict[str, str]:
    """The marker environment of CPython ``python_version`` on 64-bit Windows."""
    environment = dict(default_environment())
    environment.update(os_name="nt", sys_platform="win32", platform_system="Windows", platform_machine="AMD64",
                       platform_release="", platform_version="", python_version=python_version,
                       python_full_version=f"{python_version}.0", implementation_name="cpython",
                       platform_python_implementation="CPython")
    return environment


def runtime_pins(python_version: str) -> tuple[list[str], list[str]]:
    """``name==version`` of every installed runtime dependency Windows needs, and the Windows-only requirements
    this virtualenv does not hold (resolved by pip in the second pass)."""
    environment = windows_environment(python_version)
    pins: dict[str, str] = {}
    missing: list[str] = []
    pending = [PROJECT]
    while pending:
        name = pending.pop()
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": ""}):
                continue
            key = canonicalize_name(requirement.name)
            if key in pins:
                continue
            try:
                pins[key] = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                missing.append(str(requirement))
                continue
            pending.append(requirement.name)
    return [f"{name}=={version}" for name, version in sorted(pins.items())], missing


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-qq", *args]
    result = subprocess.run(command, check=False)  # noqa: S603 - our own interpreter's pip with fixed arguments
    if result.returncode:
        raise SystemExit(f"windows wheels: pip {' '.join(args[:2])} ... failed (exit {result.returncode})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "dist" / "windows-wheels")
    parser.add_argument("--python-version", default="3.11")
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    target = ["--platform", "win_amd64", "--python-version", args.python_version, "--implementation", "cp",
              "--only-binary=:all:", "--dest", str(args.dest)]
    pins, missing = runtime_pins(args.python_version)
    for pin in pins:  # one at a time, so that a failure names its package
        if _have(args.dest, pin):
            continue
        print(f"  {pin}", flush=True)
        pip("download", "--no-deps", *target, pin)
    stamp = args.dest / ".resolved"
    wanted = "\n".join([args.python_version, *pins, *missing]) + "\n"
    if not stamp.is_file() or stamp.read_text() != wanted:
        _resolve(target, pins, missing)
        stamp.write_text(wanted)
    pip("wheel", "--no-deps", "--wheel-dir", str(args.dest), str(ROOT))
    wheels = sorted(args.dest.glob("*.whl"))
    archive = args.dest.with_suffix(".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as bundle:  # wheels are compressed already
        for wheel in wheels:
            bundle.write(wheel, wheel.name)
    print(f"{len(pins)} runtime dependencies have win_amd64 or pure-Python wheels; {len(wheels)} wheels in "
          f"{args.dest} and {archive.name} (for install.ps1)")
    return 0


def _have(dest: Path, pin: str) -> bool:
    """A wheel of this exact version is in ``dest`` already (a previous run): no need to ask the index again."""
    name, version = pin.split("==")
    prefix = f"{canonicalize_name(name).replace('-', '_')}-{version}-"
    return any(path.name.lower().startswith(prefix) for path in dest.glob("*.whl"))


def _resolve(target: list[str], pins: list[str], missing: list[str]) -> None:
    """The full Windows resolution, constrained to the pins: adds what only Windows requires."""
    with tempfile.TemporaryDirectory() as scratch:
        constraints = Path(scratch) / "constraints.txt"
        constraints.write_text("\n".join(pins) + "\n")
        top = [str(Requirement(text)) for text in metadata.requires(PROJECT) or []
               if Requirement(text).marker is None or "extra" not in str(Requirement(text).marker)]
        pip("download", *target, "--constraint", str(constraints), *top, *missing)


if __name__ == "__main__":
    sys.exit(main())
