"""The container image, built and run as a user would, with buildah (the test in tests/integration/test_image.py
and `make bench` use it).

No image registry is reachable where the suite runs, so ``python:3.11-slim`` cannot be pulled. The Dockerfile takes
its base as a build argument, and this module builds a stand-in with the same contract from Debian's packages
(``debootstrap --variant=minbase bookworm`` from the mirror the host's apt uses, python3 + python3-venv, a
virtualenv on PATH where pip may install). It is kept between runs in a buildah storage of its own under
~/.cache/se-exporter, tagged with a hash of its recipe, so changing the recipe builds a new one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scripts import image

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "se-exporter" / "image-test"
# Storage state (mount counts, locks) lives on /run, which a reboot clears together with the mounts it describes.
BUILDAH = ["buildah", "--root", str(CACHE / "storage"), "--runroot", "/run/se-exporter-image-test"]
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv")
VENV = "/opt/venv"
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Everything that decides the stand-in's content: the cache key. Bump "recipe" when the steps below change.
RECIPE = {"recipe": 2, "suite": SUITE, "variant": "minbase", "packages": PACKAGES, "venv": VENV, "path": PATH}
KEY = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:16]
BASE_NAME = "localhost/se-exporter-stand-in-base"
# Left out of the stand-in: downloaded packages and indexes and device nodes (python:3.11-slim has none either; a
# container gets /dev from its runtime), and files naming the build host or its mirror.
STRIP = ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "etc/apt/sources.list", "etc/hostname",
         "etc/resolv.conf", "dev/*")


def buildah(*args: str, timeout: float = 120) -> str:
    result = subprocess.run([*BUILDAH, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode:
        raise RuntimeError(f"buildah {' '.join(args)} exited with {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout


def unavailable() -> str | None:
    """Why the image cannot be built and run here, or None."""
    if shutil.which("buildah") is None:
        return "buildah is not installed (make test installs it with apt-get on Debian)"
    if os.geteuid() != 0:
        return "needs root: debootstrap builds the stand-in base image and buildah runs it with chroot isolation"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (make test installs it with apt-get on Debian)"
    if shutil.which("apt-get") is None or not debian_mirror():
        return f"the host's apt configuration names no Debian {SUITE} mirror for debootstrap"
    return None


def debian_mirror() -> str:
    """The mirror this host's apt fetches the suite from (read from the host's apt configuration, not written down
    anywhere here), or ''."""
    for selector in (f"Release: {SUITE}", f"Codename: {SUITE}"):
        found = subprocess.run(["apt-get", "indextargets", "--format", "$(SITE)", selector, "Identifier: Packages"],
                               capture_output=True, text=True, timeout=60, check=False).stdout.split()
        if found:
            return found[0]
    return ""


@contextmanager
def _locked() -> Iterator[None]:
    """One builder of the stand-in at a time on this machine (two suites may start together)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def stand_in_base() -> str:
    """The stand-in base image's name, built first if this machine has none for the current recipe."""
    name = f"{BASE_NAME}:{KEY}"
    with _locked():
        _prune_dead_runs()
        listed = json.loads(buildah("images", "--json")) or []
        names = {n for entry in listed for n in entry.get("names") or ()}
        if name not in names:
            _build_stand_in(name)
            for stale in sorted(n for n in names if n.startswith(f"{BASE_NAME}:")):
                buildah("rmi", stale)
    return name


def run_name(what: str) -> str:
    """A container or image name carrying this process's PID, so a later run can tell leftovers of a killed one."""
    return f"se-exporter-{what}-{RUN_MARK}{os.getpid()}"


RUN_MARK = "run"
_RUN_PID = re.compile(rf"se-exporter-[\w-]+?-{RUN_MARK}(\d+)")


