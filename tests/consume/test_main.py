"""What `se-exporter consume` prints for one event: the record (bytes decoded) and the timeline line."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from azure.eventhub import EventData

from se_exporter.consume.main import dumps, json_line, plain, record, refused, timeline_line
from se_exporter.core.errors import ConfigError
from se_exporter.infra import logs
from se_exporter.infra.options import starting_position

FREEZE = (b'{"DocumentIncarnation": 3, "Events": [{"EventId": "E1", "EventType": "Freeze", "ResourceType": '
          b'"VirtualMachine", "Resources": ["vm-1"], "EventStatus": "Scheduled", "NotBefore": '
          b'"Mon, 19 Sep 2016 18:29:47 GMT", "Description": "", "EventSource": "Platform", "DurationInSeconds": 5}]}')


def test_a_record_decodes_byte_properties_and_the_timeline_names_the_event() -> None:
    """Byte property keys and values (AMQP binary) are printed as text; the timeline shows the event for its VM."""
    event = EventData(FREEZE)
    event.properties = {b"vm_name": b"vm-1", "sequence": 7, "observed_at": "2016-09-19T18:00:00Z"}
    item = record("0", event)
    assert item["properties"] == {"vm_name": "vm-1", "sequence": 7, "observed_at": "2016-09-19T18:00:00Z"}
    assert item["partition_id"] == "0" and item["body"] == FREEZE.decode()
    line = timeline_line(item)
    assert line.startswith("2016-09-19T18:00:00Z vm-1 #7 incarnation 3: Freeze E1 Scheduled")
    assert line.endswith("(this VM)")


def test_a_body_that_is_not_a_document_is_one_readable_line() -> None:
    """An invalid body does not stop consume: its line says why."""
    event = EventData(b"not json")
    event.properties = {"vm_name": "vm-2", "sequence": 1, "observed_at": "t"}
    assert timeline_line(record("1", event)).startswith("t vm-2 #1 invalid document:")


def test_starting_positions() -> None:
    """earliest, latest and an ISO 8601 time are what the SDK takes; anything else names the flag."""
    assert starting_position("earliest") == "-1"
    assert starting_position("latest") == "@latest"
    assert starting_position("2026-01-02T03:04:05Z") == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with pytest.raises(ConfigError, match="--starting-position"):
        starting_position("yesterday")


def test_a_body_that_is_not_utf8_is_printed_with_replacement_characters() -> None:
    """Another producer's body that is not UTF-8 is one line with U+FFFD, not an error that stops the reading."""
    item = record("0", EventData(b'\xff{"Events": []}'))
    assert item["body"] == '\ufffd{"Events": []}'
    assert "invalid document" in timeline_line(item)


def test_a_vm_name_property_of_another_type_is_shown_as_text() -> None:
    """A vm_name property that is an AMQP int (another producer's) names the VM in the timeline, not a crash."""
    event = EventData(FREEZE)
    event.properties = {"vm_name": 5, "sequence": 1, "observed_at": "t"}
    assert timeline_line(record("0", event)).startswith("t 5 #1 incarnation 3: Freeze E1 Scheduled")


def test_non_finite_float_properties_keep_the_json_output_strict() -> None:
    """AMQP doubles NaN and Infinity are printed as text: every --format json line is strict JSON."""
    event = EventData(FREEZE)
    event.properties = {"nan": float("nan"), "inf": float("inf"), "weight": Decimal("1.23"), "plain": 1.5}
    line = json_line(record("0", event))
    properties = json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))["properties"]
    assert properties == {"nan": "nan", "inf": "inf", "weight": "1.23", "plain": 1.5}


HOSTILE_NAME = "vm-1\x1b]0;owned\x07\x1b[2J\n2016-09-19T18:00:00Z vm-9 #1 incarnation 1: no events"


