"""Parsing every documented document shape, and refusing what is not a document."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest

from se_exporter.errors import InvalidDocument
from se_exporter.model import ScheduledEvent, affects_vm, parse_document, parse_not_before

APR_11 = datetime(2022, 4, 11, 22, 26, 58, tzinfo=timezone.utc)

# The docs' live-migration example (2020-07-01), incarnation 2.
DOCS_SCHEDULED = {
    "DocumentIncarnation": 2,
    "Events": [{
        "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
        "EventStatus": "Scheduled",
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": ["WestNO_0", "WestNO_1"],
        "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
        "Description": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
        "EventSource": "Platform",
        "DurationInSeconds": 5,
    }],
}


def _one(doc: dict[str, object]) -> ScheduledEvent:
    document = parse_document(json.dumps(doc).encode())
    assert len(document.events) == 1
    return document.events[0]


def test_parses_the_documented_2020_07_01_example() -> None:
    """Every field of the docs' example lands in its typed field."""
    document = parse_document(json.dumps(DOCS_SCHEDULED).encode())
    assert document.incarnation == 2
    assert document.warnings == ()
    event = document.events[0]
    assert event == ScheduledEvent(
        event_id="C7061BAC-AFDC-4513-B24B-AA5F13A16123", event_type="Freeze", event_status="Scheduled",
        resource_type="VirtualMachine", resources=("WestNO_0", "WestNO_1"), not_before=APR_11,
        description="Virtual machine is being paused because of a memory-preserving Live Migration operation.",
        event_source="Platform", duration_seconds=5)


@pytest.mark.parametrize(("version", "event", "incarnation", "expected"), [
    ("2017-03-01 preview: ISO NotBefore, string incarnation, underscored names",
     {"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Reboot", "ResourceType": "VirtualMachine",
      "Resources": ["_FrontEnd_IN_0"], "EventStatus": "Scheduled", "NotBefore": "2016-09-19T18:29:47Z"},
     "5", {"incarnation": 5, "not_before": datetime(2016, 9, 19, 18, 29, 47, tzinfo=timezone.utc),
           "description": None, "event_source": None, "duration_seconds": None}),
    ("2017-08-01: RFC 1123, no Description",
     {"EventId": "a", "EventType": "Redeploy", "ResourceType": "VirtualMachine", "Resources": ["vm1"],
      "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"},
     3, {"incarnation": 3, "not_before": datetime(2016, 9, 19, 18, 29, 47, tzinfo=timezone.utc),
         "description": None}),
    ("2017-11-01: Preempt",
     {"EventId": "b", "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["spot"],
      "EventStatus": "Scheduled", "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT"},
     1, {"event_type": "Preempt", "not_before": APR_11}),
    ("2019-01-01: Terminate",
     {"EventId": "c", "EventType": "Terminate", "ResourceType": "VirtualMachine", "Resources": ["myScaleSet_3"],
      "EventStatus": "Scheduled", "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT"},
     1, {"event_type": "Terminate"}),
    ("2019-04-01: +Description",
     {"EventId": "d", "EventType": "Reboot", "ResourceType": "VirtualMachine", "Resources": ["vm"],
      "EventStatus": "Scheduled", "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT", "Description": "Host update"},
     1, {"description": "Host update", "event_source": None}),
    ("2019-08-01: +EventSource",
     {"EventId": "e", "EventType": "Reboot", "ResourceType": "VirtualMachine", "Resources": ["vm"],
      "EventStatus": "Scheduled", "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT", "Description": "",
      "EventSource": "User"},
     1, {"event_source": "User", "duration_seconds": None}),
    ("2020-07-01: +DurationInSeconds -1 and Started with empty NotBefore",
     {"EventId": "f", "EventType": "Freeze", "ResourceType": "VirtualMachine", "Resources": ["vm"],
      "EventStatus": "Started", "NotBefore": "", "Description": "", "EventSource": "Platform",
      "DurationInSeconds": -1},
     9, {"duration_seconds": -1, "not_before": None, "event_status": "Started"}),
])
def test_parses_every_api_version_shape(version: str, event: dict[str, object], incarnation: object,
                                        expected: dict[str, object]) -> None:
    """Each documented api-version shape parses without warnings into the expected values."""
    document = parse_document(json.dumps({"DocumentIncarnation": incarnation, "Events": [event]}).encode())
    assert document.warnings == (), version
    parsed = document.events[0]
    for key, wanted in expected.items():
        actual = document.incarnation if key == "incarnation" else getattr(parsed, key)
        assert actual == wanted, f"{version}: {key}"


