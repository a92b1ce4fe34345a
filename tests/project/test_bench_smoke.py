"""The benchmark keeps working: its smoke mode runs every measurement at tiny sizes (no timed assertions)."""

from __future__ import annotations

import pytest

from tests.support.helpers import smoke_report

pytestmark = pytest.mark.integration


@pytest.mark.long(seconds=70)
def test_benchmark_smoke_mode_measures_every_figure() -> None:
    """scripts/bench.py --smoke exits 0 and reports a number for every figure of the table."""
    report = smoke_report("bench.py")
    names = [row["figure"] for row in report["figures"]]
    assert len(names) >= 9
    assert all(isinstance(row["measured"], float) and row["measured"] >= 0 for row in report["figures"])
    assert any("CPU time per poll" in name for name in names)
