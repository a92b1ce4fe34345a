"""The forwarded message's application properties, declared once: the sidecar writes them
(``sidecar/forwarding/envelope.py``), the fleet reads them (``fleet/message.py``), and
``schemas/forwarded-document.schema.json`` publishes them (tests/project/test_envelope_properties.py holds the three
together)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Property:
    name: str
    required: bool  # on every message a sidecar sends; the others only where they apply
    says: str


PROPERTIES = (
    Property("vm_name", True, "the VM's name (IMDS compute metadata, else the configured name)"),
    Property("vm_id", True, "the VM's id from IMDS compute metadata; empty until read"),
    Property("vmss_name", True, "the scale set's name; empty for a VM outside one"),
    Property("subscription_id", True, "where the VM is: the platform stream is joined on it"),
    Property("resource_group", True, "where the VM is: the platform stream is joined on it"),
    Property("location", True, "the VM's region"),
    Property("observed_at", True, "when the sidecar read the document (RFC 3339, UTC, milliseconds)"),
    Property("api_version", True, "the Scheduled Events api-version the document answered"),
    Property("exporter_version", True, "the sidecar's version"),
    Property("sequence", True, "monotonic per installation, across restarts"),
    Property("document_incarnation", False, "DocumentIncarnation, when the document had one"),
    Property("heartbeat", False, "true on a resend of an unchanged document"),
    Property("imds_last_success", False, "the sidecar's last successful IMDS read"),
    Property("imds_failing", False, "whether the sidecar's IMDS reads are failing"),
    Property("retires_name", False, "true on the message that retires a VM's name key once its vm_id is known"),
)
NAMES = frozenset(p.name for p in PROPERTIES)
REQUIRED = frozenset(p.name for p in PROPERTIES if p.required)
