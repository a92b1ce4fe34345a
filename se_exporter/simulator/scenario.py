"""Scenarios: what the simulated IMDS lists, when, as a pure function of scenario time.

A scenario is a JSON file (format in docs/simulator.md, built-ins under ``scenarios/``). Each event
appears at ``appear_at``, is ``Scheduled`` with ``NotBefore = appear_at + notice`` (moved by any
``reschedule`` entry), starts at NotBefore or when approved, whichever is first (or at first sight
with ``started_at_first_sight``, as a host failure does), stays ``Started`` for ``started_for``
seconds and then disappears. ``cancel_at`` removes it before it starts. All times are scenario
seconds; the server maps them to wall time with ``--speed``.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from se_exporter.core.errors import ConfigError
from se_exporter.core.model import EVENT_TYPES

DEFAULT_VM: dict[str, str] = {
    "name": "WestNO_0",
    "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
    "vmScaleSetName": "",
    "location": "norwayeast",
    "resourceGroupName": "maintenance-rg",
    "subscriptionId": "8d10da13-8125-4ba9-a717-bf7490507b3d",
    "vmSize": "Standard_D2s_v5",
    "zone": "1",
    "sku": "22_04-lts-gen2",
    "osType": "Linux",
    "version": "22.04.202411010",
}
_CYCLE_NAMESPACE = uuid.UUID("5b8e2b8e-1c53-4c1e-9a55-6f1f3f0b8c11")


@dataclass(frozen=True)
class Reschedule:
    at: float
    notice: float


@dataclass(frozen=True)
class EventSpec:
    event_id: str
    event_type: str
    resources: tuple[str, ...]
    appear_at: float
    notice: float
    started_for: float
    description: str = ""
    event_source: str = "Platform"
    duration_seconds: int = -1
    started_at_first_sight: bool = False
    cancel_at: float | None = None
    reschedule: tuple[Reschedule, ...] = ()

    def start_time(self, approved_at: float | None) -> float:
        """Scenario second at which the event starts (NotBefore reached, or approved)."""
        if self.started_at_first_sight:
            return self.appear_at
        segments = [(self.appear_at, self.appear_at + self.notice)]
        segments += [(r.at, r.at + r.notice) for r in self.reschedule]
        start = math.inf
        for index, (since, not_before) in enumerate(segments):
            until = segments[index + 1][0] if index + 1 < len(segments) else math.inf
            candidate = max(since, not_before)
            if candidate < until:
                start = candidate
                break
        if approved_at is not None and approved_at >= self.appear_at:
            start = min(start, approved_at)
        return start

    def not_before_at(self, t: float) -> float:
        value = self.appear_at + self.notice
        for r in self.reschedule:
            if r.at <= t:
                value = r.at + r.notice
        return value

    def end_time(self) -> float:
        start = self.start_time(None)
        if self.cancel_at is not None and self.cancel_at < start:
            return self.cancel_at
        return start + self.started_for


@dataclass(frozen=True)
class EventState:
    """One event as listed at some scenario second."""

    spec: EventSpec
    event_id: str
    status: str
    not_before: float | None  # scenario seconds; None once started


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    vm: Mapping[str, str]
    events: tuple[EventSpec, ...]
    repeat_every: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def duration(self) -> float:
        """Scenario seconds until the last event is gone (one cycle for a repeating scenario)."""
        return max((spec.end_time() for spec in self.events), default=0.0)

    def key_times(self) -> tuple[float, ...]:
        """Every scenario second at which the listed events change, in order (one cycle)."""
        times: set[float] = set()
        for spec in self.events:
            times.add(spec.appear_at)
            times.update(r.at for r in spec.reschedule if r.at < spec.end_time())
            start = spec.start_time(None)
            if spec.cancel_at is not None and spec.cancel_at < start:
                times.add(spec.cancel_at)
            else:
                times.update((start, start + spec.started_for))
        return tuple(sorted(times))

    def state_at(self, t: float, approvals: Mapping[str, float]) -> tuple[EventState, ...]:
        """Events listed at scenario second ``t``; ``approvals`` maps listed EventIds to their approval time."""
        cycle, local = 0, t
        if self.repeat_every:
            cycle = int(t // self.repeat_every)
            local = t - cycle * self.repeat_every
        listed: list[EventState] = []
        for spec in self.events:
            if local < spec.appear_at:
                continue
            event_id = cycle_event_id(spec.event_id, cycle)
            approved = approvals.get(event_id)
            approved_local = None if approved is None else approved - cycle * (self.repeat_every or 0)
            start = spec.start_time(approved_local)
            if spec.cancel_at is not None and spec.cancel_at < start:
                if local >= spec.cancel_at:
                    continue
            elif local >= start + spec.started_for:
                continue
            if local >= start:
                listed.append(EventState(spec, event_id, "Started", None))
            else:
                not_before = spec.not_before_at(local) + cycle * (self.repeat_every or 0)
                listed.append(EventState(spec, event_id, "Scheduled", not_before))
        return tuple(listed)


def cycle_event_id(event_id: str, cycle: int) -> str:
    """A repeating scenario needs fresh EventIds each cycle, or the events would never be new."""
    if cycle == 0:
        return event_id
    return str(uuid.uuid5(_CYCLE_NAMESPACE, f"{event_id}/{cycle}")).upper()


def builtin_names() -> tuple[str, ...]:
    folder = resources.files("se_exporter.simulator").joinpath("scenarios")
    return tuple(sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json")))


def load(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario JSON file by path; ConfigError says what is wrong."""
    if name_or_path in builtin_names():
        folder = resources.files("se_exporter.simulator").joinpath("scenarios")
        text = folder.joinpath(f"{name_or_path}.json").read_text()
        return from_json(json.loads(text), name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"scenario {name_or_path!r} is neither a built-in ({', '.join(builtin_names())}) "
                          "nor a file")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"scenario file {path}: {exc}") from None
    return from_json(data, path.stem)


