"""The layout's boundaries hold and are enforced: import-linter's contracts (pyproject.toml) pass on the package and
fail on a sideways import; unit tests collect without the integration dependencies."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's se_exporter before the editable install
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "se_exporter", tmp_path / "se_exporter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_package_keeps_every_import_contract(tmp_path: Path) -> None:
    """Layers (core < infra < programs < cli), no program importing the simulator, no I/O library in the core, the
    platform's readers not importing its service."""
    result = _lint_imports(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("sidecar/metrics.py", "from se_exporter.fleet import settings", "se_exporter.sidecar.metrics -> "
                                                                      "se_exporter.fleet.settings"),
    ("sidecar/assembly.py", "from se_exporter.simulator import scenario", "No program imports the simulator BROKEN"),
    ("core/model.py", "from se_exporter.infra import logs", "se_exporter.core.model -> se_exporter.infra.logs"),
    ("core/lifecycle.py", "import httpx", "The core does no I/O"),
    ("fleet/platform/partitions.py", "from se_exporter.fleet.platform import service",
     "se_exporter.fleet.platform.partitions -> se_exporter.fleet.platform.service"),
])
def test_a_sideways_or_upward_import_breaks_a_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    """One import against the layout, added to a copy of the package, makes lint-imports fail naming it."""
    tree = _copy(tmp_path)
    path = tree / "se_exporter" / module
    path.write_text(path.read_text() + f"\n{line}  # deliberately against the layout\n")
    result = _lint_imports(tree)
    assert result.returncode == 1, result.stdout
    assert broken in result.stdout


@pytest.mark.long(seconds=70)
def test_unit_tests_collect_without_the_integration_dependencies(tmp_path: Path) -> None:
    """With python-qpid-proton unimportable, `pytest -m "not integration"` still collects every unit test."""
    blocker = tmp_path / "blocked" / "proton"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ModuleNotFoundError("as if not installed", name="proton")\n')
    env = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    probe = subprocess.run([sys.executable, "-c", "import proton"], env=env, capture_output=True, timeout=60,
                           check=False)
    assert probe.returncode != 0  # the blocker works
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "not integration", "--collect-only", "-q",
                             "-p", "no:cacheprovider", "tests"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=170, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collected = int(result.stdout.strip().splitlines()[-1].split("/")[0].split()[0])
    assert collected > 900
