"""A faithful IMDS double: Scheduled Events, compute metadata, approvals, faults, a request log.

It answers as the Azure documents say IMDS does: 400 without ``Metadata: true``, with a bad ``api-version`` or a
proxy's ``X-Forwarded-For``; the document shaped per api-version; 404 for a version newer than the VM serves;
``DocumentIncarnation`` bumped on every change; ``StartRequests`` approving events; the managed identity token
endpoint (``simulator/identity.py``). Control endpoints under ``/_simulator/`` let people and tests drive it
(``_CONTROLS``; docs/simulator.md). A scenario of several VMs is served on one port: ``/vms/<name>/...`` is that
VM's IMDS and control API, anything else the first VM's; the VMs share one ``Timeline``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import math
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import format_datetime
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qs

from se_exporter.core import apiversion
from se_exporter.core.errors import ConfigError
from se_exporter.core.model import EVENT_FIELDS
from se_exporter.infra.http_server import Bounds, HttpRequest, RawWriter, Response, Server
from se_exporter.infra.options import Listen
from se_exporter.simulator import faults as faults_module
from se_exporter.simulator.faults import Fault
from se_exporter.simulator.identity import IDENTITY_VERSIONS, TOKEN_PATH, IdentityService
from se_exporter.simulator.scenario import TIMED_FIELDS, EventState, Scenario
from se_exporter.simulator.timeline import Timeline

log = logging.getLogger("se_exporter.simulator")

# Scheduled Events api-versions with what each one added (Azure docs, "Version and region availability").
SCHEDULED_EVENTS_VERSIONS = apiversion.VERSIONS
NEWEST_SERVED_KEY = "scheduledEventsNewest"  # a scenario VM's newest served api-version (not compute metadata)
INSTANCE_VERSIONS = ("2017-03-01", "2017-04-02", "2017-08-01", "2017-12-01", "2018-02-01", "2018-04-02",
                     "2018-10-01", "2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01", "2019-06-04",
                     "2019-08-01", "2019-08-15", "2019-11-01", "2020-06-01", "2020-07-15", "2020-09-01",
                     "2020-10-01", "2020-12-01", "2021-01-01", "2021-02-01", "2021-03-01", "2021-05-01",
                     "2021-10-01", "2021-11-01", "2021-11-15", "2021-12-13", "2023-07-01")
_PREVIEW = "2017-03-01"
SE_PATH = "/metadata/scheduledevents"
VM_PREFIX = "/vms/"  # /vms/<name>/metadata/...: one VM of a scenario of several
COMPUTE_PATH = "/metadata/instance/compute"
INSTANCE_PATH = "/metadata/instance"
MAX_HIDDEN = 1_000  # EventIds hidden from one VM (POST /_simulator/blind)
HISTORY = 1_000  # requests remembered (GET /_simulator/requests), and changes of the served document
RECORDED_BODY_BYTES = 1024  # of each request's body (the server refuses bodies over 64 KiB unread: 413)
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
                 vm_name: str | None = None, history: int = HISTORY, timeline: Timeline | None = None,
                 vm: Mapping[str, str] | None = None) -> None:
        """One VM's IMDS: ``vm`` (default: the scenario's first VM, renamed ``vm_name`` if given) on ``timeline``
        (default: a timeline of its own), which the scenario's other VMs and its platform copy share."""
        self.scenario = scenario
        self.timeline = timeline or Timeline(scenario, speed, clock)
        self._lock = threading.Lock()
        self._incarnation = 1
        self._canonical: list[dict[str, Any]] = []
        self._not_before_wall: dict[tuple[str, float], float] = {}
        self._faults: deque[Fault] = deque()
        self._hidden: set[str] = set()  # EventIds (upper case) this VM's IMDS no longer lists: a blind sidecar
        self._first_request_seen = False
        self.vm = dict(vm or scenario.vm, **({"name": vm_name} if vm_name else {}))
        self.newest_served = self.vm.pop(NEWEST_SERVED_KEY, apiversion.NEWEST)
        self._requests: deque[RecordedRequest] = deque(maxlen=history)
        # Exact 200 bodies of Scheduled Events, in order, consecutive repeats kept once: the last ``history`` changes.
        self._served: deque[bytes] = deque(maxlen=history)
        self.request_counts: Counter[tuple[str, str]] = Counter()
        self.identity = IdentityService()

    # ------------------------------------------------------------------ time and state

    def scenario_time(self) -> float:
        return self.timeline.scenario_time()

    def advance(self, seconds: float) -> None:
        """Jump scenario time forward, for every VM of the scenario (``Timeline.advance``); NotBefore values
        already shown stay put."""
        self.timeline.advance(seconds)

    def approve(self, event_ids: Iterable[str]) -> list[str]:
        """Approve listed events; returns the unknown ids (nothing is approved if any is unknown)."""
        return self.timeline.approve(event_ids, lambda t, approvals: {
            state.event_id for state in self._listed(t, approvals)})

    def hide(self, event_id: str) -> None:
        """From now on this VM's IMDS does not list ``event_id`` (any cycle's id, any case): the fault of a
        sidecar blind to one event, which the platform stream still announces."""
        with self._lock:
            if len(self._hidden) >= MAX_HIDDEN:
                raise ValueError(f"at most {MAX_HIDDEN} EventIds can be hidden from one VM")
            self._hidden.add(event_id.upper())

    def _listed(self, t: float, approvals: Mapping[str, float]) -> tuple[EventState, ...]:
        """What this VM's IMDS lists at scenario second ``t``: the scenario's events of its place, less those it
        is blind to."""
        name = self.vm.get("name", "")
        return tuple(state for state in self.scenario.state_at(t, approvals)
                     if state.event_id.upper() not in self._hidden and self.scenario.listed_to(state.spec, name))

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
        now_wall, t = self.timeline.now()
        walls: dict[tuple[str, float], float] = {}
        canonical = [self._canonical_event(state, now_wall, t, walls)
                     for state in self._listed(t, self.timeline.approvals())]
        # Only the NotBefores listed now are kept (scenario time only moves forward): bounded, also when repeating.
        self._not_before_wall = walls
        if canonical != self._canonical:
            self._canonical = canonical
            self._incarnation += 1

    def _canonical_event(self, state: EventState, now_wall: float, t: float,
                         walls: dict[tuple[str, float], float]) -> dict[str, Any]:
        spec = state.spec
        not_before = None
        if state.not_before is not None:
            # Fixed at first sight so a NotBefore never drifts; later time jumps make events start "early".
            key = (state.event_id, state.not_before)
            wall = walls[key] = self._not_before_wall.get(key, self.timeline.wall_at(state.not_before, (now_wall, t)))
            not_before = datetime.fromtimestamp(int(wall), timezone.utc)
        timed = {"EventId": state.event_id, "EventStatus": state.status, "EventType": spec.event_type,
                 "Resources": list(spec.resources), "NotBefore": not_before}
        listed = spec.listed
        return {row.json: timed[row.json] if row.json in TIMED_FIELDS else listed[row.json] for row in EVENT_FIELDS}

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
                if fault.count == 1 or fault.kind == "first_call_delay":  # first_call_delay: once, whatever its count
                    self._faults.popleft()
                elif fault.count > 1:
                    self._faults[0] = dataclasses.replace(fault, count=fault.count - 1)
                if first or fault.kind != "first_call_delay":  # one past the first request is dropped unserved
                    return fault
            return None

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self.request_counts[(request.method, request.user_agent)] += 1

    def record_served(self, body: bytes) -> None:
        with self._lock:
            if not self._served or self._served[-1] != body:
                self._served.append(body)

    @property
    def requests(self) -> list[RecordedRequest]:
        """The last requests, oldest first: a copy, so a reader never sees the server thread append mid-iteration."""
        with self._lock:
            return list(self._requests)

    def distinct_served(self) -> list[bytes]:
        """The served bodies, oldest first, each change once (``record_served`` drops a repeat of the last one):
        what a forwarder must have sent, in order. A copy, as ``requests``."""
        with self._lock:
            return list(self._served)

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
        """The token endpoint's status and answer (``IdentityService.token``), for the VM's resourceId."""
        with self._lock:
            return self.identity.token(query, self.timeline.clock(), self.vm.get("resourceId", ""))

    def state(self) -> dict[str, Any]:
        return {"scenario": self.scenario.name, "scenario_time": self.scenario_time(), "speed": self.timeline.speed,
                "vm": self.vm, "document": self.document()}