def from_json(data: object, name: str) -> Scenario:
    if not isinstance(data, dict) or not isinstance(data.get("events"), list):
        raise ConfigError(f"scenario {name}: must be an object with an 'events' list")
    vm = {**DEFAULT_VM, **{k: str(v) for k, v in (data.get("vm") or {}).items()}}
    vm.setdefault("resourceId", f"/subscriptions/{vm['subscriptionId']}/resourceGroups/{vm['resourceGroupName']}"
                                f"/providers/Microsoft.Compute/virtualMachines/{vm['name']}")
    events = tuple(_spec(raw, index, name, vm["name"]) for index, raw in enumerate(data["events"]))
    repeat = data.get("repeat_every")
    scenario = Scenario(name=name, description=str(data.get("description", "")), vm=vm, events=events,
                        repeat_every=float(repeat) if repeat else None)
    if scenario.repeat_every and scenario.duration > scenario.repeat_every:
        raise ConfigError(f"scenario {name}: events last {scenario.duration:g}s, longer than repeat_every")
    return scenario


def _spec(raw: object, index: int, name: str, vm_name: str) -> EventSpec:
    where = f"scenario {name}: events[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be an object")
    try:
        event_type = str(raw["EventType"])
        spec = EventSpec(
            event_id=str(raw.get("EventId") or uuid.uuid5(_CYCLE_NAMESPACE, f"{name}/{index}")).upper(),
            event_type=event_type,
            resources=tuple(str(r) for r in raw.get("Resources", [vm_name])),
            appear_at=float(raw.get("appear_at", 0)),
            notice=float(raw.get("notice", 0)),
            started_for=float(raw.get("started_for", 60)),
            description=str(raw.get("Description", "")),
            event_source=str(raw.get("EventSource", "Platform")),
            duration_seconds=int(raw.get("DurationInSeconds", -1)),
            started_at_first_sight=bool(raw.get("started_at_first_sight", False)),
            cancel_at=None if raw.get("cancel_at") is None else float(raw["cancel_at"]),
            reschedule=tuple(Reschedule(float(r["at"]), float(r["notice"])) for r in raw.get("reschedule", [])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {type(exc).__name__} {exc}") from None
    if event_type not in EVENT_TYPES:
        raise ConfigError(f"{where}: EventType {event_type!r} is not one of {', '.join(EVENT_TYPES)}")
    if spec.started_for <= 0 or spec.notice < 0:
        raise ConfigError(f"{where}: started_for must be > 0 and notice >= 0")
    return spec
