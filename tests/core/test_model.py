"""Parsing every documented document shape, and refusing what is not a document."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from se_exporter.core.errors import InvalidDocument
from se_exporter.core.model import (
    EVENT_STATUSES,
    EventMemo,
    EventStatus,
    ScheduledEvent,
    affects_label,
    affects_vm,
    parse_document,
    parse_not_before,
)

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


_ANY = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False),
                 st.sampled_from(["", " ", "Reboot", "soon", "\ud800"]),
                 st.lists(st.one_of(st.text(max_size=3), st.integers()), max_size=3))
_VALID = {"EventId": st.sampled_from(["E", " a ", "B7"]), "EventType": st.sampled_from(["Freeze", "LiveMigrate"]),
          "EventStatus": st.sampled_from(["Scheduled", "Started"]),
          "ResourceType": st.sampled_from(["VirtualMachine", None]), "Resources": st.lists(st.text(max_size=3)),
          "NotBefore": st.sampled_from(["", " ", "Mon, 11 Apr 2022 22:26:58 GMT", "2016-09-19T18:29:47Z", "later"]),
          "Description": st.sampled_from(["", None, "x"]), "EventSource": st.sampled_from(["Platform", None]),
          "DurationInSeconds": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))}


def _outcome(body: bytes, memo: EventMemo) -> object:
    """The events' fields and the warnings parse_document makes of ``body`` with ``memo``, or its refusal."""
    try:
        document = parse_document(body, memo)
    except InvalidDocument as exc:
        return str(exc)
    return [vars(event) for event in document.events], document.warnings


@settings(max_examples=300, deadline=None, database=None)
@given(st.fixed_dictionaries(_VALID), st.dictionaries(st.sampled_from(list(_VALID)), _ANY, max_size=2),
       st.dictionaries(st.sampled_from(list(_VALID)), _ANY, max_size=2), st.booleans())
def test_a_document_read_after_another_is_read_as_if_alone(valid: dict[str, object], first: dict[str, object],
                                                           second: dict[str, object], twice: bool) -> None:
    """Whatever the document read before (the same event, or one differing in any field by any value, 1 against
    1.0 and true included), parsing builds exactly the events and warnings it builds with nothing remembered: the
    memo of the last document's events changes no result."""
    before = json.dumps({"Events": [{**valid, **first}]}).encode()
    body = json.dumps({"Events": [{**valid, **second}] * (2 if twice else 1)}).encode()
    alone = _outcome(body, EventMemo())
    memo = EventMemo()
    _outcome(before, memo)
    assert _outcome(body, memo) == alone


def test_an_unchanged_event_is_handed_out_again() -> None:
    """An event listed unchanged in the next document is the very object read before (what lets the lifecycle
    diff keep its record by identity); a changed one, or one whose duration turns from 5 into 5.0, is read afresh."""
    event = DOCS_SCHEDULED["Events"][0]
    memo = EventMemo()
    first = parse_document(json.dumps({"Events": [event]}).encode(), memo).events[0]
    again = parse_document(json.dumps({"DocumentIncarnation": 2, "Events": [event]}).encode(), memo).events[0]
    assert again is first
    changed = parse_document(json.dumps({"Events": [{**event, "EventStatus": "Started"}]}).encode(), memo).events[0]
    assert changed is not first and changed.event_status == "Started"
    for number, twin in ((5, 5.0), (1, True), (0, False), (0, -0.0)):  # equal in Python, not the same JSON
        alone = _outcome(json.dumps({"Events": [{**event, "DurationInSeconds": twin}]}).encode(), EventMemo())
        memo = EventMemo()
        _outcome(json.dumps({"Events": [{**event, "DurationInSeconds": number}]}).encode(), memo)
        assert _outcome(json.dumps({"Events": [{**event, "DurationInSeconds": twin}]}).encode(), memo) == alone, twin


def test_a_document_parsed_without_a_memo_is_not_answered_from_memory() -> None:
    """Parsing without a memo neither reads nor changes another parse's memory."""
    event = dict(DOCS_SCHEDULED["Events"][0])
    memo = EventMemo()
    parsed = parse_document(json.dumps({"Events": [event]}).encode(), memo).events[0]
    remembered = dict(memo.last)
    assert parse_document(json.dumps({"Events": [event]}).encode()).events[0] is not parsed
    assert memo.last == remembered


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
    (("WestNO_0", "WestNO_1"), "WestNO_0", True),
    (("WestNO_0", "WestNO_1"), "westno_1", True),
    (("_FrontEnd_IN_0",), "FrontEnd_IN_0", True),
    (("WestNO_1",), "WestNO_0", False),
    (("WestNO_1",), None, None),
    ((), "WestNO_0", None),
])
def test_affects_this_vm(resources: tuple[str, ...], vm_name: str | None, expected: bool | None) -> None:
    """Own name listed in Resources (case-insensitive, preview underscore ignored) decides affects_this_vm."""
    event = ScheduledEvent(event_id="x", event_type="Reboot", event_status="Scheduled", resources=resources)
    assert affects_vm(event, vm_name) is expected