def _prune_dead_runs() -> None:
    """Remove containers and images left by test runs that were killed before their clean-up (never a live run's:
    two suites may share this storage)."""
    def dead(name: str) -> bool:
        match = _RUN_PID.search(name)
        return match is not None and not Path(f"/proc/{match.group(1)}").exists()

    for entry in json.loads(buildah("containers", "--json")) or []:
        if dead(entry["containername"]):
            _unmount_below(Path(buildah("mount", entry["id"]).strip()))
            buildah("rm", entry["id"])
    for entry in json.loads(buildah("images", "--json")) or []:
        if any(dead(n) for n in entry.get("names") or ()):
            buildah("rmi", "--force", entry["id"])


def _build_stand_in(name: str) -> None:
    """debootstrap straight into a new container's root filesystem, add the virtualenv, commit."""
    container = buildah("from", "--name", run_name("stand-in"), "scratch").strip()
    rootfs = Path(buildah("mount", container).strip())
    try:
        _run("debootstrap", f"--variant={RECIPE['variant']}", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs),
             debian_mirror(), timeout=600)
        _run("chroot", str(rootfs), "python3", "-m", "venv", VENV)
        _unmount_below(rootfs)  # nothing should be left mounted; never delete through a mount
        for pattern in STRIP:
            for path in rootfs.glob(pattern):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        buildah("config", "--env", f"PATH={PATH}", "--env", "LANG=C.UTF-8", "--cmd", "python3", container)
        buildah("commit", "--quiet", "--format", "docker", container, name, timeout=300)
    finally:
        _unmount_below(rootfs)
        buildah("rm", container)


def _unmount_below(root: Path) -> None:
    """Unmount what a killed debootstrap left mounted inside ``root`` (/proc, /sys, perhaps a bind of the host's
    /dev), deepest first: removing a tree through such a mount would delete the host's files."""
    mounts = [Path(line.split()[1]) for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if root in m.parents), key=lambda m: len(m.parts), reverse=True):
        _run("umount", "--lazy", str(mount))


def _run(*command: str, timeout: float = 120) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} exited with {result.returncode}: {result.stderr[-2000:]}"
                           f"{result.stdout[-2000:]}")


def build_image(tag: str, base: str) -> None:
    """Build the repository's Dockerfile on ``base`` the way ``make image`` does (host pip settings as build
    secrets); the base is never pulled."""
    try:
        image.build(tag, base, "buildah", buildah_options=BUILDAH[1:], build_options=["--pull=never"])
    except subprocess.CalledProcessError as failed:
        raise RuntimeError(f"the image build failed: {failed.stderr[-3000:]}{failed.stdout[-3000:]}") from None


def image_size(name: str) -> int:
    """Bytes of the image's layers, uncompressed (what it takes on a node's disk)."""
    manifest = json.loads(json.loads(buildah("inspect", "--type", "image", name))["Manifest"])
    return sum(int(layer["size"]) for layer in manifest["layers"])


def image_config(name: str) -> dict[str, object]:
    """The image's docker-format config (Entrypoint, User, Healthcheck, Env...)."""
    config: dict[str, object] = json.loads(buildah("inspect", "--type", "image", name))["Docker"]["config"]
    return config


def remove_image(name: str) -> None:
    subprocess.run([*BUILDAH, "rmi", "--force", name], capture_output=True, timeout=120, check=False)


FileState = tuple[int, int, int, int, int, str]


def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, FileState]:
    """Every path under ``root`` (relative) with its type and permissions, owner, size, modification time and link
    target: two snapshots differ wherever anything was created, removed or written. Directories in ``skip`` are
    listed but not entered (mount points of volumes)."""
    found = {".": _state(root)}
    for directory, subdirectories, files in os.walk(root):
        for entry in (*subdirectories, *files):
            path = Path(directory, entry)
            found[str(path.relative_to(root))] = _state(path)
        subdirectories[:] = [d for d in subdirectories if str(Path(directory, d).relative_to(root)) not in skip]
    return found


def _state(path: Path) -> FileState:
    info = path.lstat()
    target = os.readlink(path) if path.is_symlink() else ""
    return info.st_mode, info.st_uid, info.st_gid, info.st_size, info.st_mtime_ns, target
