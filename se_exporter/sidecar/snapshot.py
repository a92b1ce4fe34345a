"""What the sidecar believes right now, and its one owner.

The poll loop replaces the snapshot after each poll, the identity watcher when the compute metadata arrives, and
scrapes and ``/readyz`` read it. ``CurrentState`` owns it: every change is a read-modify-write under its lock (or
the identity watcher and the poll loop would undo each other's change), and readers take the whole frozen value
without a lock, so a scrape never waits for a poll.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from se_exporter.core.lifecycle import EventRecord
from se_exporter.core.model import VmIdentity


@dataclass(frozen=True)
class Snapshot:
    """What the exporter believes right now; replaced whole by the poll loop, read by scrapes."""

    records: Mapping[str, EventRecord] = field(default_factory=dict)
    incarnation: int | None = None
    up: bool = False
    has_document: bool = False
    last_success: float | None = None
    watching_since: float | None = None  # since when IMDS has been read with no long gap (core/watch.py)
    vm_name: str | None = None
    identity: VmIdentity | None = None
    api_version: str = ""


class CurrentState:
    """The one owner of the snapshot: ``get`` for readers, ``update`` for the two writers."""

    def __init__(self, initial: Snapshot) -> None:
        self._lock = threading.Lock()
        self._snapshot = initial

    def get(self) -> Snapshot:
        return self._snapshot

    def update(self, **changes: Any) -> Snapshot:
        """Replace fields of the snapshot atomically; returns the new one."""
        with self._lock:
            self._snapshot = replace(self._snapshot, **changes)
            return self._snapshot
