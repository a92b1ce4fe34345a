"""Forwarding targets: one that refuses until it is opened, one that collects everything."""

from __future__ import annotations

import errno
import os
import threading

from se_exporter.sidecar.forwarding.envelope import Envelope


class Refusing:
    """A target on a full disk until ``open`` is set; records what it accepted."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.open = threading.Event()
        self.accepted: list[int] = []

    def accept(self, envelope: Envelope) -> None:
        if not self.open.is_set():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.accepted.append(envelope.sequence)

    def close(self, timeout: float) -> None:
        return None


class Collecting:
    name = "collecting"

    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []
        self._lock = threading.Lock()

    def accept(self, envelope: Envelope) -> None:
        with self._lock:
            self.envelopes.append(envelope)

    def close(self, timeout: float) -> None:
        """Nothing to release."""

    def heartbeats(self) -> list[Envelope]:
        with self._lock:
            return [e for e in self.envelopes if e.properties.get("heartbeat") is True]
