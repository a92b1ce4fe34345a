"""VM deployment files: the systemd unit verifies, the installs are offline and hash-checked, the env example names
real settings. (Kubernetes: the Helm chart, tests/project/test_chart.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from se_exporter.sidecar.settings import RUN_OPTIONS

ROOT = Path(__file__).parent.parent.parent
SYSTEMD = ROOT / "deploy" / "systemd"



def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the unit without a single complaint (unknown keys only warn, so silence
    is required too); ExecStart points at this checkout's console script, as it would at /opt/se-exporter."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze not found (Debian's systemd package)")
    script = Path(sys.executable).parent / "se-exporter"
    unit = (SYSTEMD / "se-exporter.service").read_text()
    assert "ExecStart=/opt/se-exporter/current/bin/se-exporter run" in unit
    installed = unit.replace("/opt/se-exporter/current/bin/se-exporter", str(script))
    (tmp_path / "se-exporter.service").write_text(installed)
    result = subprocess.run([analyze, "verify", str(tmp_path / "se-exporter.service")], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_unit_is_hardened() -> None:
    """Unprivileged, state in StateDirectory, a read-only system, restart on failure."""
    unit = (SYSTEMD / "se-exporter.service").read_text()
    for line in ("DynamicUser=yes", "StateDirectory=se-exporter", "ProtectSystem=strict", "NoNewPrivileges=yes",
                 "Environment=SE_EXPORTER_STATE_DIR=/var/lib/se-exporter", "Restart=always", "CapabilityBoundingSet="):
        assert f"\n{line}\n" in unit, line


def test_vm_installs_are_offline_with_hashes_required() -> None:
    """install.sh (which the scale-set custom data runs, test_deploy_install.py) installs se-exporter only from the
    wheelhouse's requirements.txt, with no package index and every hash required (tests/project/test_wheelhouses.py
    runs install.sh's command)."""
    script = (SYSTEMD / "install.sh").read_text().replace("\\\n", " ")
    steps = [line for line in script.splitlines() if "pip\" install" in line]
    assert len(steps) == 1
    assert {"--no-index", "--require-hashes", "-r"} <= set(steps[0].split()), steps[0]


def test_environment_example_names_only_real_settings() -> None:
    """Every variable in the env file example is one se-exporter (or OpenTelemetry) reads."""
    known = {option.env for option in RUN_OPTIONS}
    text = (SYSTEMD / "se-exporter.env.example").read_text() + (SYSTEMD / "cloud-init.yaml").read_text()
    names = set(re.findall(r"^\s*#?\s*((?:SE_EXPORTER|OTEL)_[A-Z_]+)=", text, re.M))
    assert names and names <= known | {"OTEL_EXPORTER_OTLP_ENDPOINT"}
