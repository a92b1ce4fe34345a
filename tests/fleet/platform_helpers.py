"""Platform messages for the tests: the spec's example (``platform_examples``), varied field by field."""

from __future__ import annotations

import copy
import json
from collections.abc import Container, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from se_exporter.fleet.message import Imds, VmState, fleet_events, parse_body
from se_exporter.fleet.platform.coverage import Coverage
from se_exporter.fleet.platform.exposition import PlatformCollector
from se_exporter.fleet.platform.reader import PlatformEvent, read_platform
from se_exporter.fleet.platform.records import PlatformRecord
from se_exporter.fleet.platform.service import LastReconciliation

EXAMPLES = Path(__file__).parent / "platform_examples"
SPEC_EXAMPLE = (EXAMPLES / "eventgrid-completed.json").read_bytes()
EVENT_ID = "0D1E2F3A-4B5C-4D6E-8F70-8192A3B4C5D6"
KEY = EVENT_ID.lower()
SUB = "00000000-0000-0000-0000-000000000000"
T0 = 1_800_000_000.0  # the announcement, in unix time
MAX = 1024 * 1024


def spec_event() -> dict[str, Any]:
    [event] = json.loads(SPEC_EXAMPLE)
    assert isinstance(event, dict)
    return event


def iso(unix: float) -> str:
    from datetime import datetime, timezone  # noqa: PLC0415 - one helper's need

    return datetime.fromtimestamp(unix, timezone.utc).isoformat().replace("+00:00", "Z")


def grid(status: str = "Scheduled", grid_id: str | None = None, event_id: str = EVENT_ID, at: float = T0,
         resources: list[Any] | None = None, event_type: str = "Reboot", **props: Any) -> dict[str, Any]:
    """The spec's event with another status, Event Grid id, EventId, eventTime, Resources or properties."""
    event = copy.deepcopy(spec_event())
    event["id"] = grid_id or f"grid-{event_id}-{status}"
    event["eventTime"] = iso(at)
    info = event["data"]["resourceInfo"]
    info["name"] = event_id
    info["id"] = info["id"].replace(EVENT_ID, event_id)
    event["subject"] = info["id"]
    properties = info["properties"]
    properties.update({"EventId": event_id, "EventStatus": status, "EventType": event_type,
                       "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT" if status == "Scheduled" else ""})
    if resources is not None:
        properties["Resources"] = resources
    properties.update(props)
    return event


def cloud(event: dict[str, Any]) -> dict[str, Any]:
    """The same event in the CloudEvents 1.0 schema, as an Event Grid subscription may deliver it."""
    return {"specversion": "1.0", "type": event["eventType"], "source": event["topic"], "subject": event["subject"],
            "id": event["id"], "time": event["eventTime"], "datacontenttype": "application/json",
            "data": event["data"]}


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def platform_event(status: str = "Scheduled", **kwargs: Any) -> PlatformEvent:
    read = read_platform(body([grid(status, **kwargs)]), MAX, 0.0)
    assert read is not None
    [event] = read.events
    return event


def vm(name: str = "web_3", listed: tuple[str, ...] = (), seen_at: float = T0 + 100, vmss: str = "web",
       location: str = "westeurope", imds: Imds | None = None, subscription: str = "", group: str = "") -> VmState:
    """A VM as Fleet.vms() gives it, its latest document listing ``listed`` EventIds (Freeze, Scheduled)."""
    document = {"DocumentIncarnation": 1, "Events": [
        {"EventId": event_id, "EventType": "Reboot", "ResourceType": "VirtualMachine", "Resources": [name],
         "EventStatus": "Scheduled", "NotBefore": "", "EventSource": "Platform"} for event_id in listed]}
    raw = json.dumps(document).encode()
    events, _hit = fleet_events(parse_body(raw), name)
    return VmState(f"id-{name}", f"id-{name}", name, vmss, location, f"inst-{name}", 1, seen_at, raw, events,
                   imds or Imds(), subscription, group)


def platform_text(records: Iterable[PlatformRecord], coverage: Iterable[Coverage],
                  informed: Container[str] | None = None) -> str:
    """The platform gauges of ``records`` and ``coverage`` as a scrape writes them (``PlatformCollector``), the info
    series of the keys in ``informed`` only when given."""
    records = tuple(records)
    keys = frozenset(record.key for record in records if informed is None or record.key in informed)
    registry = CollectorRegistry()
    registry.register(PlatformCollector(lambda: LastReconciliation(records, tuple(coverage), keys)))
    return generate_latest(registry).decode()