def _shape(event: dict[str, Any], api_version: str) -> dict[str, Any] | None:
    if not apiversion.lists_type(api_version, event["EventType"]):
        return None
    shaped = {key: value for key, value in event.items() if apiversion.lists_field(api_version, key)}
    not_before: datetime | None = event["NotBefore"]
    if api_version == _PREVIEW:
        shaped["NotBefore"] = "" if not_before is None else not_before.strftime("%Y-%m-%dT%H:%M:%SZ")
        shaped["Resources"] = ["_" + name for name in event["Resources"]]
    else:
        shaped["NotBefore"] = "" if not_before is None else format_datetime(not_before, usegmt=True)
    return shaped


# ---------------------------------------------------------------------- HTTP


class _Imds:
    """The HTTP side of the simulator, served by ``http_server``: IMDS' paths, the control API, the faults."""

    def __init__(self, simulator: Simulator) -> None:
        self.simulator = simulator

    async def __call__(self, request: HttpRequest) -> Response | None:
        sim = self.simulator
        sim.record(RecordedRequest(time.time(), request.method, request.path, request.query,
                                   request.header("user-agent"),
                                   next((value for name, value in request.headers if name == "metadata"), None),
                                   request.body[:RECORDED_BODY_BYTES]))
        if request.path.startswith("/_simulator/"):
            return self._control(request.method, request.path, request.body)
        query = parse_qs(request.query)
        api_version = (query.get("api-version") or [""])[0]
        if request.header("metadata").lower() != "true":
            return _json(400, {"error": "Bad request. Required metadata header not specified"})
        if any(name == "x-forwarded-for" for name, _ in request.headers):
            return _json(400, {"error": "Bad request. Proxied requests are not allowed"})
        path = request.path.rstrip("/")
        if path == SE_PATH:
            return await self._scheduled_events(request, api_version)
        if request.method == "GET":
            return self._metadata(path, api_version, query)
        return _json(404, {"error": "Not found"})

    def _metadata(self, path: str, api_version: str, query: dict[str, list[str]]) -> Response:
        """A GET of IMDS' other paths the sidecar reads: a managed identity's token, the compute metadata."""
        sim = self.simulator
        if path == TOKEN_PATH:
            if api_version not in IDENTITY_VERSIONS:
                return _bad_version(IDENTITY_VERSIONS)
            status, answer = sim.token({key: values[0] for key, values in query.items()})
            return _json(status, answer)
        if path in (COMPUTE_PATH, INSTANCE_PATH):
            if api_version not in INSTANCE_VERSIONS:
                return _bad_version(INSTANCE_VERSIONS)
            compute = sim.vm
            return _json(200, compute if path == COMPUTE_PATH else {"compute": compute, "network": {}})
        return _json(404, {"error": "Not found"})

    async def _scheduled_events(self, request: HttpRequest, api_version: str) -> Response | None:
        sim = self.simulator
        if api_version not in SCHEDULED_EVENTS_VERSIONS:
            return _bad_version(SCHEDULED_EVENTS_VERSIONS)
        if api_version > sim.newest_served:  # as IMDS answers a version it knows of but does not serve here
            return _json(404, {"error": "Not found"})
        if request.method == "POST":
            return self._approve(request.body)
        if request.method != "GET":
            return _json(405, {"error": "Method not allowed"})
        fault = sim.take_fault()
        if fault is not None and fault.kind in ("delay", "first_call_delay"):  # a slow normal answer
            await asyncio.sleep(fault.seconds)
        elif fault is not None:
            return await self._apply(fault, api_version, request)
        body = json.dumps(sim.document(api_version)).encode()
        sim.record_served(body)
        return Response(200, body, "application/json; charset=utf-8")

    def _approve(self, body: bytes) -> Response:
        try:
            requests = json.loads(body)["StartRequests"]
            ids = [item["EventId"] for item in requests]
            if not ids or not all(isinstance(i, str) for i in ids):
                raise ValueError
        except (ValueError, KeyError, TypeError, RecursionError):
            return _json(400, {"error": "Bad request. StartRequests must list objects with an EventId"})
        unknown = self.simulator.approve(ids)
        if unknown:
            return _json(400, {"error": f"Bad request. Unknown EventId {', '.join(unknown)}"})
        return _json(200, {})

    async def _apply(self, fault: Fault, api_version: str, request: HttpRequest) -> Response | None:
        """Serve the fault instead of the document: its answer, or None when it wrote the answer itself or closes
        the connection without one."""
        kind = fault.kind
        if kind in ("truncate", "drip", "chunked", "gzip", "huge"):  # written byte by byte
            assert request.raw is not None
            await _deliver_badly(request.raw, fault, json.dumps(self.simulator.document(api_version)).encode())
            return None
        if kind == "hang":
            await asyncio.sleep(fault.seconds)
            return None
        if kind == "reset":
            return None
        if kind in ("throttle", "status"):
            return await _status(fault, request)
        answers = {
            "redirect": Response(302, b"", "text/plain", (("Location", fault.location),)),
            "malformed": Response(200, b'{"DocumentIncarnation": 7, "Events": [{"EventId": "', "application/json"),
            "non_json": Response(200, CAPTIVE_PORTAL, "text/html"),
            "invalid": Response(200, b'{"DocumentIncarnation": 7, "Events": "none"}', "application/json"),
            "empty": Response(200, b"", "application/json"),
        }
        if kind == "body":
            return Response(200, fault.text.encode(), "application/json")
        return answers[kind]

    def _control(self, method: str, path: str, body: bytes) -> Response:
        """``/_simulator/<action>``, answered by its entry in ``_CONTROLS``: 400 with the reason when the body is
        refused, 404 for an action (or method) it does not list."""
        control = _CONTROLS.get((method, path[len("/_simulator/"):]))
        if control is None:
            return _json(404, {"error": "Not found"})
        try:
            return control(self.simulator, body)
        except (ValueError, ConfigError) as exc:
            return _json(400, {"error": _one_line(str(exc))})


