"""CycloneDX SBOMs of what se-exporter ships (``make sbom``), written by cyclonedx-py (the CycloneDX project's
generator) and completed here with the sha256 of each wheel that is really shipped.

    python scripts/sbom.py [--image TAG]        # dist/linux-wheels.cdx.json, dist/windows-wheels.cdx.json and,
                                                # when TAG is built here, dist/image.cdx.json (copied out of it)
    python scripts/sbom.py add-hashes SBOM DIR  # inside the image build: hashes of the wheels pip installed

Wheelhouses: ``cyclonedx-py requirements`` reads the wheelhouse's requirements.txt (the runtime lock plus
se-exporter's own wheel), so every component carries its locked version and, as a distribution reference, every
hash the lock allows; each component's ``hashes`` then lists the sha256 of the wheels of it in the wheelhouse.
The image: the Dockerfile runs ``cyclonedx-py environment`` against the image's own Python after the install (what
is really installed there, the base's pip included) and ``add-hashes`` with the wheels that install used; the file
is /usr/share/doc/se-exporter/sbom.cdx.json, named by the image's ``org.opencontainers.image.sbom`` label.

``add-hashes`` uses the standard library only: it runs with the image's Python.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).parent.parent
IMAGE_PATH = "/usr/share/doc/se-exporter/sbom.cdx.json"
WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")


def _key(name: str, version: str) -> tuple[str, str]:
    return re.sub(r"[-_.]+", "-", name).lower(), version


def wheel_hashes(directory: Path) -> dict[tuple[str, str], list[str]]:
    """sha256 of every wheel in ``directory`` by (canonical name, version)."""
    found: dict[tuple[str, str], list[str]] = {}
    for wheel in sorted(directory.glob("*.whl")):
        match = WHEEL.match(wheel.name)
        if match:
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            found.setdefault(_key(match["name"], match["version"]), []).append(digest)
    return found


def add_hashes(sbom: Path, directory: Path) -> int:
    """Give each component the sha256 of its wheels in ``directory``; returns how many components got some."""
    document = json.loads(sbom.read_text())
    hashes = wheel_hashes(directory)
    count = 0
    for component in document.get("components", []):
        found = hashes.get(_key(component["name"], component.get("version", "")))
        if found:
            component["hashes"] = [{"alg": "SHA-256", "content": digest} for digest in found]
            count += 1
    sbom.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return count


def wheelhouse_sbom(house: Path, out: Path) -> None:
    """The SBOM of one wheelhouse (built by make linux-wheels / windows-wheels)."""
    requirements = house / "requirements.txt"
    if not requirements.is_file():
        raise SystemExit(f"sbom: no {requirements}: run make {house.name} first")
    tool = Path(sys.executable).parent / "cyclonedx-py"
    subprocess.run([str(tool), "requirements", "--pyproject", str(ROOT / "pyproject.toml"), "--output-reproducible",  # noqa: S603
                    "--of", "JSON", "-o", str(out), str(requirements)], check=True, timeout=300,
                   capture_output=True)
    add_hashes(out, house)


def image_sbom(tag: str, out: Path) -> bool:
    """Copy the SBOM the image carries out of it (docker when its daemon answers, buildah otherwise); False when
    no such image is built here."""
    import shutil  # noqa: PLC0415 - only for the host side; add-hashes runs in the image with the stdlib

    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True, timeout=20,  # noqa: S607
                                                 check=False).returncode == 0:
        made = subprocess.run(["docker", "create", tag], capture_output=True, text=True, timeout=60,  # noqa: S603, S607
                              check=False)
        if made.returncode:
            return False
        name = made.stdout.strip()
        try:
            subprocess.run(["docker", "cp", f"{name}:{IMAGE_PATH}", str(out)], check=True, timeout=60)  # noqa: S603, S607
        finally:
            subprocess.run(["docker", "rm", name], capture_output=True, timeout=60, check=False)  # noqa: S603, S607
        return True
    if shutil.which("buildah") is None:
        return False
    made = subprocess.run(["buildah", "from", "--pull=never", tag], capture_output=True, text=True,  # noqa: S603, S607
                          timeout=60, check=False)
    if made.returncode:
        return False
    name = made.stdout.strip()
    try:
        root = subprocess.run(["buildah", "mount", name], capture_output=True, text=True, timeout=60,  # noqa: S603, S607
                              check=True).stdout.strip()
        shutil.copyfile(Path(root) / IMAGE_PATH.lstrip("/"), out)
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, timeout=60, check=False)  # noqa: S603, S607
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["add-hashes"] and len(args) == 3:
        count = add_hashes(Path(args[1]), Path(args[2]))
        print(f"{args[1]}: sha256 of the installed wheels added to {count} components")
        return 0
    image = None
    if args[:1] == ["--image"] and len(args) == 2:
        image = args[1]
    elif args:
        raise SystemExit(__doc__)
    if image:
        out = ROOT / "dist" / "image.cdx.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        if image_sbom(image, out):
            print(f"{out.relative_to(ROOT)}: copied from {image}:{IMAGE_PATH}")
        else:
            print(f"no image {image} here (make image builds it): its SBOM not copied")
    for kind in ("linux-wheels", "windows-wheels"):
        out = ROOT / "dist" / f"{kind}.cdx.json"
        wheelhouse_sbom(ROOT / "dist" / kind, out)
        print(f"{out.relative_to(ROOT)}: {len(json.loads(out.read_text())['components'])} components")
    return 0


if __name__ == "__main__":
    sys.exit(main())
