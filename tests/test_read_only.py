"""Never approve: nothing in the sidecar's code can send anything to IMDS but GET."""

from __future__ import annotations

import ast
from pathlib import Path

import se_exporter
from tests.conftest import Reliability

PACKAGE = Path(se_exporter.__file__).parent
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
WRITE_CALLS = {"post", "put", "patch", "delete", "urlopen"}
METHOD_CALLS = {"request", "build_request", "stream", "Request", "putrequest"}  # only with the literal "GET"


def _sidecar_sources() -> list[Path]:
    # The simulator *serves* POST (approvals, for people rehearsing responders); it never sends one.
    return [path for path in PACKAGE.rglob("*.py") if "simulator" not in path.relative_to(PACKAGE).parts]


def test_the_sidecar_has_no_write_requests(reliability: Reliability) -> None:
    """No 'POST'/'PUT'/'PATCH'/'DELETE' literal and no .post()/.request()-style call exists outside the simulator."""
    offences: list[str] = []
    for path in _sidecar_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.upper() in WRITE_METHODS:
                offences.append(f"{path.name}:{node.lineno} literal {node.value!r}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITE_CALLS:
                offences.append(f"{path.name}:{node.lineno} call .{node.func.attr}()")
            if isinstance(node, ast.Call) and _called(node) in METHOD_CALLS and not _is_get(node):
                offences.append(f"{path.name}:{node.lineno} call {_called(node)}() without the literal GET")
    assert offences == []
    reliability("Security", "search of the sidecar's code for POST, PUT, PATCH, DELETE, and requests built "
                            "without the literal GET", "none outside the simulator")


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_get(call: ast.Call) -> bool:
    method = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "method"), None)
    return isinstance(method, ast.Constant) and method.value == "GET"


def test_the_imds_client_only_builds_get() -> None:
    """The one place an httpx request is built names GET, and the transport's own way in is a method that can only
    GET; the transport refuses any other method and writes only GET."""
    source = (PACKAGE / "imds.py").read_text()
    assert source.count("httpx.Request(") == 1
    assert 'httpx.Request(\n                "GET"' in source
    assert source.count(".handle_request(") == 1 and "transport.handle_request(request)" in source
    assert source.count("self._transport.get(") == 1
    transport = (PACKAGE / "transport.py").read_text()
    assert 'if request.method != "GET":' in transport
    assert transport.count(".putrequest(") == 1 and '.putrequest("GET", ' in transport


def test_the_scan_would_catch_a_post() -> None:
    """The scan itself works: a snippet that approves is flagged."""
    tree = ast.parse('client.post(url, json={})\nclient.stream("POST", url)\nclient.build_request(m, url)\n'
                     'client.build_request("GET", url)')
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in WRITE_METHODS]
    assert "post" in [c.func.attr for c in calls] and literals == ["POST"]  # type: ignore[union-attr]
    assert [_is_get(c) for c in calls if c.func.attr in METHOD_CALLS] == [False, False, True]  # type: ignore[union-attr]
