"""scripts/image.py: what the image build takes from the host's pip configuration, and the build command lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts import image
from scripts.image import CA_SECRET, build_command, build_pip_config


def test_pip_config_keeps_the_hosts_index_and_mounts_its_ca_bundle(tmp_path: Path) -> None:
    """The host's index URLs reach the build (PIP_* over the wheel section over global), its CA bundle is named at
    the secret's path, and settings naming the host's files (file:// indexes, find-links directories) are dropped."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    listing = "\n".join([
        f":env:.cert='{bundle}'",
        ":env:.default-timeout='180'",
        ":env:.find-links='/opt/wheels'",
        ":env:.index-url='https://env.example.invalid/simple'",
        "global.extra-index-url='file:///opt/pypi/simple https://extra.example.invalid/simple'",
        "global.index-url='https://global.example.invalid/simple'",
        "global.trusted-host='extra.example.invalid'",
        "install.index-url='https://install-only.example.invalid/simple'",
        "wheel.retries='7'",
        "global.retries='2'",
    ])
    text, cert = build_pip_config(listing)
    assert text.splitlines() == [
        "[global]",
        "default-timeout = 180",
        "extra-index-url = https://extra.example.invalid/simple",
        "index-url = https://env.example.invalid/simple",
        "retries = 7",
        "trusted-host = extra.example.invalid",
        f"cert = {CA_SECRET}",
    ]
    assert cert == bundle


def test_pip_config_without_host_settings_leaves_pip_its_defaults(tmp_path: Path) -> None:
    """No host configuration (or a CA bundle that does not exist) gives an empty [global] and nothing to mount."""
    assert build_pip_config("") == ("[global]\n", None)
    assert build_pip_config(f"global.cert='{tmp_path / 'missing.pem'}'") == ("[global]\n", None)


def test_build_commands_for_both_engines(tmp_path: Path) -> None:
    """buildah builds with chroot isolation in the docker format (the one that keeps HEALTHCHECK); both engines get
    the pip settings and CA bundle as build secrets, and BASE only when one is given."""
    conf, bundle = tmp_path / "pip.conf", tmp_path / "ca.pem"
    buildah = build_command("buildah", "se-exporter:t", "stand-in:1", conf, bundle, ["--root", "/r"], ["--pull=never"])
    assert buildah[:8] == ["buildah", "--root", "/r", "build", "--isolation", "chroot", "--format", "docker"]
    assert {"--pull=never", f"--secret=id=pip.conf,src={conf}", f"--secret=id=ca-bundle,src={bundle}",
            "BASE=stand-in:1"} <= set(buildah)
    docker = build_command("docker", "se-exporter:t", None, conf, None)
    assert docker[:2] == ["docker", "build"]
    assert f"--secret=id=pip.conf,src={conf}" in docker
    assert not [a for a in docker if a.startswith(("BASE=", "--secret=id=ca-bundle"))]
    assert docker[-5:-3] == ["--tag", "se-exporter:t"]


def test_dockerfile_installs_the_lock_with_hashes_and_no_index() -> None:
    """The build stage downloads requirements/runtime.txt with hashes required and wheels only; the runtime stage
    installs it with no index and hashes required, se-exporter's own wheel alone (--no-deps); the final image gets
    the SBOM file and the label naming it."""
    text = (Path(__file__).parent.parent.parent / "Dockerfile").read_text().replace("\\\n", " ")
    steps = [" ".join(line.split()) for line in text.splitlines()]
    assert any("pip download" in s and "--require-hashes --only-binary=:all:" in s
               and "-r requirements/runtime.txt" in s for s in steps)
    installs = [s for s in steps if "pip install" in s]
    assert any("--no-index" in s and "--require-hashes -r /tmp/requirements/runtime.txt" in s for s in installs)
    assert any("--no-index --no-deps /tmp/wheels/own/*.whl" in s for s in installs)
    assert all("--no-index" in s for s in installs)
    assert 'org.opencontainers.image.sbom="/usr/share/doc/se-exporter/sbom.cdx.json"' in text
    assert "COPY --from=sbom /tmp/sbom.cdx.json /usr/share/doc/se-exporter/sbom.cdx.json" in text


def test_a_failed_build_names_base_when_none_was_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A machine that cannot pull python:3.11-slim is told how to name another base; one that named it is not."""
    engine = tmp_path / "buildah"
    engine.write_text("#!/bin/sh\necho 'Error: pull access denied for python' >&2\nexit 125\n")
    engine.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert image.main(["--engine", "buildah", "--tag", "t"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "image build failed (exit 125); if python:3.11-slim could not be pulled, name a Python 3.11 base image you "
        "can reach: make image BASE=<image>")
    assert image.main(["--engine", "buildah", "--tag", "t", "--base", "mirror.invalid/python:3.11"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == "image build failed (exit 125)"
