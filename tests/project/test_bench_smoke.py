"""The benchmark keeps working: its smoke mode runs every measurement at tiny sizes (no timed assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parent.parent.parent


def test_benchmark_smoke_mode_measures_every_figure() -> None:
    """scripts/bench.py --smoke exits 0 and reports a number for every figure of the table."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--smoke"], capture_output=True,
                            text=True, timeout=300, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    names = [row["figure"] for row in report["figures"]]
    assert len(names) >= 9
    assert all(isinstance(row["measured"], float) and row["measured"] >= 0 for row in report["figures"])
    assert any("CPU time per poll" in name for name in names)