HUGE = "9" * 5000  # past Python's int-string limit (4,300 digits)


@pytest.mark.parametrize("incarnation", [
    f'{HUGE}', f'"{HUGE}"', f'-{HUGE}', str(2**63), str(-(2**63) - 1), "1" + "0" * 400, '"' + "1" * 65 + '"',
], ids=["5,000 digits", "5,000 digits as a string", "-5,000 digits", "2**63", "-2**63-1", "400 digits",
        "65-digit string"])
def test_an_incarnation_no_output_can_carry_is_a_warning(incarnation: str) -> None:
    """A DocumentIncarnation beyond 64 bits, or longer than Python will read, is ignored with a warning; the
    events are read as usual (never a ValueError out of the parser)."""
    body = ('{"DocumentIncarnation": ' + incarnation + ', "Events": [{"EventId": "E1", "EventType": "Freeze", '
            '"EventStatus": "Scheduled"}]}').encode()
    document = parse_document(body)
    assert document.incarnation is None
    assert [event.event_id for event in document.events] == ["E1"]
    assert len(document.warnings) == 1 and "DocumentIncarnation" in document.warnings[0]
    assert len(document.warnings[0]) < 200  # a snippet, not 5,000 digits


def test_64_bit_integers_are_kept() -> None:
    """The edges of the signed 64-bit range are valid incarnations and durations."""
    for number in (2**63 - 1, -(2**63)):
        document = parse_document(json.dumps({"DocumentIncarnation": number, "Events": [
            {"EventId": "E1", "DurationInSeconds": number}]}).encode())
        assert document.incarnation == number and document.events[0].duration_seconds == number


@pytest.mark.parametrize("duration", [HUGE, f'"{HUGE}"', str(2**64), "1e400", "-1e400", "1.5"])
def test_a_duration_no_output_can_carry_is_a_warning(duration: str) -> None:
    """DurationInSeconds too large for 64 bits (or infinite, or fractional) becomes absent with a warning."""
    body = ('{"Events": [{"EventId": "E1", "DurationInSeconds": ' + duration + "}]}").encode()
    document = parse_document(body)
    assert document.events[0].duration_seconds is None
    assert any("DurationInSeconds" in warning for warning in document.warnings)


def test_a_huge_number_anywhere_else_is_tolerated() -> None:
    """A 5,000-digit number in Resources or an unknown field costs that value, not the document."""
    body = ('{"Events": [{"EventId": "E1", "EventType": "Freeze", "EventStatus": "Scheduled", '
            f'"Resources": ["vm0", {HUGE}], "Zones": {HUGE}}}], "Other": {HUGE}}}').encode()
    document = parse_document(body)
    assert document.events[0].resources == ("vm0",)
    assert document.warnings == ("Events[0]: Resources has 1 non-string entries; ignored",)


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"Events": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"Events": [], "x": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}",
], ids=["array", "inside Events", "object in an unknown field"])
def test_deep_nesting_is_an_invalid_document(body: bytes) -> None:
    """JSON nested 50,000-100,000 deep (RecursionError in the decoder) is an invalid document with a reason."""
    with pytest.raises(InvalidDocument, match="nested too deeply"):
        parse_document(body)


@pytest.mark.parametrize("field", ["EventId", "EventType", "EventStatus", "ResourceType", "Description",
                                   "EventSource"])
def test_a_lone_surrogate_is_written_out_and_warned(field: str) -> None:
    """'\\ud800' is a valid JSON escape that no UTF-8 encoder accepts: every string the model hands out is encodable,
    with the surrogate spelt out as text, and the document carries one warning saying so."""
    event = {"EventId": "E1", field: "LLLL-\\ud800"}
    body = json.dumps(event).replace("\\\\ud800", "\\ud800")  # the escape itself, not an escaped backslash
    document = parse_document(('{"Events": [' + body + "]}").encode())
    value = getattr(document.events[0], {"EventId": "event_id", "EventType": "event_type",
                                         "EventStatus": "event_status", "ResourceType": "resource_type",
                                         "Description": "description", "EventSource": "event_source"}[field])
    assert value == "LLLL-\\ud800"
    value.encode("utf-8")
    assert document.warnings[0].startswith("1 strings held unpaired UTF-16 surrogates")


