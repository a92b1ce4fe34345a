"""A faithful IMDS double: Scheduled Events, compute metadata, approvals, faults, a request log.

What it reproduces from the Azure documents:

* 400 without ``Metadata: true``, with an unknown or missing ``api-version``, or with
  ``X-Forwarded-For`` (IMDS refuses proxied requests);
* the document shaped per api-version: 2017-03-01 has ISO 8601 NotBefore, a string
  DocumentIncarnation and underscored resource names; later versions add Preempt, Terminate,
  Description, EventSource and DurationInSeconds in turn; events of types a version does not
  know are not listed to it;
* ``DocumentIncarnation`` bumped on every change; NotBefore ``""`` once Started;
* ``POST`` with ``StartRequests`` approves (starts) events; a malformed body is a 400;
* the managed identity token endpoint (``simulator/identity.py``): JWTs for the VM's system-assigned
  identity or a user-assigned one chosen by ``client_id``, 400 for an identity the VM does not have.

Control endpoints under ``/_simulator/`` (no Metadata header needed) let people and tests drive
it: ``GET requests``, ``GET state``, ``POST faults`` (a fault object or a list), ``POST advance``
(``{"seconds": N}`` of scenario time), ``POST clear-faults``, ``POST identity`` (``{"lifetime": S}`` of
the tokens issued from now on, ``{"fail": N, "status": CODE}`` for the next N token requests).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from se_exporter.errors import ConfigError
from se_exporter.simulator import faults as faults_module
from se_exporter.simulator.faults import Fault
from se_exporter.simulator.identity import IDENTITY_VERSIONS, TOKEN_PATH, IdentityService, TokenError
from se_exporter.simulator.scenario import EventState, Scenario

log = logging.getLogger("se_exporter.simulator")

# Scheduled Events api-versions with what each one added (Azure docs, "Version and region availability").
SCHEDULED_EVENTS_VERSIONS = ("2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01",
                             "2019-08-01", "2020-07-01")
INSTANCE_VERSIONS = ("2017-03-01", "2017-04-02", "2017-08-01", "2017-12-01", "2018-02-01", "2018-04-02",
                     "2018-10-01", "2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01", "2019-06-04",
                     "2019-08-01", "2019-08-15", "2019-11-01", "2020-06-01", "2020-07-15", "2020-09-01",
                     "2020-10-01", "2020-12-01", "2021-01-01", "2021-02-01", "2021-03-01", "2021-05-01",
                     "2021-10-01", "2021-11-01", "2021-11-15", "2021-12-13", "2023-07-01")
_TYPE_SINCE = {"Preempt": "2017-11-01", "Terminate": "2019-01-01"}
_FIELD_SINCE = {"Description": "2019-04-01", "EventSource": "2019-08-01", "DurationInSeconds": "2020-07-01"}
_PREVIEW = "2017-03-01"
SE_PATH = "/metadata/scheduledevents"
COMPUTE_PATH = "/metadata/instance/compute"
INSTANCE_PATH = "/metadata/instance"
MAX_REQUEST_BYTES = 1024 * 1024
CAPTIVE_PORTAL = b"<html><head><title>Sign in</title></head><body>Please sign in to continue.</body></html>"


@dataclass(frozen=True)
class RecordedRequest:
    time: float
    method: str
    path: str
    query: str
    user_agent: str
    metadata_header: str | None
    body: bytes


class Simulator:
    """The simulated IMDS state; thread-safe, with an injectable clock for tests."""

    def __init__(self, scenario: Scenario, speed: float = 1.0, clock: Callable[[], float] = time.time,
                 vm_name: str | None = None, history: int = 100_000) -> None:
        self.scenario = scenario
        self.speed = speed
        self._clock = clock
        self._start = clock()
        self._offset = 0.0
        self._lock = threading.Lock()
        self._approvals: dict[str, float] = {}
        self._incarnation = 1
        self._canonical: list[dict[str, Any]] = []
        self._not_before_wall: dict[tuple[str, float], float] = {}
        self._faults: deque[Fault] = deque()
        self._first_request_seen = False
        self.vm = dict(scenario.vm, **({"name": vm_name} if vm_name else {}))
        self.requests: deque[RecordedRequest] = deque(maxlen=history)
        self.served: deque[bytes] = deque(maxlen=history)  # exact 200 bodies of Scheduled Events, in order
        self.request_counts: Counter[tuple[str, str]] = Counter()
        self.identity = IdentityService()

    # ------------------------------------------------------------------ time and state

    def scenario_time(self) -> float:
        return (self._clock() - self._start) * self.speed + self._offset

    def advance(self, seconds: float) -> None:
        """Jump scenario time forward (tests, rehearsals); NotBefore values already shown stay put."""
        with self._lock:
            self._offset += seconds

    def approve(self, event_ids: Iterable[str]) -> list[str]:
        """Approve listed events; returns the unknown ids (nothing is approved if any is unknown)."""
        with self._lock:
            t = self.scenario_time()
            listed = {state.event_id for state in self.scenario.state_at(t, self._approvals)}
            ids = list(event_ids)
            unknown = [event_id for event_id in ids if event_id not in listed]
            if not unknown:
                for event_id in ids:
                    self._approvals.setdefault(event_id, t)
            return unknown

    def document(self, api_version: str = "2020-07-01") -> dict[str, Any]:
        """The Scheduled Events document as this api-version shows it now."""
        with self._lock:
            self._refresh()
            events = [_shape(event, api_version) for event in self._canonical]
            incarnation: int | str = self._incarnation
        if api_version == _PREVIEW:
            incarnation = str(incarnation)
        return {"DocumentIncarnation": incarnation, "Events": [e for e in events if e is not None]}

    def _refresh(self) -> None:
        now_wall = self._clock()
        t = self.scenario_time()
        canonical = [self._canonical_event(state, now_wall, t) for state in self.scenario.state_at(t, self._approvals)]
        if canonical != self._canonical:
            self._canonical = canonical
            self._incarnation += 1

    def _canonical_event(self, state: EventState, now_wall: float, t: float) -> dict[str, Any]:
        spec = state.spec
        not_before = None
        if state.not_before is not None:
            # Fixed at first sight so a NotBefore never drifts; later time jumps make events start "early".
            key = (state.event_id, state.not_before)
            wall = self._not_before_wall.setdefault(key, now_wall + (state.not_before - t) / self.speed)
            not_before = datetime.fromtimestamp(int(wall), timezone.utc)
        return {
            "EventId": state.event_id,
            "EventStatus": state.status,
            "EventType": spec.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": list(spec.resources),
            "NotBefore": not_before,
            "Description": spec.description,
            "EventSource": spec.event_source,
            "DurationInSeconds": spec.duration_seconds,
        }

    # ------------------------------------------------------------------ faults and records

    def inject(self, *faults: Fault) -> None:
        with self._lock:
            self._faults.extend(faults)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def set_faults(self, *faults: Fault) -> None:
        """Replace the pending faults at once (no request in between sees none)."""
        with self._lock:
            self._faults.clear()
            self._faults.extend(faults)

    def take_fault(self) -> Fault | None:
        with self._lock:
            first = not self._first_request_seen
            self._first_request_seen = True
            while self._faults:
                fault = self._faults[0]
                if fault.kind == "first_call_delay" and not first:
                    self._faults.popleft()
                    continue
                if fault.count == 1 or fault.kind == "first_call_delay":
                    self._faults.popleft()
                elif fault.count > 1:
                    self._faults[0] = Fault(**{**asdict(fault), "count": fault.count - 1})
                return fault
            return None

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)
            self.request_counts[(request.method, request.user_agent)] += 1

    def record_served(self, body: bytes) -> None:
        with self._lock:
            self.served.append(body)

    def distinct_served(self) -> list[bytes]:
        """Served bodies with consecutive repeats removed: what a forwarder must have sent, in order."""
        with self._lock:
            bodies = list(self.served)
        return [body for index, body in enumerate(bodies) if index == 0 or body != bodies[index - 1]]

    def posts_from(self, user_agent_prefix: str) -> int:
        with self._lock:
            return sum(count for (method, agent), count in self.request_counts.items()
                       if method != "GET" and agent.startswith(user_agent_prefix))

    def configure_identity(self, lifetime: float | None = None, fail: int = 0, status: int = 500) -> None:
        """Tokens issued from now on last ``lifetime`` seconds; the next ``fail`` token requests get ``status``."""
        with self._lock:
            if lifetime is not None:
                self.identity.lifetime = int(lifetime)
            self.identity.failures, self.identity.failure_status = fail, status

    def token(self, query: dict[str, str]) -> tuple[int, dict[str, str]]:
        """The token endpoint's status and answer: a token, or IMDS' error for a refused or failing request."""
        with self._lock:
            identity = self.identity
            if identity.failures > 0:
                identity.failures -= 1
                return identity.failure_status, {"error": "unknown_error",
                                                 "error_description": "simulated token endpoint failure"}
            vm = self.vm
            resource_id = (f"/subscriptions/{vm.get('subscriptionId', '')}/resourceGroups/"
                           f"{vm.get('resourceGroupName', '')}/providers/Microsoft.Compute/virtualMachines/"
                           f"{vm.get('name', '')}")
            try:
                return 200, identity.token(query, self._clock(), resource_id)
            except TokenError as error:
                return 400, {"error": "invalid_request", "error_description": str(error)}

    def state(self) -> dict[str, Any]:
        return {"scenario": self.scenario.name, "scenario_time": self.scenario_time(), "speed": self.speed,
                "vm": self.vm, "document": self.document()}


def _shape(event: dict[str, Any], api_version: str) -> dict[str, Any] | None:
    since = _TYPE_SINCE.get(event["EventType"])
    if since and api_version < since:
        return None
    shaped = {key: value for key, value in event.items()
              if key not in _FIELD_SINCE or api_version >= _FIELD_SINCE[key]}
    not_before: datetime | None = event["NotBefore"]
    if api_version == _PREVIEW:
        shaped["NotBefore"] = "" if not_before is None else not_before.strftime("%Y-%m-%dT%H:%M:%SZ")
        shaped["Resources"] = ["_" + name for name in event["Resources"]]
    else:
        shaped["NotBefore"] = "" if not_before is None else format_datetime(not_before, usegmt=True)
    return shaped


# ---------------------------------------------------------------------- HTTP


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as IMDS does
    # Headers and body go out in separate writes; with Nagle on, a keep-alive client's delayed ACK stalls each
    # answer by ~40 ms. TCP_NODELAY keeps the simulator as fast as the service it imitates.
    disable_nagle_algorithm = True
    server: SimulatorServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        sim = self.server.simulator
        declared = self.headers.get("Content-Length") or "0"
        if not declared.isdigit() or int(declared) > MAX_REQUEST_BYTES:
            self.close_connection = True
            return self._json(400, {"error": f"Bad request. Content-Length {declared[:20]!r} is not a size we take"})
        length = int(declared)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        sim.record(RecordedRequest(time.time(), method, url.path, url.query, self.headers.get("User-Agent", ""),
                                   self.headers.get("Metadata"), body))
        if url.path.startswith("/_simulator/"):
            return self._control(method, url.path, body)
        query = parse_qs(url.query)
        api_version = (query.get("api-version") or [""])[0]
        if self.headers.get("Metadata", "").lower() != "true":
            return self._json(400, {"error": "Bad request. Required metadata header not specified"})
        if "X-Forwarded-For" in self.headers:
            return self._json(400, {"error": "Bad request. Proxied requests are not allowed"})
        path = url.path.rstrip("/")
        if path == SE_PATH:
            return self._scheduled_events(method, api_version, body)
        if path == TOKEN_PATH and method == "GET":
            if api_version not in IDENTITY_VERSIONS:
                return self._bad_version(IDENTITY_VERSIONS)
            status, answer = sim.token({key: values[0] for key, values in query.items()})
            return self._json(status, answer)
        if path in (COMPUTE_PATH, INSTANCE_PATH) and method == "GET":
            if api_version not in INSTANCE_VERSIONS:
                return self._bad_version(INSTANCE_VERSIONS)
            compute = sim.vm
            return self._json(200, compute if path == COMPUTE_PATH else {"compute": compute, "network": {}})
        return self._json(404, {"error": "Not found"})

    def _scheduled_events(self, method: str, api_version: str, body: bytes) -> None:
        sim = self.server.simulator
        if api_version not in SCHEDULED_EVENTS_VERSIONS:
            return self._bad_version(SCHEDULED_EVENTS_VERSIONS)
        if method == "POST":
            return self._approve(body)
        if method != "GET":
            return self._json(405, {"error": "Method not allowed"})
        fault = sim.take_fault()
        if fault is not None and self._apply(fault, api_version):
            return None
        body = json.dumps(sim.document(api_version)).encode()
        sim.record_served(body)
        return self._raw(200, body, "application/json; charset=utf-8")

    def _approve(self, body: bytes) -> None:
        try:
            requests = json.loads(body)["StartRequests"]
            ids = [item["EventId"] for item in requests]
            if not ids or not all(isinstance(i, str) for i in ids):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return self._json(400, {"error": "Bad request. StartRequests must list objects with an EventId"})
        unknown = self.server.simulator.approve(ids)
        if unknown:
            return self._json(400, {"error": f"Bad request. Unknown EventId {', '.join(unknown)}"})
        return self._json(200, {})

    def _apply(self, fault: Fault, api_version: str) -> bool:
        """Serve the fault; False when the fault only delays a normal answer."""
        kind = fault.kind
        if kind in ("truncate", "drip", "chunked", "gzip"):  # the document itself, delivered wrongly
            self._deliver_badly(fault, json.dumps(self.server.simulator.document(api_version)).encode())
            self.close_connection = True
            return True
        if kind in ("delay", "first_call_delay"):
            time.sleep(fault.seconds)
            return False
        if kind == "hang":
            time.sleep(fault.seconds)
            self.close_connection = True
            return True
        if kind == "reset":
            self.close_connection = True
            return True
        if kind in ("throttle", "status"):
            headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            self._json(fault.status, {"error": f"simulated HTTP {fault.status}"}, headers)
        elif kind == "redirect":
            self._raw(302, b"", "text/plain", {"Location": fault.location})
        elif kind == "malformed":
            self._raw(200, b'{"DocumentIncarnation": 7, "Events": [{"EventId": "', "application/json")
        elif kind == "non_json":
            self._raw(200, CAPTIVE_PORTAL, "text/html")
        elif kind == "invalid":
            self._raw(200, b'{"DocumentIncarnation": 7, "Events": "none"}', "application/json")
        elif kind == "empty":
            self._raw(200, b"", "application/json")
        elif kind == "huge":
            self._huge(fault.size_or(0))
        elif kind == "body":
            self._raw(200, fault.text.encode(), "application/json")
        return True

    def _huge(self, size: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        chunk = b" " * 65536
        try:
            for offset in range(0, size, len(chunk)):
                self.wfile.write(chunk[: min(len(chunk), size - offset)])
        except OSError:
            pass  # the client is allowed to hang up: that is the point
        self.close_connection = True

    def _deliver_badly(self, fault: Fault, document: bytes) -> None:
        """The byte-level faults: the answer is the real document, but cut, dripped, mis-chunked or compressed."""
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
        if fault.kind == "truncate":
            sent = min(fault.size_or(len(document) // 2), max(0, len(document) - 1))
            self._send_raw(head + b"Content-Length: %d\r\n\r\n" % len(document) + document[:sent])
        elif fault.kind == "drip":
            answer = head + b"Content-Length: %d\r\n\r\n" % len(document) + document
            for index in range(len(answer)):
                if not self._send_raw(answer[index:index + 1]):
                    return  # the client gave up: that is the point
                time.sleep(fault.seconds)
        elif fault.kind == "chunked":
            third = max(1, len(document) // 3)
            parts = [document[i:i + third] for i in range(0, len(document), third)]
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)
            if fault.error == "bad_size":
                chunks = b"%x\r\n%s\r\nzz\r\n" % (len(parts[0]), parts[0])
            ending = b"" if fault.error in ("missing_last", "bad_size") else b"0\r\n\r\n"
            self._send_raw(head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + ending)
        else:  # gzip
            body = _gzipped(document, fault.size_or(0))
            self._send_raw(head + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    def _send_raw(self, data: bytes) -> bool:
        """Write bytes as they are, bypassing http.server's framing; False once the client has gone."""
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            return False
        return True

    def _control(self, method: str, path: str, body: bytes) -> None:
        sim = self.server.simulator
        action = path[len("/_simulator/"):]
        try:
            if method == "GET" and action == "requests":
                return self._json(200, [
                    {"time": r.time, "method": r.method, "path": r.path, "query": r.query,
                     "user_agent": r.user_agent, "metadata": r.metadata_header} for r in list(sim.requests)])
            if method == "GET" and action == "state":
                return self._json(200, sim.state())
            if method == "POST" and action == "faults":
                data = json.loads(body or b"[]")
                sim.inject(*(faults_module.from_json(item) for item in (data if isinstance(data, list) else [data])))
                return self._json(200, {})
            if method == "POST" and action == "clear-faults":
                sim.clear_faults()
                return self._json(200, {})
            if method == "POST" and action == "identity":
                settings = json.loads(body or b"{}")
                sim.configure_identity(lifetime=settings.get("lifetime"), fail=int(settings.get("fail", 0)),
                                       status=int(settings.get("status", 500)))
                return self._json(200, {})
            if method == "POST" and action == "advance":
                seconds = json.loads(body)["seconds"]
                if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                        or seconds < 0:
                    raise ValueError(f"'seconds' must be a number >= 0 (time only moves forward), not {seconds!r}")
                sim.advance(float(seconds))
                return self._json(200, {"scenario_time": sim.scenario_time()})
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            return self._json(400, {"error": str(exc)})
        return self._json(404, {"error": "Not found"})

    def _bad_version(self, versions: tuple[str, ...]) -> None:
        self._json(400, {"error": "Bad request. api-version is invalid or was not specified in the request. "
                                  "For more information refer to aka.ms/azureimds",
                         "newest-versions": list(reversed(versions[-3:]))})

    def _json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        self._raw(status, json.dumps(payload).encode(), "application/json; charset=utf-8", headers)

    def _raw(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


@functools.lru_cache(maxsize=2)
def _blanks_compressed(size: int) -> tuple[bytes, Any]:
    """``size`` blanks through a gzip compressor, unflushed: the compressed bytes so far and the compressor,
    which is copied per answer to add the document. Built once per size (300 MB take a second or two)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * min(size, 1024 * 1024) if size else b""
    out, left = [], size
    while left > 0:
        out.append(compressor.compress(block[:left]))
        left -= len(block)
    return b"".join(out), compressor


def _gzipped(document: bytes, blanks: int) -> bytes:
    """A gzip body that inflates to ``blanks`` blanks and then the document (leading blanks are valid JSON)."""
    prefix, compressor = _blanks_compressed(blanks)
    tail = compressor.copy()
    body: bytes = prefix + tail.compress(document) + tail.flush()
    return body


class SimulatorServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], simulator: Simulator) -> None:
        self.simulator = simulator
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up mid-conversation is normal (timeouts, shutdowns); anything else is logged."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionResetError, BrokenPipeError, TimeoutError)):
            return
        log.exception("simulator request from %s failed", client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = str(host)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def start(simulator: Simulator, host: str = "127.0.0.1", port: int = 0) -> SimulatorServer:
    """Serve ``simulator`` in a daemon thread; port 0 picks a free port (see ``.url``)."""
    server = SimulatorServer((host, port), simulator)
    threading.Thread(target=server.serve_forever, args=(0.05,), name="imds-simulator", daemon=True).start()
    return server
