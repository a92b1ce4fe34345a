"""Never approve: nothing in the sidecar's code can send anything to IMDS but GET."""

from __future__ import annotations

import ast
from pathlib import Path

import se_exporter
from se_exporter.sidecar.imds import COMPUTE_PATH, SCHEDULED_EVENTS_PATH, USER_AGENT, ImdsClient, make_transport
from tests.conftest import Reliability, SimulatorFactory

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


def test_every_request_the_imds_client_sends_is_a_get(simulator: SimulatorFactory) -> None:
    """Through the sidecar's own transport to a real socket, the IMDS client's calls (Scheduled Events on its first
    and later timeouts, compute metadata) reach IMDS as GET and nothing else; the transport refuses any other method
    before a connection is opened (tests/sidecar/test_transport.py::test_only_get_is_sent)."""
    sim, server = simulator("live-migration")
    transport = make_transport()
    client = ImdsClient(transport, server.url, "2020-07-01", timeout=5.0, first_call_timeout=10.0,
                        max_body_bytes=1 << 20)
    try:
        client.scheduled_events()
        client.scheduled_events()
        client.compute()
    finally:
        transport.close()
    sent = [(request.method, request.path) for request in sim.requests if request.user_agent == USER_AGENT]
    assert sent == [("GET", SCHEDULED_EVENTS_PATH), ("GET", SCHEDULED_EVENTS_PATH), ("GET", COMPUTE_PATH)]


def test_the_scan_would_catch_a_post() -> None:
    """The scan itself works: a snippet that approves is flagged."""
    tree = ast.parse('client.post(url, json={})\nclient.stream("POST", url)\nclient.build_request(m, url)\n'
                     'client.build_request("GET", url)')
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in WRITE_METHODS]
    assert "post" in [c.func.attr for c in calls] and literals == ["POST"]  # type: ignore[union-attr]
    assert [_is_get(c) for c in calls if c.func.attr in METHOD_CALLS] == [False, False, True]  # type: ignore[union-attr]
