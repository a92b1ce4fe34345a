"""The forwarded message: the exact bytes IMDS returned, plus properties that say where and when.

Every forwarding sink (Event Hubs, the JSON-lines file) sends the same envelope. ``sequence`` is
monotonic per installation and survives restarts (``Sequencer`` keeps it in ``--state-dir``);
``message_id`` is fixed when the document is accepted, so a resend after a timeout carries the
same id and consumers can drop the duplicate.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from se_exporter import __version__
from se_exporter.errors import ConfigError
from se_exporter.files import write_atomically
from se_exporter.sinks import DocumentChange

CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class Envelope:
    sequence: int
    message_id: str
    partition_key: str
    properties: Mapping[str, str | int]
    body: bytes
    observed_at: float

    def header(self) -> dict[str, object]:
        """Everything but the body, as JSON-ready values."""
        return {"sequence": self.sequence, "message_id": self.message_id, "partition_key": self.partition_key,
                "content_type": CONTENT_TYPE, "properties": dict(self.properties), "observed_at": self.observed_at}


def rfc3339_millis(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build(change: DocumentChange, sequence: int, installation_id: str) -> Envelope:
    identity = change.identity
    vm_name = change.vm_name or (identity.name if identity else "")
    vm_id = identity.vm_id if identity else ""
    properties: dict[str, str | int] = {
        "vm_name": vm_name,
        "vm_id": vm_id,
        "vmss_name": identity.vmss_name if identity else "",
        "subscription_id": identity.subscription_id if identity else "",
        "resource_group": identity.resource_group if identity else "",
        "location": identity.location if identity else "",
        "observed_at": rfc3339_millis(change.observed_at),
        "api_version": change.api_version,
        "exporter_version": __version__,
        "sequence": sequence,
    }
    if change.document.incarnation is not None:
        properties["document_incarnation"] = change.document.incarnation
    return Envelope(sequence=sequence, message_id=f"{installation_id}:{sequence}",
                    partition_key=vm_id or vm_name or "unknown", properties=properties, body=change.raw,
                    observed_at=change.observed_at)


class Sequencer:
    """Hands out sequence numbers that never repeat for this installation, across restarts.

    The state file is rewritten atomically (temp file, fsync, rename) before a number is used.
    """

    def __init__(self, state_dir: Path) -> None:
        self._path = state_dir / "forwarding.json"
        self._lock = threading.Lock()
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            data = json.loads(self._path.read_text()) if self._path.exists() else {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--state-dir {state_dir}: cannot use it ({exc})") from None
        self.installation_id = str(data.get("installation_id") or uuid.uuid4())
        self._next = int(data.get("next_sequence", 1))
        self._save()

    def next(self) -> int:
        with self._lock:
            value = self._next
            self._next += 1
            self._save()
            return value

    def advance_past(self, sequence: int) -> None:
        """Never hand out a number at or below one already spooled (a state file lost or restored)."""
        with self._lock:
            if sequence >= self._next:
                self._next = sequence + 1
                self._save()

    def _save(self) -> None:
        write_atomically(self._path, json.dumps({"installation_id": self.installation_id,
                                                 "next_sequence": self._next}).encode())