@pytest.mark.parametrize("event_type", ["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "LiveMigrate"])
def test_every_event_type_is_kept_including_unknown_ones(event_type: str) -> None:
    """Documented and future EventType values are kept as they are, without warnings."""
    event = _one({"DocumentIncarnation": 1, "Events": [{**DOCS_SCHEDULED["Events"][0], "EventType": event_type}]})
    assert event.event_type == event_type


def test_extra_fields_are_kept_and_never_fatal() -> None:
    """Fields Azure may add later are kept in ``extra`` on the event and the document."""
    raw = {"DocumentIncarnation": 1, "Future": {"x": 1},
           "Events": [{**DOCS_SCHEDULED["Events"][0], "Impact": "low", "Zones": [1, 2]}]}
    document = parse_document(json.dumps(raw).encode())
    assert document.extra == {"Future": {"x": 1}}
    assert document.events[0].extra == {"Impact": "low", "Zones": [1, 2]}
    assert document.warnings == ()


@pytest.mark.parametrize(("field", "bad", "attribute", "fallback"), [
    ("DurationInSeconds", "soon", "duration_seconds", None),
    ("DurationInSeconds", True, "duration_seconds", None),
    ("NotBefore", "next tuesday", "not_before", None),
    ("NotBefore", 1649716018, "not_before", None),
    ("Resources", "WestNO_0", "resources", ()),
    ("Description", ["a"], "description", None),
    ("EventType", None, "event_type", "unknown"),
    ("EventStatus", 3, "event_status", "unknown"),
])
def test_wrong_types_in_optional_fields_become_warnings(field: str, bad: object, attribute: str,
                                                        fallback: object) -> None:
    """A wrongly typed field is replaced by its fallback and named in a warning; the event survives."""
    raw = {"DocumentIncarnation": 1, "Events": [{**DOCS_SCHEDULED["Events"][0], field: bad}]}
    document = parse_document(json.dumps(raw).encode())
    assert getattr(document.events[0], attribute) == fallback
    assert any(field in warning for warning in document.warnings)


def test_numeric_strings_are_accepted_for_incarnation_and_duration() -> None:
    """'5' is as good as 5 where the docs' examples used strings."""
    raw = {"DocumentIncarnation": "12", "Events": [{**DOCS_SCHEDULED["Events"][0], "DurationInSeconds": "9"}]}
    document = parse_document(json.dumps(raw).encode())
    assert (document.incarnation, document.events[0].duration_seconds, document.warnings) == (12, 9, ())


def test_duplicate_event_ids_keep_the_first_and_warn() -> None:
    """Two entries with one EventId cannot both be tracked; the first wins, visibly."""
    first = DOCS_SCHEDULED["Events"][0]
    raw = {"DocumentIncarnation": 1, "Events": [first, {**first, "EventStatus": "Started"}]}
    document = parse_document(json.dumps(raw).encode())
    assert [e.event_status for e in document.events] == ["Scheduled"]
    assert "duplicate EventId" in document.warnings[0]


@pytest.mark.parametrize(("body", "reason"), [
    (b"", "empty"),
    (b"   ", "empty"),
    (b"<html><body>Please sign in</body></html>", "not JSON"),
    (b'{"DocumentIncarnation": 7, "Events": [{"EventId": "', "not JSON"),
    (b"[]", "JSON array, not an object"),
    (b"null", "JSON null"),
    (b'{"DocumentIncarnation": 1}', "'Events' is missing"),
    (b'{"DocumentIncarnation": 1, "Events": "none"}', "'Events' is a JSON string"),
    (b'{"Events": [42]}', "Events[0] is a JSON number"),
    (b'{"Events": [{"EventType": "Reboot"}]}', "no usable EventId"),
    (b'{"Events": [{"EventId": ""}]}', "no usable EventId"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
])
def test_what_is_not_a_document_is_refused_with_a_reason(body: bytes, reason: str) -> None:
    """Anything but an object with an Events list of identifiable events is an InvalidDocument saying why."""
    with pytest.raises(InvalidDocument, match=re.escape(reason)):
        parse_document(body)


def test_a_missing_incarnation_is_tolerated() -> None:
    """The lifecycle does not need the incarnation, so its absence is no reason to drop events."""
    assert parse_document(b'{"Events": []}').incarnation is None


def test_utf8_bom_is_accepted() -> None:
    """Some Windows tooling writes a BOM; it is not a reason to lose a document."""
    assert parse_document(b"\xef\xbb\xbf" + json.dumps(DOCS_SCHEDULED).encode()).incarnation == 2


@pytest.mark.parametrize(("text", "expected"), [
    ("Mon, 11 Apr 2022 22:26:58 GMT", APR_11),
    ("2022-04-11T22:26:58Z", APR_11),
    ("2022-04-11T22:26:58", APR_11),
    ("2022-04-12T00:26:58+02:00", APR_11),
    ("", None),
    ("  ", None),
])
def test_not_before_formats(text: str, expected: datetime | None) -> None:
    """RFC 1123, ISO 8601 (with or without zone) and empty all parse to aware UTC or None."""
    assert parse_not_before(text) == expected


@pytest.mark.parametrize(("resources", "vm_name", "expected"), [
    (("WestNO_0", "WestNO_1"), "WestNO_0", "true"),
    (("WestNO_0", "WestNO_1"), "westno_1", "true"),
    (("_FrontEnd_IN_0",), "FrontEnd_IN_0", "true"),
    (("WestNO_1",), "WestNO_0", "false"),
    (("WestNO_1",), None, "unknown"),
    ((), "WestNO_0", "unknown"),
])
def test_affects_this_vm(resources: tuple[str, ...], vm_name: str | None, expected: str) -> None:
    """Own name listed in Resources (case-insensitive, preview underscore ignored) decides affects_this_vm."""
    event = ScheduledEvent(event_id="x", event_type="Reboot", event_status="Scheduled", resources=resources)
    assert affects_vm(event, vm_name) == expected
