"""The fleet benchmark keeps working: its smoke mode runs both phases at a tiny size (no timed assertions)."""

from __future__ import annotations

import pytest

from tests.helpers import smoke_report

pytestmark = pytest.mark.integration


def test_fleet_benchmark_smoke_mode_reports_the_ratio_and_memory() -> None:
    """scripts/fleet_bench.py --smoke exits 0 and reports a number for the bare SDK, the fleet, their ratio, memory."""
    report = smoke_report("fleet_bench.py")
    figures = {row["figure"]: row["measured"] for row in report["figures"]}
    assert report["documents"] == 300
    assert all(isinstance(value, float) and value > 0 for name, value in figures.items() if "memory" not in name)
    assert "fleet applied rate / bare SDK receive rate" in figures and "fleet: burst of 300 applied" in figures
    assert "fleet memory per 10,000 VMs" in figures
    assert "  ... its writer / prometheus-client's families" in figures  # the figure that keeps the fleet's writer