def test_a_hostile_message_prints_one_visibly_escaped_timeline_line() -> None:
    """A vm_name holding ESC/BEL sequences and a newline, and an EventId holding ``\\x1b[2J``, print one line with
    every control character spelt out as log lines spell it: no terminal title, no clearing, no forged line."""
    body = FREEZE.replace(b'"E1"', b'"E1\\u001b[2J"')
    event = EventData(body)
    event.properties = {"vm_name": HOSTILE_NAME, "sequence": 7, "observed_at": "2016-09-19T18:00:00Z\x9b31m"}
    line = timeline_line(record("0", event))

    assert "\n" not in line and not any(char in line for char in "\x1b\x07\x9b")
    assert line.startswith("2016-09-19T18:00:00Z\\x9b31m vm-1\\x1b]0;owned\\x07\\x1b[2J\\n2016-09-19T18:00:00Z vm-9 ")
    assert "incarnation 3: Freeze E1\\x1b[2J Scheduled" in line
    assert line == logs.escape(line)  # nothing left that the log lines' rule would escape


def test_a_hostile_message_prints_one_json_line_with_its_text_made_visible() -> None:
    """The same message as --format json is one line of strict JSON: json escapes the C0 controls, and the C1
    controls, line separators and bidi overrides it leaves raw are escaped as log lines' JSON is; the values read
    back are the message's own."""
    event = EventData(FREEZE)
    event.properties = {"vm_name": HOSTILE_NAME + "\u2028\u202e\x9b"}
    line = json_line(record("0", event))

    assert "\n" not in line and not any(char in line for char in "\x1b\x07\x9b\u2028\u202e")
    assert json.loads(line)["properties"]["vm_name"] == HOSTILE_NAME + "\u2028\u202e\x9b"


def strict(line: str) -> object:
    """``line`` read as strict JSON: a bare NaN or Infinity fails the test."""
    return json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))


def test_a_map_with_a_binary_key_and_a_list_holding_nan_print_one_strict_json_line() -> None:
    """A property that is a map with binary (and numeric, null) keys, or a list holding NaN, at any depth, is one
    strict JSON line: binary keys as text, NaN as ``nan``, and no value lost where two keys read the same."""
    event = EventData(FREEZE)
    event.properties = {b"m": {b"k": b"v", 1: [float("nan"), float("-inf")], None: {b"x": 1, "x": 2}},
                        "l": [1.5, float("nan"), [b"\xff"]]}
    line = json_line(record("0", event))
    assert strict(line)["properties"] == {  # type: ignore[index]
        "m": {"k": "v", "1": ["nan", "-inf"], "null": {"x": 1, "x (2)": 2}}, "l": [1.5, "nan", ["\ufffd"]]}
    assert "incarnation 3: Freeze E1 Scheduled" in timeline_line(record("0", event))


def test_a_value_nested_as_deep_as_the_sdk_decodes_prints_without_exhausting_the_stack() -> None:
    """A list nested 5,000 deep (the SDK decodes nearly 1,000 levels; json's encoder recurses once per level) is one
    line of strict JSON, through --format json and the timeline."""
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    event = EventData(FREEZE)
    event.properties = {"vm_name": deep, "deep": {b"k": deep}}
    item = record("0", event)
    line = json_line(item)
    assert line.count("[" * 5000 + "1" + "]" * 5000) == 2 and "\n" not in line
    assert line.endswith(", \"body\": " + json.dumps(FREEZE.decode()) + "}")
    assert " #? incarnation 3: Freeze E1" in timeline_line(item)


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, {"b": None, "c": True}], "d": "x\"y\u2028\u00e9", "e": [], "f": {}}, [], "text", 0, -7.25, None])
def test_dumps_writes_what_json_dumps_writes(value: object) -> None:
    """The encoder that does not recurse writes json.dumps's own text for every JSON value."""
    assert dumps(plain(value)) == json.dumps(value, ensure_ascii=False)


def test_an_error_the_sdk_reports_is_one_line_and_a_stolen_link_names_the_consumer_group() -> None:
    """A receiver refused by another with an owner level says which consumer group and what to give instead; any
    other error is its first line, its secrets redacted."""
    stolen = ConnectionError("a receiver with a higher owner level is already open\nError condition: amqp:link:stolen")
    line = refused("Event Hub 'telemetry'", "$Default", "3", stolen)
    assert line.startswith("consume could not read partition 3 of Event Hub 'telemetry': another reader holds "
                           "consumer group '$Default'") and line.endswith("--consumer-group NAME")
    other = refused("Event Hub 'telemetry'", "$Default", None, OSError("refused SharedAccessKey=abc\nsecond line"))
    assert other == "consume could not read Event Hub 'telemetry': refused SharedAccessKey=<redacted>"
