"""The package and its tests use the Azure SDKs' public API only: no attribute, module or name of an Azure package
that starts with an underscore, in any module that uses an Azure SDK, outside the one documented work-around (the
AMQP decoders the Event Hubs SDK lacks, ``se_exporter/infra/azure/amqp_types.py``, kept with its upstream report,
and its own test). A private attribute can change in any SDK release without notice, and the code reading it then
breaks silently."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import azure

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("se_exporter", "tests", "scripts")
# The one exception, with its upstream report (see its docstring), and the test that says when it is not needed.
WORK_AROUND = {Path("se_exporter/infra/azure/amqp_types.py"), Path("tests/infra/test_amqp_types.py")}
USES_AZURE = re.compile(r"^\s*(from|import) azure\b", re.MULTILINE)
PRIVATE = re.compile(r"(?<!\w)_[A-Za-z]\w*")


def _files(azure_only: bool = True) -> Iterator[tuple[Path, ast.Module]]:
    """Every module of the project (``azure_only``: that uses an Azure SDK, but the work-around)."""
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            text = path.read_text(encoding="utf-8")
            skipped = azure_only and (relative in WORK_AROUND or not USES_AZURE.search(text))
            if "node_modules" in path.parts or skipped:
                continue
            yield relative, ast.parse(text, str(relative))


def _sdk_private_names() -> set[str]:
    """Every underscore name an installed Azure package's sources mention (its attributes, functions, modules)."""
    names: set[str] = set()
    for base in azure.__path__:
        for path in Path(base).rglob("*.py"):
            names.update(PRIVATE.findall(path.read_text(encoding="utf-8", errors="replace")))
    return {name for name in names if not name.startswith("__")}


def _own_private_names(modules: list[tuple[Path, ast.Module]]) -> set[str]:
    """The underscore names this project defines itself (its own attributes, functions, classes, modules), in any
    of its modules or in ``modules``."""
    own: set[str] = {path.stem for top in SOURCES for path in (ROOT / top).rglob("_*.py")}
    for _path, module in [*_files(azure_only=False), *modules]:
        for node in ast.walk(module):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
    return own


def sdk_private_uses(modules: list[tuple[Path, ast.Module]]) -> list[str]:
    """Where the code imports a private Azure module or name, or reads an Azure package's underscore attribute
    (directly or through getattr/setattr/hasattr) that the project does not define itself."""
    sdk = _sdk_private_names() - _own_private_names(modules)
    found = []
    for path, module in modules:
        for node in ast.walk(module):
            where = f"{path}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("azure"):
                if any(part.startswith("_") for part in (node.module or "").split(".")) \
                        or any(alias.name.startswith("_") for alias in node.names):
                    found.append(f"{where}: from {node.module} import {', '.join(a.name for a in node.names)}")
            elif isinstance(node, ast.Import):
                found.extend(f"{where}: import {alias.name}" for alias in node.names if alias.name.startswith(
                    "azure") and any(part.startswith("_") for part in alias.name.split(".")))
            elif isinstance(node, ast.Attribute) and node.attr in sdk:
                found.append(f"{where}: .{node.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in sdk:
                found.append(f"{where}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_no_code_or_test_reads_an_azure_sdks_private_attribute() -> None:
    """No module of the package, its tests or scripts touches an Azure SDK's private name (but the work-around)."""
    assert sdk_private_uses(list(_files())) == []


def test_the_check_finds_a_private_attribute_read_and_a_private_import() -> None:
    """The check is not blind: it finds what the fleet once did (a consumer's link error, a private module)."""
    code = ("from azure.eventhub.aio._eventprocessor.event_processor import EventProcessor\n"
            "def stolen(client):\n"
            "    return client._event_processors['x']._consumers['0']._handler._link._error\n"
            "def flag(consumer):\n"
            "    return getattr(consumer, '_callback_task_run')\n")
    found = {line.split(": ", 1)[1] for line in sdk_private_uses([(Path("probe.py"), ast.parse(code))])}
    assert found >= {"from azure.eventhub.aio._eventprocessor.event_processor import EventProcessor", "._error",
                     "._link", "._consumers", "._event_processors", "getattr(..., '_callback_task_run')"}
