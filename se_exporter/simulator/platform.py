"""The platform's copy of a scenario: the Event Grid messages Azure publishes for the events its VMs' IMDS lists.

Azure can publish every scheduled event a second time, outside the VMs, to an Event Grid system topic delivered to
an Event Hub (``azure-docs/platform-stream.md``). ``PlatformCopy`` plays that stream from the same pure timeline the
simulated IMDS answers from, so one run feeds both sides of ``se-exporter fleet`` (what it publishes, and when:
docs/simulator.md). No I/O here: ``due`` takes the scenario time and returns the messages whose moment has come.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import format_datetime
from typing import Any

from se_exporter.simulator.scenario import EventSpec, Scenario, cycle_event_id, lifecycle

EVENT_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
SCHEMAS = ("eventgrid", "cloudevents")
DATA_API_VERSION = "2024-07-01"
SCHEDULED_EVENTS_API_VERSION = "2020-07-01"
_RANK = {"Scheduled": 1, "Started": 2, "Completed": 3, "Canceled": 3}
_GRID_NAMESPACE = uuid.UUID("2f0c3a51-6d2e-4f7b-9a8c-1e5d4b3a2c10")
MAX_CYCLES_PER_LOOK = 3  # a jump of scenario time past many cycles publishes only the last ones (IMDS showed none)


@dataclass(frozen=True)
class Published:
    """One message of the platform stream: its Event Grid id, what it says, and its exact bytes."""

    grid_id: str
    event_id: str
    event_status: str
    body: bytes
    duplicate: bool = False  # the second copy of a message (same grid id and bytes)


@dataclass(frozen=True)
class _Change:
    at: float  # scenario second
    spec: EventSpec
    cycle: int
    event_id: str
    status: str


class PlatformCopy:
    """What the platform has published so far, and what is due next; called from one thread."""

    def __init__(self, scenario: Scenario, schema: str = "eventgrid") -> None:
        if schema not in SCHEMAS:
            raise ValueError(f"schema {schema!r} is not one of {', '.join(SCHEMAS)}")
        self.scenario = scenario
        self.schema = schema
        self._published: dict[str, tuple[int, int]] = {}  # EventId -> (cycle, rank of the last status published)
        self._messages = 0
        self._last_wall = -math.inf

    def due(self, t: float, approvals: Mapping[str, float], wall_at: Callable[[float], float]) -> list[Published]:
        """The messages whose moment came by scenario second ``t``, in time order; ``wall_at`` maps a scenario second
        to unix time (its eventTime and NotBefore). Each status of each EventId is returned once, ever."""
        changes = sorted(self._changes(t, approvals), key=lambda change: change.at)
        out: list[Published] = []
        for change in changes:
            rank = _RANK[change.status]
            if rank <= self._published.get(change.event_id, (0, 0))[1]:
                continue
            self._published[change.event_id] = (change.cycle, rank)
            when = max(wall_at(change.at), self._last_wall)  # a jump of scenario time never sends time back
            self._last_wall = when
            message = self.message(change.spec, change.event_id, change.status, when,
                                   self._not_before(change, wall_at))
            out.append(message)
            self._messages += 1
            every = self.scenario.platform.duplicate_every
            if every and self._messages % every == 0:
                out.append(Published(message.grid_id, message.event_id, message.event_status, message.body, True))
        return out

    def _changes(self, t: float, approvals: Mapping[str, float]) -> list[_Change]:
        scenario = self.scenario
        period = scenario.repeat_every
        last = int(t // period) if period else 0
        first = max(0, last - MAX_CYCLES_PER_LOOK + 1)
        # What is past every cycle looked at is forgotten: the memory stays a few cycles' EventIds.
        self._published = {key: value for key, value in self._published.items() if value[0] >= first}
        return [change for cycle in range(first, last + 1) for spec in scenario.events if spec.announced
                for change in self._cycle_changes(spec, cycle, approvals) if change.at <= t]

    def _cycle_changes(self, spec: EventSpec, cycle: int, approvals: Mapping[str, float]) -> list[_Change]:
        """Every status of ``spec``'s event in ``cycle``, at the scenario second the platform publishes it."""
        base, delay = cycle * (self.scenario.repeat_every or 0), self.scenario.platform.delay
        event_id = cycle_event_id(spec.event_id, cycle)
        approved = approvals.get(event_id)
        return [_Change(base + at + delay, spec, cycle, event_id, status)
                for at, status in lifecycle(spec, None if approved is None else approved - base)]

    def _not_before(self, change: _Change, wall_at: Callable[[float], float]) -> float | None:
        if change.status != "Scheduled":
            return None
        base = change.cycle * (self.scenario.repeat_every or 0)
        return wall_at(base + change.spec.not_before_at(change.at - base - self.scenario.platform.delay))

    def message(self, spec: EventSpec, event_id: str, status: str, when: float, not_before: float | None,
                ) -> Published:
        """The message of one status of one event, published at unix time ``when``."""
        kind, scope_name, vm = self.scenario.scope(spec)
        subscription, group = vm.get("subscriptionId", ""), vm.get("resourceGroupName", "")
        arm_id = (f"/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Compute/{kind}/"
                  f"{scope_name}/providers/microsoft.maintenance/scheduledevents/{event_id}")
        grid_id = str(uuid.uuid5(_GRID_NAMESPACE, f"{event_id}/{status}"))
        data = {"apiVersion": DATA_API_VERSION, "resourceInfo": {
            "id": arm_id, "name": event_id, "type": "microsoft.maintenance/scheduledEvents",
            "location": vm.get("location", ""),
            "properties": {
                "EventId": event_id, "EventType": spec.event_type, "Resources": list(spec.resources),
                "EventStatus": status,
                "NotBefore": "" if not_before is None else format_datetime(_utc(not_before), usegmt=True),
                **spec.listed,
                "ScheduledEventApiVersion": SCHEDULED_EVENTS_API_VERSION}}}
        topic, time = f"/subscriptions/{subscription}", iso_time(when)
        event: Any
        if self.schema == "cloudevents":
            event = {"specversion": "1.0", "type": EVENT_TYPE, "source": topic, "subject": arm_id, "id": grid_id,
                     "time": time, "datacontenttype": "application/json", "data": data}
        else:
            event = [{"id": grid_id, "topic": topic, "subject": arm_id, "eventType": EVENT_TYPE, "eventTime": time,
                      "dataVersion": "3.0", "metadataVersion": "1", "data": data}]
        return Published(grid_id, event_id, status, json.dumps(event, separators=(",", ":")).encode())


def _utc(unix: float) -> datetime:
    return datetime.fromtimestamp(int(unix), timezone.utc)


def iso_time(unix: float) -> str:
    """ISO 8601 as Event Grid writes it: seven fractional digits, ``Z``."""
    seconds = math.floor(unix)
    whole = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{min(int((unix - seconds) * 10**7), 10**7 - 1):07d}Z"
