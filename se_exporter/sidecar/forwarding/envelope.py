"""The forwarded message: the exact bytes IMDS returned, plus properties that say where and when.

Every forwarding sink (Event Hubs, the JSON-lines file) sends the same envelope; its fields are docs/forwarding.md's.

Property values are made carriable here, once for every target: an integer outside the 32-bit signed range becomes
its decimal digits as a string (the Event Hubs SDK encodes a Python ``int`` as an AMQP ``int`` and raises on
anything wider, so a ``DocumentIncarnation`` of 2**70 would otherwise stop the document), and a string that cannot
be UTF-8 (a lone surrogate from a JSON escape) is backslash-escaped. The body is never touched.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from se_exporter import __version__
from se_exporter.core.errors import StateDirError
from se_exporter.core.lifecycle import CANCELED, COMPLETED
from se_exporter.core.model import VmIdentity, json_kind, vm_name
from se_exporter.infra.files import StateFile, read_state_file
from se_exporter.sidecar.sinks import DocumentChange, ImdsHealth
from se_exporter.sidecar.sinks.facts import bounded

log = logging.getLogger("se_exporter.forward")
CONTENT_TYPE = "application/json"
STATE_FILE = "forwarding.json"
INT32 = range(-(2**31), 2**31)
MAX_SEQUENCE = 2**53  # exact in every JSON reader, JavaScript's included
MAX_PAUSED = 16  # events in the pauses property: an EventId is at most facts.MAX_CHARS characters
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


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


def carriable(value: str | int) -> str | int:
    """A property value every target can carry: see the module docstring."""
    if isinstance(value, int):
        return value if value in INT32 else str(value)
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def build(change: DocumentChange, sequence: int, installation_id: str, imds: ImdsHealth | None = None) -> Envelope:
    """The envelope of ``change``. ``imds`` is the VM's IMDS health for a heartbeat; a change is itself a
    successful read at ``observed_at``, so it is what a change carries when ``imds`` is not given."""
    last_success = imds.last_success if imds is not None and imds.last_success is not None else change.observed_at
    failing = imds.failing if imds is not None else False
    identity = change.identity or VmIdentity()  # not read (yet): every field empty
    name = vm_name(change.vm_name, identity) or ""
    properties: dict[str, str | int] = {
        "vm_name": name,
        "vm_id": identity.vm_id,
        "vmss_name": identity.vmss_name,
        "subscription_id": identity.subscription_id,
        "resource_group": identity.resource_group,
        "location": identity.location,
        "observed_at": rfc3339_millis(change.observed_at),
        "api_version": change.api_version,
        "exporter_version": __version__,
        "sequence": sequence,
        "imds_last_success": rfc3339_millis(last_success),
        "imds_failing": failing,
    }
    properties.update(_optional(change))
    return Envelope(sequence=sequence, message_id=f"{installation_id}:{sequence}",
                    partition_key=str(carriable(identity.vm_id or name or "unknown")),
                    properties={name: carriable(value) for name, value in properties.items()}, body=change.raw,
                    observed_at=change.observed_at)


def _optional(change: DocumentChange) -> dict[str, str | int]:
    """The properties a change carries only when it has them: its document's incarnation, the pauses felt."""
    optional: dict[str, str | int] = {"pauses": pauses(change)}
    if change.document.incarnation is not None:
        optional["document_incarnation"] = change.document.incarnation
    return {name: value for name, value in optional.items() if value != ""}


def pauses(change: DocumentChange) -> str:
    """The ``pauses`` property: each listed or just ended event's longest and total pause (``core/pause.py``),
    those that paused longest first, at most MAX_PAUSED; empty when none paused."""
    ended = (t.record for t in change.transitions if t.kind in (COMPLETED, CANCELED))
    paused = sorted((r for r in (*change.records.values(), *ended) if r.paused_seconds > 0),
                    key=lambda r: (-r.longest_pause, r.event.event_id))[:MAX_PAUSED]
    if not paused:
        return ""
    return json.dumps({bounded(r.event.event_id): {"type": bounded(r.event.event_type),
                                                   "longest": round(r.longest_pause, 3),
                                                   "total": round(r.paused_seconds, 3)} for r in paused},
                      separators=(",", ":"))


class Sequencer:
    """Hands out sequence numbers that never repeat for this installation, across restarts: how, also through a
    full or damaged state file, is docs/forwarding.md's "Sequence numbers never go back" (the caller raises the floor
    past the spool and the forward file: ``advance_past``)."""

    def __init__(self, state_dir: Path) -> None:
        self._path = state_dir / STATE_FILE
        self._lock = threading.Lock()
        self._file = StateFile(self._path, log, "cannot save %s: %s; sequence numbers go on in memory and are "
                               "recovered from the spool and the forward file after a restart", "%s saved again")
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateDirError(state_dir, f"cannot use it ({exc.strerror or exc})") from None
        try:
            text = read_state_file(self._path) if self._path.exists() else None
        except OSError as exc:
            raise StateDirError(state_dir, f"cannot read {self._path} ({exc.strerror or exc})") from None
        self.installation_id, self._next = self._parse(text)
        self._save()

    def _parse(self, text: bytes | None) -> tuple[str, int]:
        if text is None:
            return str(uuid.uuid4()), 1
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {json_kind(data)}, not an object")
            installation_id, next_sequence = data.get("installation_id"), data.get("next_sequence")
            if not isinstance(installation_id, str) or not _UUID.match(installation_id):
                raise ValueError(f"installation_id {installation_id!r} is not a UUID")
            if type(next_sequence) is not int or not 1 <= next_sequence < MAX_SEQUENCE:
                raise ValueError(f"next_sequence {str(next_sequence)[:40]!r} is not an integer from 1 to 2**53")
        except (ValueError, RecursionError) as exc:
            fresh = str(uuid.uuid4())
            log.warning("ignoring the damaged forwarding state file %s (%s): new installation id %s, so message ids "
                        "cannot repeat; sequence numbers continue above the spool's and the forward file's",
                        self._path, str(exc)[:200], fresh)
            return fresh, 1
        return installation_id, next_sequence

    def next(self) -> int:
        with self._lock:
            value = self._next
            self._next += 1
            self._save()
            return value

    def advance_past(self, sequence: int) -> None:
        """Never hand out a number at or below one already spooled or written (a state file lost or stale)."""
        with self._lock:
            if sequence >= self._next:
                self._next = sequence + 1
                self._save()

    def _save(self) -> None:
        self._file.save(json.dumps({"installation_id": self.installation_id, "next_sequence": self._next}).encode())