# The control API, one function per action: each takes the simulator and the request's body, and raises ValueError
# (or ConfigError) with a one-line reason for a body it refuses.

def _requests(sim: Simulator, body: bytes) -> Response:
    return _json(200, [{"time": r.time, "method": r.method, "path": r.path, "query": r.query,
                        "user_agent": r.user_agent, "metadata": r.metadata_header} for r in sim.requests])


def _faults(sim: Simulator, body: bytes) -> Response:
    data = _json_body(body, [])
    sim.inject(*(faults_module.from_json(item) for item in (data if isinstance(data, list) else [data])))
    return _json(200, {})


def _clear_faults(sim: Simulator, body: bytes) -> Response:
    sim.clear_faults()
    return _json(200, {})


def _blind(sim: Simulator, body: bytes) -> Response:
    data = _json_body(body, None)
    event_id = data.get("EventId") if isinstance(data, dict) else None
    if not isinstance(event_id, str) or not 0 < len(event_id) <= 256:
        raise ValueError('the body must be {"EventId": "..."}: the event this VM\'s IMDS stops listing')
    sim.hide(event_id)
    return _json(200, {})


def _versions(sim: Simulator, body: bytes) -> Response:
    data = _json_body(body, None)
    newest = data.get("newest") if isinstance(data, dict) else None
    if newest not in SCHEDULED_EVENTS_VERSIONS:
        raise ValueError(f"'newest' must be one of {', '.join(SCHEDULED_EVENTS_VERSIONS)}")
    sim.newest_served = newest
    return _json(200, {})


