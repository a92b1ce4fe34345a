"""The fleet benchmark keeps working: its smoke mode runs both phases at a tiny size (no timed assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parent.parent.parent


def test_fleet_benchmark_smoke_mode_reports_the_ratio_and_memory() -> None:
    """scripts/fleet_bench.py --smoke exits 0 and reports a number for the bare SDK, the fleet, their ratio, memory."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "fleet_bench.py"), "--smoke"], capture_output=True,
                            text=True, timeout=300, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    figures = {row["figure"]: row["measured"] for row in report["figures"]}
    assert report["documents"] == 300
    assert all(isinstance(value, float) and value > 0 for name, value in figures.items() if "memory" not in name)
    assert "fleet applied rate / bare SDK receive rate" in figures and "fleet: burst of 300 applied" in figures
    assert "fleet memory per 10,000 VMs" in figures
    assert "  ... its writer / prometheus-client's families" in figures  # the figure that keeps the fleet's writer
