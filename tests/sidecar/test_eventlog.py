"""The log sink's levels: this VM's maintenance warns, a neighbour's is information."""

from __future__ import annotations

import json
import logging

import pytest

from se_exporter.core.lifecycle import diff
from se_exporter.core.model import parse_document
from se_exporter.sidecar.sinks import DocumentChange
from se_exporter.sidecar.sinks.eventlog import LogSink

BODY = json.dumps({"DocumentIncarnation": 3, "Events": [
    {"EventId": "MINE", "EventType": "Reboot", "EventStatus": "Scheduled", "Resources": ["vm0"],
     "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT", "EventSource": "Platform"},
    {"EventId": "THEIRS", "EventType": "Reboot", "EventStatus": "Started", "Resources": ["vm1"],
     "NotBefore": "", "EventSource": "Platform"},
    {"EventId": "WHOSE", "EventType": "Reboot", "EventStatus": "Scheduled", "Resources": [],
     "NotBefore": "", "EventSource": "Platform"}]}).encode()


def test_a_neighbours_event_is_logged_at_info_and_this_vms_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    """An availability set lists every VM's events on each VM: only those that list this VM (or cannot be told
    apart) warn; a neighbour's Reboot, even Started, is logged at info."""
    document = parse_document(BODY)
    step = diff({}, document, 1_000.0)
    with caplog.at_level(logging.INFO, logger="se_exporter.events"):
        LogSink().on_change(DocumentChange(BODY, document, step.transitions, step.records, 1_000.0, "vm0", None, ""))
    levels = {record.getMessage().split()[1]: record.levelname for record in caplog.records}
    assert levels == {"MINE": "WARNING", "THEIRS": "INFO", "WHOSE": "WARNING"}