MAX_LIFETIME = 10 * 365 * 86400  # seconds: ten years, far past any token a test needs, far below a date overflow


def _within(value: Any, kinds: type | tuple[type, ...], low: float, high: float) -> bool:
    """A finite JSON number of ``kinds`` (never a boolean) from ``low`` to ``high``."""
    return (not isinstance(value, bool) and isinstance(value, kinds) and math.isfinite(cast(float, value))
            and low <= cast(float, value) <= high)


def _identity(sim: Simulator, body: bytes) -> Response:
    """The body checked: lifetime finite and from 0 to ten years, fail a count, status an HTTP status (100-599)."""
    data = _json_body(body, {})
    if not isinstance(data, dict):
        raise ValueError('the body must be a JSON object such as {"lifetime": 3599} or {"fail": 2, "status": 500}')
    unknown = set(data) - {"lifetime", "fail", "status"}
    if unknown:
        raise ValueError(f"unknown keys {', '.join(sorted(unknown))} (lifetime, fail, status)")
    lifetime = data.get("lifetime")
    if lifetime is not None and not _within(lifetime, (int, float), 0, MAX_LIFETIME):
        raise ValueError(f"'lifetime' must be a number of seconds from 0 to {MAX_LIFETIME}, not {lifetime!r}")
    fail, status = data.get("fail", 0), data.get("status", 500)
    if not _within(fail, int, 0, faults_module.MAX_COUNT):
        raise ValueError(f"'fail' must be a whole number from 0 to {faults_module.MAX_COUNT}, not {fail!r}")
    if not _within(status, int, 100, 599):
        raise ValueError(f"'status' must be an HTTP status from 100 to 599, not {status!r}")
    sim.configure_identity(lifetime=lifetime, fail=fail, status=status)
    return _json(200, {})


