"""Log lines, text and JSON: every record is one line, whatever the values from IMDS hold (log injection)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from se_exporter.core.lifecycle import diff
from se_exporter.core.model import parse_document
from se_exporter.infra.logs import JsonFormatter, TextFormatter, escape, fields
from se_exporter.sidecar.sinks import DocumentChange
from se_exporter.sidecar.sinks.eventlog import LogSink

# A newline, a fake timestamp and level, ANSI colour, a C1 CSI, a Unicode line separator, a bidi override and a
# lone surrogate: the EventId, a resource name and the description each try to forge or disguise a record.
FORGED = "\n2026-11-22T02:55:46.262Z critical \x1b[31mdisk on fire\x1b[0m\r\x9b2J\u2028\u202e"
BODY = json.dumps({"DocumentIncarnation": 9, "Events": [{
    "EventId": "E1" + FORGED, "EventType": "Freeze\nReboot", "EventStatus": "Scheduled",
    "Resources": ["vm0" + FORGED], "Description": FORGED, "EventSource": "Platform"}]}).replace(
    '"Platform"', '"Plat\\ud800form"').encode()
UNSAFE = ("\n", "\r", "\x1b", "\x9b", "\u2028", "\u202e")


@pytest.fixture(params=["text", "json"])
def captured(request: pytest.FixtureRequest) -> Iterator[tuple[str, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if request.param == "json" else TextFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield request.param, stream
    root.removeHandler(handler)
    root.setLevel(level)


def test_a_transition_is_one_line_whatever_the_event_holds(captured: tuple[str, io.StringIO]) -> None:
    """The issue's forged EventId (newline, fake timestamp and 'critical', ANSI escape) and friends: one record is
    one line, with no raw control character, separator or bidi override left; JSON lines still parse, and carry
    the values intact."""
    fmt, stream = captured
    document = parse_document(BODY)
    step = diff({}, document, 1_000.0)
    change = DocumentChange(BODY, document, step.transitions, step.records, 1_000.0, "vm0" + FORGED, None, "")
    LogSink().on_change(change)
    output = stream.getvalue()
    lines = output.splitlines()
    assert len(lines) == 1, output
    assert not any(char in lines[0] for char in UNSAFE)
    if fmt == "json":
        record = json.loads(lines[0])
        assert record["event_id"] == "E1" + FORGED and record["resources"] == ["vm0" + FORGED]
        assert record["message"] == f"Freeze\nReboot E1{FORGED} scheduled"
    else:
        assert lines[0].split(" ", 2)[1] == "warning"
        escaped = "E1\\n2026-11-22T02:55:46.262Z critical \\x1b[31mdisk on fire\\x1b[0m\\r\\x9b2J\\u2028\\u202e"
        assert escaped in lines[0]


def test_a_message_from_imds_in_any_record_is_escaped(captured: tuple[str, io.StringIO]) -> None:
    """Not only the log sink: any message or field (a reason phrase, a Location header) is escaped by the formatter."""
    fmt, stream = captured
    logging.getLogger("se_exporter").warning("IMDS poll failed: %s", "HTTP 500 oops\ncritical", extra=fields(
        url="http://x/\x1b[2J", odd='a "quoted" value', plain="ok", number=3))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "\x1b" not in lines[0]
    if fmt == "text":
        assert lines[0].endswith('url="http://x/\\u001b[2J" odd="a \\"quoted\\" value" plain=ok number=3')
    else:
        assert json.loads(lines[0])["url"] == "http://x/\x1b[2J"


def test_a_traceback_cannot_pass_for_a_record(captured: tuple[str, io.StringIO]) -> None:
    """An exception message holding a forged line: in text, every traceback line is indented and escaped; in JSON,
    the traceback is one string."""
    fmt, stream = captured
    try:
        raise ValueError("boom" + FORGED)
    except ValueError:
        logging.getLogger("se_exporter").exception("sink failed")
    lines = stream.getvalue().splitlines()
    if fmt == "json":
        assert len(lines) == 1 and "disk on fire" in json.loads(lines[0])["exception"]
    else:
        assert lines[0].endswith("sink failed")
        assert all(line.startswith("    ") for line in lines[1:]) and len(lines) > 2
        assert not any(char in "".join(lines) for char in UNSAFE)


def test_escape_keeps_ordinary_text() -> None:
    """Printable text, accents and emoji are left as they are; only the unsafe characters change."""
    assert escape("Café ☕ Freeze E1 scheduled") == "Café ☕ Freeze E1 scheduled"
    assert escape("a\tb\x00c\x7f") == "a\\tb\\x00c\\x7f"
