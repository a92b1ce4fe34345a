"""Sinks that record what they are handed, or fail."""

from __future__ import annotations

from se_exporter.sidecar.sinks import DocumentChange, Sink


class RecordingSink(Sink):
    name = "recording"

    def __init__(self) -> None:
        self.changes: list[DocumentChange] = []

    def on_change(self, change: DocumentChange) -> None:
        self.changes.append(change)


class BrokenSink(RecordingSink):
    name = "broken"

    def on_change(self, change: DocumentChange) -> None:
        raise RuntimeError("boom")