def _advance(sim: Simulator, body: bytes) -> Response:
    data = _json_body(body, None)
    seconds = data.get("seconds") if isinstance(data, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        raise ValueError(f"'seconds' must be a number >= 0 (time only moves forward), not {seconds!r}")
    sim.advance(float(seconds))
    return _json(200, {"scenario_time": sim.scenario_time()})


_CONTROLS: dict[tuple[str, str], Callable[[Simulator, bytes], Response]] = {
    ("GET", "requests"): _requests,
    ("GET", "state"): lambda sim, body: _json(200, sim.state()),
    ("POST", "faults"): _faults,
    ("POST", "clear-faults"): _clear_faults,
    ("POST", "blind"): _blind,
    ("POST", "versions"): _versions,
    ("POST", "identity"): _identity,
    ("POST", "advance"): _advance,
}


def _json_body(body: bytes, empty: object) -> Any:
    """The control API's JSON body (``empty`` when there is none); ValueError with a one-line reason."""
    if not body.strip():
        return empty
    try:
        return json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("the body is nested too deeply to be read") from None
    except UnicodeDecodeError:
        raise ValueError("the body is not UTF-8 JSON") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"the body is not JSON: {error.msg} at character {error.pos}") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"the body is not JSON: {name} is not a JSON number")


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 300 else line[:297] + "..."


def _bad_version(versions: tuple[str, ...]) -> Response:
    return _json(400, {"error": "Bad request. api-version is invalid or was not specified in the request. "
                                "For more information refer to aka.ms/azureimds",
                       "newest-versions": list(reversed(versions[-3:]))})


