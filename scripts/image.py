"""Build the container image with docker when a daemon answers, with buildah otherwise (``make image``).

    python3 scripts/image.py [--tag se-exporter:latest] [--base IMAGE] [--engine docker|buildah]

pip inside the build must use the package index this host uses, and trust the CA bundle this host's pip trusts (a
mirror, or a proxy that re-signs TLS, is common where images are built). Both are read from the host's pip
configuration at build time (``pip config list``: files and ``PIP_*`` variables) and handed to the build as build
secrets, which are mounted for the one ``pip wheel`` step and stored in no layer. Nothing about the index is
written into the repository. Settings that name local paths (``file://`` indexes, ``find-links`` directories) are
left out: the build cannot see the host's files.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).parent.parent
CA_SECRET = "/run/secrets/ca-bundle"  # noqa: S105 - a path, not a password: where the Dockerfile's pip step finds the mounted CA bundle
URL_LISTS = ("index-url", "extra-index-url", "find-links")  # kept only for their http(s) entries
PASSED = (*URL_LISTS, "trusted-host", "timeout", "default-timeout", "retries", "proxy")


def pip_listing() -> str:
    """The output of the host's ``pip config list`` ('' when this Python has no pip: then pip's defaults apply)."""
    if importlib.util.find_spec("pip") is None:
        return ""
    return subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          timeout=60, check=True).stdout


def build_pip_config(listing: str) -> tuple[str, Path | None]:
    """The pip.conf the build step reads, and the CA bundle to mount with it (None: the image's own is used).

    ``listing`` is ``pip config list`` output (``section.option='value'`` lines; ``:env:`` holds ``PIP_*``
    variables). Precedence as pip applies it to ``pip wheel``: environment, then the ``wheel`` section, then
    ``global``.
    """
    chosen: dict[str, tuple[int, str]] = {}
    rank = {"global": 0, "wheel": 1, ":env:": 2}
    for line in listing.splitlines():
        key, sep, quoted = line.partition("=")
        section, _, option = key.rpartition(".")
        if not sep or section not in rank or option not in (*PASSED, "cert"):
            continue
        if option not in chosen or rank[section] >= chosen[option][0]:
            chosen[option] = (rank[section], quoted.strip().strip("'\""))
    lines = ["[global]"]
    for option, (_, value) in sorted(chosen.items()):
        text = " ".join(u for u in value.split() if u.startswith(("http://", "https://"))) if option in URL_LISTS \
            else value
        if text and option != "cert":
            lines.append(f"{option} = {text}")
    cert = Path(chosen["cert"][1]) if "cert" in chosen else None
    if cert is not None and cert.is_file():
        lines.append(f"cert = {CA_SECRET}")
    else:
        cert = None
    return "\n".join(lines) + "\n", cert


def docker_daemon() -> bool:
    """True when a docker CLI is installed and its daemon answers."""
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def choose_engine() -> str:
    if docker_daemon():
        return "docker"
    if shutil.which("buildah"):
        return "buildah"
    raise SystemExit("neither a running docker daemon nor buildah was found: install one (apt-get install buildah)")


def build_command(engine: str, tag: str, base: str | None, pip_conf: Path, cert: Path | None,
                  buildah_options: Sequence[str] = (), build_options: Sequence[str] = ()) -> list[str]:
    """The build command line. buildah runs steps with chroot isolation (no OCI runtime or cgroup set-up needed,
    so it works inside containers and CI runners) and keeps the docker format, the one that stores HEALTHCHECK."""
    secrets = [f"--secret=id=pip.conf,src={pip_conf}"] + ([f"--secret=id=ca-bundle,src={cert}"] if cert else [])
    base_arg = ["--build-arg", f"BASE={base}"] if base else []
    if engine == "docker":
        head = ["docker", "build"]
    else:
        head = ["buildah", *buildah_options, "build", "--isolation", "chroot", "--format", "docker"]
    return [*head, *build_options, *secrets, *base_arg, "--tag", tag, "--file", str(ROOT / "Dockerfile"), str(ROOT)]


def build(tag: str, base: str | None = None, engine: str | None = None, buildah_options: Sequence[str] = (),
          build_options: Sequence[str] = (), listing: str | None = None,
          capture: bool = True) -> subprocess.CompletedProcess[str]:
    """Build the image (output captured, or shown as it comes); raises CalledProcessError on failure."""
    engine = engine or choose_engine()
    pip_conf, cert = build_pip_config(pip_listing() if listing is None else listing)
    with tempfile.TemporaryDirectory(prefix="se-exporter-build-") as scratch:
        conf = Path(scratch, "pip.conf")
        conf.write_text(pip_conf)
        command = build_command(engine, tag, base, conf, cert, buildah_options, build_options)
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}  # build secrets need BuildKit
        return subprocess.run(command, capture_output=capture, text=True, timeout=900, check=True, env=env)


def failure(returncode: int, base: str | None) -> str:
    """The one line a failed build ends with. Without ``BASE`` the build pulls python:3.11-slim from Docker Hub,
    which many machines cannot reach: say how to name a base they can."""
    line = f"image build failed (exit {returncode})"
    if base is None:
        line += ("; if python:3.11-slim could not be pulled, name a Python 3.11 base image you can reach: "
                 "make image BASE=<image>")
    return line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="se-exporter:latest")
    parser.add_argument("--base", help="base image (default: the Dockerfile's, python:3.11-slim)")
    parser.add_argument("--engine", choices=("docker", "buildah"), help="default: docker if its daemon answers")
    args = parser.parse_args(argv)
    engine = args.engine or choose_engine()
    print(f"building {args.tag} with {engine}", flush=True)
    try:
        build(args.tag, args.base, engine, capture=False)
    except subprocess.CalledProcessError as failed:
        print(failure(failed.returncode, args.base), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