def test_surrogates_in_keys_and_resources_and_pairs() -> None:
    """Keys, list items and low surrogates are written out too; a proper surrogate pair is a character, left alone."""
    body = rb'{"Events": [{"EventId": "E\udc00", "Resources": ["vm\ud83d\ude00", "x\udfff"], "k\ud800": 1}]}'
    document = parse_document(body)
    event = document.events[0]
    assert event.event_id == "E\\udc00"
    assert event.resources == ("vm\U0001f600", "x\\udfff")
    assert "k\\ud800" in event.extra
    assert document.warnings[0].startswith("3 strings held")


def test_a_str_body_with_raw_surrogates_is_handled_too() -> None:
    """Callers that pass text (not bytes) get the same guarantee."""
    document = parse_document('{"Events": [{"EventId": "E\ud800"}]}')
    assert document.events[0].event_id == "E\\ud800"


def test_event_ids_differing_only_in_case_are_duplicates() -> None:
    """EventIds are GUIDs: 'ABC' and 'abc' (or ' abc ') in one document are the same event; the first is kept."""
    document = parse_document(json.dumps({"Events": [
        {"EventId": "ABC-1", "EventType": "Freeze", "EventStatus": "Scheduled"},
        {"EventId": " abc-1 ", "EventType": "Reboot", "EventStatus": "Scheduled"}]}).encode())
    assert [(e.event_id, e.event_type, e.key) for e in document.events] == [("ABC-1", "Freeze", "abc-1")]
    assert document.warnings == ("Events[1]: duplicate EventId ' abc-1 ' ignored",)


HOSTILE = [
    b'{"Events": [{"EventId": "E1", "NotBefore": "Mon, 11 Apr 99999999999 22:26:58 GMT"}]}',
    b'{"Events": [{"EventId": "E1", "NotBefore": "9999-12-31T23:59:59-23:59"}]}',
    b'{"Events": [{"EventId": "E1", "NotBefore": "0001-01-01T00:00:00+23:59"}]}',
    b'{"Events": [{"EventId": "E1", "NotBefore": "' + b"1" * 100_000 + b'"}]}',
    b'{"Events": [{"EventId": "E1", "DurationInSeconds": 1e309, "Resources": [1e999, -1e999]}]}',
    b'{"Events": [{"EventId": "E1", "DurationInSeconds": NaN}], "DocumentIncarnation": Infinity}',
    b'{"Events": [{"EventId": "\\u0000\\u001b[31m\\n"}], "DocumentIncarnation": -0}',
    b'{"Events": [{"EventId": "E1"}], "Events": "twice"}',
    b'{"DocumentIncarnation": ' + b"9" * 5000 + b', "Events": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"DocumentIncarnation": ' + b"9" * 5000 + b', "Events": [}',
    b'\xef\xbb\xbf\xef\xbb\xbf{"Events": []}',
    b'{"Events": [' + b'{"EventId": "E"},' * 10_000 + b'{"EventId": "F"}]}',
]


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_bodies_end_in_a_document_or_an_invalid_document(body: bytes) -> None:
    """Whatever a body does to the parser, the result is a Document (whose strings all encode) or InvalidDocument."""
    try:
        document = parse_document(body)
    except InvalidDocument:
        return
    for event in document.events:
        for text in (event.event_id, event.event_type, event.event_status, *event.resources):
            text.encode("utf-8")


def test_an_escaped_backslash_before_a_pair_is_not_mistaken_for_the_pair() -> None:
    """'\\\\ud83d\\ude00' is a backslash, the text 'ud83d', then a lone low surrogate: it is found and written out."""
    document = parse_document(rb'{"Events": [{"EventId": "A\\ud83d\ude00"}]}')
    assert document.events[0].event_id == "A\\ud83d\\ude00"
    document.events[0].event_id.encode("utf-8")


@pytest.mark.parametrize(("affects", "label"), [(True, "true"), (False, "false"), (None, "unknown")])
def test_affects_label(affects: bool | None, label: str) -> None:
    """The affects_this_vm label and log field say true, false or unknown for what affects_vm decided."""
    assert affects_label(affects) == label


def test_event_status_reads_as_the_documented_value() -> None:
    """EventStatus members are the strings IMDS sends, so they compare equal to a parsed event's status."""
    assert EVENT_STATUSES == ("Scheduled", "Started")
    assert f"{EventStatus.STARTED}" == "Started" == EventStatus.STARTED
