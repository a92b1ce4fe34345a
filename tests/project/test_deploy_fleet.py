"""The fleet's VM deployment files (deploy/fleet): the systemd unit verifies and is hardened like the sidecar's, and
the env example names only settings `se-exporter fleet` reads."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from se_exporter.fleet.settings import FLEET_OPTIONS

ROOT = Path(__file__).parent.parent.parent
FLEET = ROOT / "deploy" / "fleet"
UNIT = FLEET / "se-exporter-fleet.service"


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the unit without a single complaint; ExecStart points at this checkout's
    console script, as it would at /opt/se-exporter."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze not found (Debian's systemd package)")
    script = Path(sys.executable).parent / "se-exporter"
    unit = UNIT.read_text()
    assert "\nExecStart=/opt/se-exporter/bin/se-exporter fleet\n" in unit
    (tmp_path / UNIT.name).write_text(unit.replace("/opt/se-exporter/bin/se-exporter", str(script)))
    result = subprocess.run([analyze, "verify", str(tmp_path / UNIT.name)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_unit_is_hardened_like_the_sidecars() -> None:
    """Unprivileged, a read-only system, no capabilities, restart on failure: every hardening line of the sidecar's
    unit, except the state directory the fleet does not need (its state is in Blob Storage)."""
    sidecar = (ROOT / "deploy" / "systemd" / "se-exporter.service").read_text()
    hardening = {line for line in sidecar.splitlines()
                 if re.match(r"(Protect|Restrict|Private|NoNew|Lock|SystemCall|Capability|Ambient|DynamicUser)", line)}
    unit = UNIT.read_text().splitlines()
    assert hardening and hardening <= set(unit)
    assert "Restart=always" in unit and not any(line.startswith("StateDirectory") for line in unit)


def test_environment_example_names_only_real_settings() -> None:
    """Every variable in the env example is one `se-exporter fleet` reads, and it sets the ones a replica needs."""
    text = (FLEET / "se-exporter-fleet.env.example").read_text()
    names = set(re.findall(r"^\s*#?\s*(SE_EXPORTER_[A-Z_]+)=", text, re.M))
    assert names and names <= {option.env for option in FLEET_OPTIONS}
    active = set(re.findall(r"^(SE_EXPORTER_[A-Z_]+)=", text, re.M))
    needed = {"SE_EXPORTER_EVENTHUB_NAMESPACE", "SE_EXPORTER_CHECKPOINT_ACCOUNT_URL", "SE_EXPORTER_FLEET_LISTEN"}
    assert needed <= active
