"""The forwarded message's application properties, declared once: the sidecar writes them
(``sidecar/forwarding/envelope.py``), the fleet reads each by its kind (``fleet/message.py``), ``make docs`` writes
their part of ``schemas/forwarded-document.schema.json`` and their table in docs/reference.md, and
tests/project/test_envelope_properties.py holds the sidecar and the fleet to the table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_MILLIS = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$"


@dataclass(frozen=True)
class Kind:
    says: str  # as docs/reference.md shows it
    schema: dict[str, Any]  # as the schema publishes it


# Each kind of value; the fleet reads each kind its own way (``message.read_property``).
KINDS: dict[str, Kind] = {
    "text": Kind("string", {"type": "string"}),
    "time": Kind("RFC 3339, UTC, milliseconds", {"type": "string", "pattern": _MILLIS}),
    "date": Kind("YYYY-MM-DD", {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}),
    "sequence": Kind("integer from 1", {"type": "integer", "minimum": 1}),
    # What an Event Hubs message can carry of any integer (sidecar/forwarding/envelope.py, ``carriable``).
    "integer": Kind("integer within 32 bits signed, else its decimal digits as a string",
                    {"oneOf": [{"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1},
                               {"type": "string", "pattern": "^-?[0-9]+$"}]}),
    "flag": Kind("boolean", {"type": "boolean"}),
    "mark": Kind("`true`, present only when true", {"const": True}),
    "pauses": Kind('JSON text: an object of EventId to {"type", "longest", "total"} (seconds)',
                   {"type": "string", "contentMediaType": "application/json"}),
}


@dataclass(frozen=True)
class Property:
    name: str
    required: bool  # on every message a sidecar sends; the others only where they apply
    kind: str  # a key of KINDS
    says: str
    # Kept per VM by the fleet (``VmState.reported``) and stored in its state, for a figure of ``fleet/scrape.py``;
    # the properties the fleet reads by name (identity, place, IMDS health, ordering) are not.
    kept: bool = False


PROPERTIES = (
    Property("vm_name", True, "text", "the VM's name (IMDS compute metadata, else the configured name)"),
    Property("vm_id", True, "text", "the VM's id from IMDS compute metadata; empty until read"),
    Property("vmss_name", True, "text", "the scale set's name; empty for a VM outside one"),
    Property("subscription_id", True, "text", "where the VM is: the platform stream is joined on it"),
    Property("resource_group", True, "text", "where the VM is: the platform stream is joined on it"),
    Property("location", True, "text", "the VM's region"),
    Property("observed_at", True, "time", "when the sidecar read the document"),
    Property("api_version", True, "date", "the Scheduled Events api-version the document answered"),
    Property("exporter_version", True, "text", "the sidecar's version"),
    Property("sequence", True, "sequence", "monotonic per installation, across restarts"),
    Property("document_incarnation", False, "integer", "DocumentIncarnation; absent when the document had none"),
    Property("heartbeat", False, "mark", "on a heartbeat: the current document forwarded again after "
             "--heartbeat-interval without a change (a new sequence, observed_at now); absent on a change"),
    Property("imds_last_success", False, "time", "when the sidecar last read a valid document from IMDS: on a "
             "change, observed_at; on a heartbeat during an IMDS outage, the last good read"),
    Property("imds_failing", False, "flag", "whether the sidecar's latest poll of IMDS failed (the heartbeat then "
             "repeats the last valid document, read at imds_last_success)"),
    Property("pauses", False, "pauses", "the pauses the VM felt during each event it lists, and each event this "
             "message ends: the longest and the total, in seconds (docs/events.md, \"Pauses\"); absent while none was "
             "felt; at most 16 events, those that paused longest", kept=True),
    Property("retires_name", False, "mark", "on the one message a sidecar sends under its old partition key (its "
             "vm_name) when it first knows its vm_id: it retires the VM known by that name (the same installation)"),
)
NAMES = frozenset(p.name for p in PROPERTIES)
REQUIRED = frozenset(p.name for p in PROPERTIES if p.required)
KEPT = tuple(p for p in PROPERTIES if p.kept)


def schema() -> dict[str, Any]:
    """The JSON schema of a message's properties, as ``schemas/forwarded-document.schema.json`` publishes it."""
    return {"type": "object", "required": [p.name for p in PROPERTIES if p.required], "additionalProperties": False,
            "properties": {p.name: {**KINDS[p.kind].schema, "description": p.says[0].upper() + p.says[1:] + "."}
                           for p in PROPERTIES}}
