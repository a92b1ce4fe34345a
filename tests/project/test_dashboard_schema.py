"""The generated dashboards type-check against Grafana's published schema types (@grafana/schema, tsc)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
TOOLS = Path(__file__).parent.parent / "grafana_schema"
HEADER = """import type { Dashboard, VariableModel } from "@grafana/schema";
// The SDK writes the interval-variable fields auto, auto_count and auto_min on every variable.
type SdkVariable = VariableModel & { auto?: boolean; auto_count?: number; auto_min?: string };
type SdkDashboard = Omit<Dashboard, "templating"> & { templating?: { list?: SdkVariable[] } };
"""


def test_dashboards_match_grafana_schema_types(tmp_path: Path) -> None:
    """`const d: Dashboard = <generated JSON>` compiles with tsc --noEmit (only the SDK's auto* fields allowed)."""
    tsc = TOOLS / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        pytest.fail("tests/grafana_schema/node_modules is missing: `make test` runs npm ci there")
    files = sorted((ROOT / "dashboards").glob("*.json"))
    assert files
    body = "".join(f"export const dashboard{i}: SdkDashboard = {path.read_text()};\n" for i, path in enumerate(files))
    (tmp_path / "dashboards.gen.ts").write_text(HEADER + body)
    shutil.copy(TOOLS / "tsconfig.json", tmp_path / "tsconfig.json")
    (tmp_path / "node_modules").symlink_to(TOOLS / "node_modules")
    result = subprocess.run([str(tsc), "-p", str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
