"""Documents, changes and envelopes as the sinks receive them, built without IMDS."""

from __future__ import annotations

from se_exporter.core.lifecycle import diff
from se_exporter.core.model import VmIdentity, parse_document
from se_exporter.sidecar.forwarding.envelope import Envelope
from se_exporter.sidecar.sinks import DocumentChange

RAW = b'{\r\n  "DocumentIncarnation": 3,\r\n  "Events": [ ]\r\n}'
IDENTITY = VmIdentity(name="WestNO_0", vm_id="02aab8a4-74ef-476e-8182-f6d2ba4166a6", vmss_name="",
                      location="norwayeast", resource_group="rg", subscription_id="sub")


def change(raw: bytes = RAW, identity: VmIdentity | None = IDENTITY,
           vm_name: str | None = "WestNO_0") -> DocumentChange:
    """The change the poll loop hands the sinks for the document ``raw``, as its first document."""
    document = parse_document(raw)
    return DocumentChange(raw, document, (), diff({}, document, 0).records, 1_795_316_668.0245, vm_name, identity,
                          "2020-07-01")


def envelope(sequence: int, body: bytes = RAW, key: str = "vm") -> Envelope:
    """An envelope with the given sequence (message id ``id:<sequence>``, observed at 1000 + sequence)."""
    return Envelope(sequence, f"id:{sequence}", key, {"sequence": sequence}, body, 1000.0 + sequence)
