"""Scenarios: what the simulated IMDS lists, when, as a pure function of scenario time.

A scenario is a JSON file (its format and timeline: docs/simulator.md; built-ins under ``scenarios/``). All times
are scenario seconds; the ``Timeline`` maps them to wall time with ``--speed``.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

from se_exporter.core.errors import ConfigError
from se_exporter.core.model import EVENT_FIELDS, EVENT_TYPES

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
# The event fields the timeline works out (from the spec's own attributes, the clock and approvals); every other
# field of ``EVENT_FIELDS`` is listed as the scenario gives it, else as the field's ``example``.
TIMED_FIELDS = frozenset({"EventId", "EventType", "Resources", "EventStatus", "NotBefore"})
_CYCLE_NAMESPACE = uuid.UUID("5b8e2b8e-1c53-4c1e-9a55-6f1f3f0b8c11")
_BUILTINS = resources.files("se_exporter.simulator").joinpath("scenarios")


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
    # JSON name and value of each field of EVENT_FIELDS not in TIMED_FIELDS, in the table's order
    fields: tuple[tuple[str, Any], ...] = tuple((row.json, row.example) for row in EVENT_FIELDS
                                                if row.json not in TIMED_FIELDS)
    started_at_first_sight: bool = False
    cancel_at: float | None = None
    reschedule: tuple[Reschedule, ...] = ()
    blind: tuple[str, ...] = ()  # VMs whose IMDS never lists it (a blind sidecar); the platform publishes it still
    announced: bool = True  # False: the platform copy never tells of it (a delivery Event Grid lost); IMDS lists it

    @property
    def listed(self) -> dict[str, Any]:
        """The fields listed as given (``fields``), by JSON name."""
        return dict(self.fields)

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
class PlatformSettings:
    """How the platform's copy of the scenario behaves (the scenario's optional ``platform`` object)."""

    duplicate_every: int = 10  # every Nth message is published twice, same Event Grid id (0: never)
    delay: float = 0.0  # scenario seconds between an IMDS change and its platform message


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
    vms: tuple[Mapping[str, str], ...] = ()  # every VM it plays (``vm`` first); one IMDS each
    platform: PlatformSettings = field(default_factory=PlatformSettings)

    def vm_named(self, name: str) -> Mapping[str, str] | None:
        """The scenario's VM of that name (Azure compares names without case)."""
        folded = name.casefold()
        return next((vm for vm in self.vms if vm["name"].casefold() == folded), None)

    def scope(self, spec: EventSpec) -> tuple[str, str, Mapping[str, str]]:
        """Where the platform says ``spec`` happens: (ARM kind, name, the VM whose place it is in). The first VM
        of Resources (the scenario's first VM for a name it does not play) decides: its scale set, else its
        availability set (``availabilitySet``, a scenario-only key), else that VM alone; an event of several VMs
        outside any set is put in an availability set named after the scenario (Azure groups them so)."""
        first = spec.resources[0] if spec.resources else self.vm["name"]
        vm = self.vm_named(first) or {**self.vm, "name": first}
        if vm.get("vmScaleSetName"):
            return "virtualMachineScaleSets", vm["vmScaleSetName"], vm
        if vm.get("availabilitySet"):
            return "availabilitySets", vm["availabilitySet"], vm
        if len(spec.resources) <= 1:
            return "virtualMachines", first, vm
        return "availabilitySets", f"{self.name}-set", vm

    def listed_to(self, spec: EventSpec, vm_name: str) -> bool:
        """Whether the VM's IMDS lists ``spec``: Azure shows an event to every VM of its scale set or availability
        set (Resources says whose it is); a one-VM scenario's VM sees every event; a ``blind`` VM never does."""
        folded = vm_name.casefold()
        if any(name.casefold() == folded for name in spec.blind):
            return False
        if len(self.vms) <= 1 or any(name.casefold() == folded for name in spec.resources):
            return True
        kind, scope_name, _ = self.scope(spec)
        vm = self.vm_named(vm_name) or {}
        key = {"virtualMachineScaleSets": "vmScaleSetName", "availabilitySets": "availabilitySet"}.get(kind)
        return key is not None and vm.get(key, "").casefold() == scope_name.casefold()

    @property
    def duration(self) -> float:
        """Scenario seconds until the last event is gone (one cycle for a repeating scenario)."""
        return max((spec.end_time() for spec in self.events), default=0.0)

    def state_at(self, t: float, approvals: Mapping[str, float]) -> tuple[EventState, ...]:
        """Events listed at scenario second ``t``; ``approvals`` maps listed EventIds to their approval time."""
        cycle, local = 0, t
        if self.repeat_every:
            cycle = int(t // self.repeat_every)
            local = t - cycle * self.repeat_every
        base = cycle * (self.repeat_every or 0)
        listed: list[EventState] = []
        for spec in self.events:
            if local < spec.appear_at:
                continue
            event_id = cycle_event_id(spec.event_id, cycle)
            approved = approvals.get(event_id)
            reached = [status for at, status in lifecycle(spec, None if approved is None else approved - base)
                       if at <= local]
            if reached[-1] == "Started":
                listed.append(EventState(spec, event_id, "Started", None))
            elif reached[-1] == "Scheduled":
                listed.append(EventState(spec, event_id, "Scheduled", spec.not_before_at(local) + base))
        return tuple(listed)


def lifecycle(spec: EventSpec, approved_at: float | None) -> list[tuple[float, str]]:
    """``spec``'s statuses in one cycle, each with its scenario second: the one timeline both IMDS
    (``Scenario.state_at``) and the platform copy (``platform.PlatformCopy``) follow. Never empty."""
    start = spec.start_time(approved_at)
    if spec.cancel_at is not None and spec.cancel_at < start:
        return [(spec.appear_at, "Scheduled"), (spec.cancel_at, "Canceled")]
    steps = [] if start <= spec.appear_at else [(spec.appear_at, "Scheduled")]
    if math.isfinite(start):
        steps += [(start, "Started"), (start + spec.started_for, "Completed")]
    return steps


def cycle_event_id(event_id: str, cycle: int) -> str:
    """A repeating scenario needs fresh EventIds each cycle, or the events would never be new."""
    if cycle == 0:
        return event_id
    return str(uuid.uuid5(_CYCLE_NAMESPACE, f"{event_id}/{cycle}")).upper()


def builtin_names() -> tuple[str, ...]:
    return tuple(sorted(p.name[: -len(".json")] for p in _BUILTINS.iterdir() if p.name.endswith(".json")))


def load(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario JSON file by path; ConfigError says what is wrong."""
    if name_or_path in builtin_names():
        return from_json(json.loads(_BUILTINS.joinpath(f"{name_or_path}.json").read_text()), name_or_path)
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
    vms = _vms(data, name)
    vm = vms[0]
    events = tuple(_spec(raw, index, name, vm["name"]) for index, raw in enumerate(data["events"]))
    repeat = data.get("repeat_every")
    scenario = Scenario(name=name, description=str(data.get("description", "")), vm=vm, events=events,
                        repeat_every=float(repeat) if repeat else None, vms=vms, platform=_platform(data, name))
    if scenario.repeat_every and scenario.duration > scenario.repeat_every:
        raise ConfigError(f"scenario {name}: events last {scenario.duration:g}s, longer than repeat_every")
    if scenario.repeat_every and scenario.platform.delay >= scenario.repeat_every:
        raise ConfigError(f"scenario {name}: platform delay must be shorter than repeat_every (a cycle)")
    return scenario


def _vms(data: dict[str, Any], name: str) -> tuple[dict[str, str], ...]:
    """``vm`` (one VM), or ``vms`` (several, each on its own IMDS): every field defaults to ``vm``'s, then to the
    sample VM's; a VM after the first gets a vmId of its own, derived from its name, unless given one."""
    base, listed = data.get("vm") or {}, data.get("vms")
    if not isinstance(base, dict) or (listed is not None and not _objects(listed)):
        raise ConfigError(f"scenario {name}: 'vm' must be an object and 'vms' a non-empty list of objects")
    vms: list[dict[str, str]] = []
    for index, raw in enumerate(listed or [{}]):
        vm = _vm(base, raw, index, name)
        if any(other["name"].casefold() == vm["name"].casefold() for other in vms):
            raise ConfigError(f"scenario {name}: two VMs are named {vm['name']!r}")
        vms.append(vm)
    return tuple(vms)


def _objects(value: Any) -> bool:
    """A non-empty list of JSON objects."""
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _vm(base: dict[str, Any], raw: dict[str, Any], index: int, name: str) -> dict[str, str]:
    """The ``index``-th VM of scenario ``name``: its fields over ``vm``'s over the sample VM's, with its own vmId
    and resourceId unless given them."""
    vm = {**DEFAULT_VM, **{k: str(v) for k, v in base.items()}, **{k: str(v) for k, v in raw.items()}}
    if index and "vmId" not in raw:
        vm["vmId"] = str(uuid.uuid5(_CYCLE_NAMESPACE, f"{name}/vm/{vm['name']}"))
    if not _VM_NAME.fullmatch(vm["name"]):
        raise ConfigError(f"scenario {name}: VM name {vm['name']!r} is not 1 to 64 letters, digits, '_', "
                          "'.' or '-' (it is a URL path segment of its IMDS)")
    if "resourceId" not in raw and (index or "resourceId" not in base):
        vm["resourceId"] = (f"/subscriptions/{vm['subscriptionId']}/resourceGroups/{vm['resourceGroupName']}"
                            f"/providers/Microsoft.Compute/virtualMachines/{vm['name']}")
    return vm


_VM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _platform(data: dict[str, Any], name: str) -> PlatformSettings:
    raw = data.get("platform") or {}
    try:
        if not isinstance(raw, dict) or set(raw) - {"duplicate_every", "delay"}:
            raise ValueError("must be an object with duplicate_every and delay only")
        every, delay = raw.get("duplicate_every", 10), raw.get("delay", 0.0)
        if not _number(every, int, 0, float("inf")):
            raise ValueError(f"duplicate_every must be a whole number >= 0, not {every!r}")
        if not _number(delay, (int, float), 0, 86400):
            raise ValueError(f"delay must be seconds from 0 to 86400, not {delay!r}")
    except ValueError as exc:
        raise ConfigError(f"scenario {name}: platform {exc}") from None
    return PlatformSettings(every, float(delay))


def _number(value: Any, kinds: type | tuple[type, ...], low: float, high: float) -> bool:
    """A JSON number of ``kinds`` (never a boolean) from ``low`` to ``high``."""
    return not isinstance(value, bool) and isinstance(value, kinds) and low <= cast(float, value) <= high


def _listed(raw: Mapping[str, Any], name: str, example: Any) -> Any:
    """A listed field's value from the scenario, of its example's JSON type (TypeError/ValueError otherwise)."""
    if name not in raw:
        return example
    value = raw[name]
    return value if example is None or value is None else type(example)(value)


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
            fields=tuple((row.json, _listed(raw, row.json, row.example)) for row in EVENT_FIELDS
                         if row.json not in TIMED_FIELDS),
            started_at_first_sight=bool(raw.get("started_at_first_sight", False)),
            cancel_at=None if raw.get("cancel_at") is None else float(raw["cancel_at"]),
            reschedule=tuple(Reschedule(float(r["at"]), float(r["notice"])) for r in raw.get("reschedule", [])),
            blind=tuple(str(r) for r in raw.get("blind", [])),
            announced=raw.get("announced", True),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {type(exc).__name__} {exc}") from None
    _check_spec(spec, where)
    return spec


def _check_spec(spec: EventSpec, where: str) -> None:
    """What an event's fields must be together beyond their types."""
    if spec.event_type not in EVENT_TYPES:
        raise ConfigError(f"{where}: EventType {spec.event_type!r} is not one of {', '.join(EVENT_TYPES)}")
    if not isinstance(spec.announced, bool):
        raise ConfigError(f"{where}: announced must be true or false, not {spec.announced!r}")
    if spec.started_for <= 0 or spec.notice < 0:
        raise ConfigError(f"{where}: started_for must be > 0 and notice >= 0")