def _as_bytes(answer: Response) -> bytes:
    """An answer written out by hand, body and all, whatever its status (the faults' 1xx, 204 and 304)."""
    try:
        phrase = HTTPStatus(answer.status).phrase
    except ValueError:
        phrase = ""
    head = [f"HTTP/1.1 {answer.status} {phrase}", f"Content-Type: {answer.content_type}",
            f"Content-Length: {len(answer.body)}", *(f"{name}: {value}" for name, value in answer.headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + answer.body


def _json(status: int, payload: object, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    """A JSON answer; never a non-finite number (``Infinity`` and ``NaN`` are not JSON): a 500 saying so instead."""
    try:
        body = json.dumps(payload, allow_nan=False).encode()
    except ValueError:
        status, body = 500, b'{"error": "the answer holds a number that is not finite (JSON cannot carry it)"}'
    return Response(status, body, "application/json; charset=utf-8", headers)


async def _status(fault: Fault, request: HttpRequest) -> Response | None:
    """A status fault's answer, with its Retry-After; one h11 frames without a body (1xx, 204, 304) written as
    it is."""
    headers = (("Retry-After", fault.retry_after),) if fault.retry_after is not None else ()
    answer = _json(fault.status, {"error": f"simulated HTTP {fault.status}"}, headers)
    if fault.status < 200 or fault.status in (204, 304):
        assert request.raw is not None
        await request.raw.write(_as_bytes(answer))
        return None
    return answer


_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"


async def _deliver_badly(raw: RawWriter, fault: Fault, document: bytes) -> None:
    """The byte-level faults: the real document cut, dripped, mis-chunked or compressed, or a huge body."""
    await _BADLY[fault.kind](raw, fault, document)


async def _huge(raw: RawWriter, fault: Fault, document: bytes) -> None:
    """Blanks, written as the client reads them (the client is allowed to hang up)."""
    size, chunk = fault.size_or(0), b" " * 65536
    if await raw.write(_HEAD + b"Content-Length: %d\r\n\r\n" % size):
        for offset in range(0, size, len(chunk)):
            if not await raw.write(chunk[: min(len(chunk), size - offset)]):
                return


async def _truncate(raw: RawWriter, fault: Fault, document: bytes) -> None:
    sent = min(fault.size_or(len(document) // 2), max(0, len(document) - 1))
    await raw.write(_HEAD + b"Content-Length: %d\r\n\r\n" % len(document) + document[:sent])


async def _drip(raw: RawWriter, fault: Fault, document: bytes) -> None:
    answer = _HEAD + b"Content-Length: %d\r\n\r\n" % len(document) + document
    for index in range(len(answer)):
        if not await raw.write(answer[index:index + 1]):
            return  # the client gave up: that is the point
        await asyncio.sleep(fault.seconds)


async def _chunked(raw: RawWriter, fault: Fault, document: bytes) -> None:
    third = max(1, len(document) // 3)
    parts = [document[i:i + third] for i in range(0, len(document), third)]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)
    if fault.error == "bad_size":
        chunks = b"%x\r\n%s\r\nzz\r\n" % (len(parts[0]), parts[0])
    ending = b"" if fault.error in ("missing_last", "bad_size") else b"0\r\n\r\n"
    await raw.write(_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + ending)


async def _gzip(raw: RawWriter, fault: Fault, document: bytes) -> None:
    """Inflates to ``bytes`` blanks, then the document (leading blanks are valid JSON)."""
    prefix, compressor = _blanks_compressed(fault.size_or(0))
    tail = compressor.copy()
    body = prefix + tail.compress(document) + tail.flush()
    await raw.write(_HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


_BADLY: dict[str, Callable[[RawWriter, Fault, bytes], Awaitable[None]]] = {
    "huge": _huge, "truncate": _truncate, "drip": _drip, "chunked": _chunked, "gzip": _gzip}


@functools.lru_cache(maxsize=2)
def _blanks_compressed(size: int) -> tuple[bytes, Any]:
    """``size`` blanks through a gzip compressor, unflushed: the compressed bytes so far and the compressor,
    which is copied per answer to add the document. Built once per size: compressing the blanks costs far more
    than compressing one document, which is all a repeated answer pays."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * min(size, 1024 * 1024) if size else b""
    out, left = [], size
    while left > 0:
        out.append(compressor.compress(block[:left]))
        left -= len(block)
    return b"".join(out), compressor


class SimulatorServer(Server):
    """The simulator on ``http_server``: bounded as every server of the project (``Bounds``). One port for every
    VM of the scenario: ``/vms/<name>/...`` is that VM's IMDS (``others``: the scenario's other VMs), anything else
    ``simulator``'s; ``GET /_simulator/platform`` is the platform copy's counters when it runs."""

    def __init__(self, address: tuple[str, int], simulator: Simulator, bounds: Bounds | None = None,
                 others: Sequence[Simulator] = (), platform: Callable[[], dict[str, Any]] | None = None) -> None:
        self.simulator = simulator
        self.simulators = (simulator, *others)
        self._first = _Imds(simulator)
        self._by_name = {sim.vm["name"].casefold(): _Imds(sim) for sim in self.simulators}
        self._platform = platform
        super().__init__(Listen(*address), self._route, bounds or Bounds(), _count, "imds-simulator")

    async def _route(self, request: HttpRequest) -> Response | None:
        if request.path.startswith(VM_PREFIX):
            name, _, rest = request.path[len(VM_PREFIX):].partition("/")
            handler = self._by_name.get(name.casefold())
            if handler is None:
                return _json(404, {"error": f"no VM {_one_line(name)[:64]!r} in this scenario"})
            return await handler(dataclasses.replace(request, path="/" + rest))
        if request.path == "/_simulator/platform" and request.method == "GET":
            return _json(200, self._platform() if self._platform else {"error": "the platform copy is not published"})
        return await self._first(request)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{Listen(str(host), port)}"

    def vm_url(self, name: str) -> str:
        """The base URL of one VM's IMDS (a sidecar's ``--imds-url``)."""
        return f"{self.url}{VM_PREFIX}{name}"


def _count(reason: str) -> None:
    log.debug("refused an HTTP request or connection: %s (docs/http.md: the HTTP server's bounds)", reason)


def start(simulator: Simulator, host: str = "127.0.0.1", port: int = 0, bounds: Bounds | None = None,
          others: Sequence[Simulator] = (), platform: Callable[[], dict[str, Any]] | None = None,
          ) -> SimulatorServer:
    """Serve ``simulator`` (and ``others`` under ``/vms/<name>``) in a daemon thread; port 0 picks a free port
    (see ``.url``)."""
    return SimulatorServer((host, port), simulator, bounds, others, platform)


def every_vm(scenario: Scenario, speed: float = 1.0, clock: Callable[[], float] = time.time) -> list[Simulator]:
    """A simulator per VM of the scenario, on one shared timeline (the first VM first)."""
    timeline = Timeline(scenario, speed, clock)
    return [Simulator(scenario, timeline=timeline, vm=vm) for vm in scenario.vms]
