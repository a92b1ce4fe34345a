"""Reading the platform stream: Event Grid's copy of a scheduled event recognised by content, read, and refused
with a clear reason when it is hostile."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from typing import Any

import pytest

from se_exporter.fleet.message import InvalidMessage, read_message
from se_exporter.fleet.platform.reader import (
    PLATFORM_INVALID_REASONS,
    PlatformBounds,
    PlatformMessage,
    looks_like_platform,
    read_platform,
)
from tests.fleet.platform_helpers import EVENT_ID, KEY, MAX, SPEC_EXAMPLE, SUB, T0, body, cloud, grid, spec_event

FORWARDED = (b'{"DocumentIncarnation": 2, "Events": [{"EventId": "E1", "EventType": "Freeze", "ResourceType": '
             b'"VirtualMachine", "Resources": ["web_3"], "EventStatus": "Scheduled", "NotBefore": "", '
             b'"EventSource": "Platform", "DurationInSeconds": 5, "Description": "eventType specversion"}]}')


def read(obj: object, **kwargs: Any) -> PlatformMessage:
    found = read_platform(obj if isinstance(obj, bytes) else body(obj), MAX, 42.0, **kwargs)
    assert found is not None
    return found


def refused(obj: object, reason: str = "invalid_platform_event", **kwargs: Any) -> str:
    with pytest.raises(InvalidMessage) as caught:
        read_platform(obj if isinstance(obj, bytes) else body(obj), MAX, 42.0, **kwargs)
    assert caught.value.reason == reason
    return str(caught.value)


def test_the_specs_example_is_read_with_every_field() -> None:
    """The spec's Event Grid example gives its EventId, status, scope, place, times and VMs."""
    message = read(SPEC_EXAMPLE)
    [event] = message.events
    assert (event.grid_id, event.event_id, event.key) == ("5b0b1c8e-6f3d-4b52-9a57-0c1d2e3f4a5b", EVENT_ID, KEY)
    assert (event.event_type, event.event_status, event.event_source, event.resource_type) == (
        "Reboot", "Completed", "Platform", "VirtualMachine")
    assert event.resources == ("web_3", "web_7")
    assert (event.scope_type, event.scope_name, event.subscription_id, event.resource_group, event.location) == (
        "scale_set", "web", SUB, "rg", "westeurope")
    expected = datetime(2026, 5, 4, 10, 15, 2, tzinfo=timezone.utc).timestamp() + 0.1234567
    assert event.event_time == pytest.approx(expected, abs=1e-6)
    assert (event.not_before, event.duration_seconds, event.description, event.schema) == (
        None, -1.0, "Host maintenance.", "eventgrid")
    assert (message.skipped, message.warnings, message.bounds) == ((), (), ())


def test_a_single_object_reads_as_an_array_of_one() -> None:
    """Event Grid may stop wrapping its events in an array: a bare object is read the same."""
    assert read(spec_event()).events == read(SPEC_EXAMPLE).events


def test_cloudevents_schema_carries_the_same_event() -> None:
    """A subscription delivering CloudEvents 1.0 gives the same event, its time from ``time``."""
    grid_event = read(SPEC_EXAMPLE).events[0]
    cloud_event = read([cloud(spec_event())]).events[0]
    assert cloud_event.schema == "cloudevents"
    assert {**vars_of(cloud_event), "schema": "eventgrid"} == vars_of(grid_event)


def vars_of(event: object) -> dict[str, Any]:
    return {name: getattr(event, name) for name in event.__slots__}  # type: ignore[attr-defined]


def test_cloudevents_data_base64_holding_json_is_read_other_content_is_refused() -> None:
    """Binary data of a JSON content type is decoded; other content or broken base64 is refused with the reason."""
    event = cloud(spec_event())
    data = event.pop("data")
    event["data_base64"] = base64.b64encode(json.dumps(data).encode()).decode()
    assert read(event).events[0].event_id == EVENT_ID
    assert "not JSON" in refused({**event, "datacontenttype": "text/plain"})
    assert "not base64" in refused({**event, "data_base64": "%%%not base64"})
    assert "not base64" in refused({**event, "data_base64": base64.b64encode(b"[1, 2]").decode()})
    assert "not base64" in refused({**event, "data_base64": 17})


def test_scheduled_status_carries_not_before_and_the_time_keeps_its_offset() -> None:
    """NotBefore in RFC 1123 and an eventTime with an offset and seven fractional digits become unix times."""
    event = grid("Scheduled")
    event["eventTime"] = "2026-05-04T12:15:02.1234567+02:00"
    [read_event] = read([event]).events
    assert read_event.not_before == datetime(2050, 9, 19, 18, 29, 47, tzinfo=timezone.utc).timestamp()
    assert read_event.event_time == pytest.approx(
        datetime(2026, 5, 4, 10, 15, 2, tzinfo=timezone.utc).timestamp() + 0.1234567, abs=1e-6)


@pytest.mark.parametrize("value", [None, "yesterday", "1999-12-31T23:59:59Z", "2300-01-01T00:00:00Z", 17])
def test_a_missing_or_unreadable_event_time_is_the_enqueue_time_with_a_warning(value: object) -> None:
    """eventTime dates a status; without a usable one the time Event Hubs enqueued it stands in, said aloud."""
    event = grid()
    event["eventTime"] = value
    message = read([event])
    assert message.events[0].event_time == 42.0
    assert any("eventTime" in line for line in message.warnings)


@pytest.mark.parametrize(("kind", "scope"), [
    ("virtualMachineScaleSets", "scale_set"), ("availabilitySets", "availability_set"),
    ("VIRTUALMACHINES", "virtual_machine"), ("dedicatedHosts", "unknown")])
def test_the_scope_is_the_arm_resource_of_resource_info_id(kind: str, scope: str) -> None:
    """resourceInfo.id names the scale set, availability set or VM the event was published for."""
    event = grid()
    info = event["data"]["resourceInfo"]
    info["id"] = info["id"].replace("virtualMachineScaleSets/web", f"{kind}/place")
    [read_event] = read([event]).events
    assert (read_event.scope_type, read_event.scope_name) == (scope, "place")


def test_a_vms_own_event_without_resources_concerns_that_vm() -> None:
    """For a single VM's event, an empty Resources list means the VM itself."""
    event = grid(resources=[])
    info = event["data"]["resourceInfo"]
    info["id"] = info["id"].replace("virtualMachineScaleSets/web", "virtualMachines/db1")
    assert read([event]).events[0].resources == ("db1",)


def test_the_subject_stands_in_for_a_missing_resource_info_id_and_neither_is_refused() -> None:
    """The subject holds the same ARM id; an event with neither cannot be joined to VMs and is refused."""
    event = grid()
    del event["data"]["resourceInfo"]["id"]
    assert read([event]).events[0].scope_name == "web"
    event["subject"] = "/somewhere/else"
    assert "ARM id" in refused([event])


@pytest.mark.parametrize(("sent", "status"), [
    ("Scheduled", "Scheduled"), ("started", "Started"), ("COMPLETED", "Completed"), ("Canceled", "Canceled"),
    ("Cancelled", "Canceled")])
def test_statuses_are_read_without_regard_to_case(sent: str, status: str) -> None:
    """The four documented statuses, however spelt in case (and Cancelled as Azure spells it elsewhere)."""
    assert read([grid(sent)]).events[0].event_status == status


@pytest.mark.parametrize("status", ["Done", "", 3, None])
def test_a_status_that_cannot_be_ordered_is_refused(status: object) -> None:
    """Statuses only move forward, so one of no known rank cannot be applied."""
    assert "EventStatus" in refused([grid(EventStatus=status)])


def test_other_event_grid_and_cloudevents_types_are_counted_as_other_event_type() -> None:
    """A foreign Event Grid event (a blob created, say) on the same hub is refused as other_event_type."""
    foreign = {**spec_event(), "eventType": "Microsoft.Storage.BlobCreated"}
    assert "Microsoft.Storage.BlobCreated" in refused([foreign], "other_event_type")
    assert "other_event_type" in PLATFORM_INVALID_REASONS
    refused({**cloud(spec_event()), "type": "Microsoft.Resources.ResourceWriteSuccess"}, "other_event_type")
    refused({**spec_event(), "eventType": ["list"]}, "other_event_type")


def test_the_type_is_recognised_by_its_ending_whatever_the_case() -> None:
    """Only the ending MaintenanceResources.ScheduledEventEmitted is required, as the issue says."""
    event = {**spec_event(), "eventType": "Contoso.Preview.maintenanceresources.SCHEDULEDEVENTEMITTED"}
    assert read([event]).events[0].event_id == EVENT_ID


@pytest.mark.parametrize("raw", [FORWARDED, b"not json", b"[1, 2]", b"[]", b'{"Events": []}', b"\xff\xfe[",
                                 b'[{"eventType": "x"}, 3]', b'"eventType"'])
def test_what_is_not_an_event_grid_event_is_left_to_the_forwarded_document_reader(raw: bytes) -> None:
    """A sidecar's document (even one mentioning the envelope keys in a string) or garbage is not a platform
    message: None, and message.read_message says what it is."""
    assert read_platform(raw, MAX, 0.0) is None


def test_the_first_look_tells_a_sidecars_document_from_event_grids() -> None:
    """looks_like_platform is a cheap sniff: an array or an object naming an envelope key."""
    assert looks_like_platform(SPEC_EXAMPLE)
    assert looks_like_platform(body(cloud(spec_event())))
    assert not looks_like_platform(b'{"DocumentIncarnation": 1, "Events": []}')


def test_an_oversized_body_is_refused_before_it_is_parsed() -> None:
    """The byte cap comes first: a body past it is too_large, whether or not it is JSON."""
    with pytest.raises(InvalidMessage) as caught:
        read_platform(b"[" * 2000, 1000, 0.0)
    assert caught.value.reason == "too_large"


def test_deeply_nested_or_many_containered_bodies_are_never_parsed() -> None:
    """Past the container bound (which bounds depth) nothing is parsed: an array is refused as a platform message,
    an object left to the sidecar reader, which refuses it too."""
    deep = body({**grid(), "x": 0}).replace(b'"x": 0', b'"x": ' + b'{"x": ' * 2000 + b"{}" + b"}" * 2000)
    assert "more than 1024" in refused(b"[" + deep + b"]")
    assert read_platform(deep, MAX, 0.0) is None
    with pytest.raises(InvalidMessage):
        read_message(deep, {}, None, None, 0.0, MAX)
    assert "nested too deeply" in refused(b"[" * 100_000 + b"]" * 100_000, "not_json",
                                          bounds=PlatformBounds(containers=10**6))
    refused(b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize(("change", "word"), [
    ({"data": []}, "'data'"), ({"data": {"resourceInfo": "x"}}, "'resourceInfo'"),
    ({"data": {"resourceInfo": {"properties": 5}}}, "'properties'"), ({"id": 5}, "'id'"), ({"id": " "}, "'id'")])
def test_wrong_types_in_the_envelope_are_refused_naming_the_field(change: dict[str, Any], word: str) -> None:
    """A platform event whose structure is wrong is refused, and the line says which field."""
    assert word in refused([{**spec_event(), **change}])


@pytest.mark.parametrize(("props", "word"), [
    ({"EventId": 7}, "EventId"), ({"EventId": ""}, "EventId"), ({"EventId": "x" * 300}, "EventId"),
    ({"Resources": "web_3"}, "Resources")])
def test_wrong_types_in_the_event_are_refused_naming_the_field(props: dict[str, Any], word: str) -> None:
    """No EventId, an overlong one, or Resources that is not a list: refused with the field named."""
    assert word in refused([grid(**props)])


def test_optional_fields_of_the_wrong_type_are_left_out_with_warnings() -> None:
    """EventType, EventSource, NotBefore, DurationInSeconds of a wrong type lose only themselves."""
    message = read([grid(EventType=5, EventSource=["x"], NotBefore=3, DurationInSeconds="long",
                         Description="d" * 5000, Resources=["web_3", 7, None, "", "v" * 300])])
    [event] = message.events
    assert (event.event_type, event.event_source, event.not_before, event.duration_seconds) == (
        "unknown", "unknown", None, None)
    assert event.description == "" and event.resources == ("web_3",)
    assert len(message.warnings) == 6


@pytest.mark.parametrize("literal", [b"1" * 5000, b"-" + b"9" * 30, b"1e400", b"NaN", b"Infinity", b"1.5",
                                     b"9223372036854775808"])
def test_huge_or_odd_numbers_never_become_a_duration(literal: bytes) -> None:
    """Integers past 64 bits (even past Python's int-string limit), infinities and NaN are left out, not fatal."""
    raw = body([grid()]).replace(b'"DurationInSeconds": -1', b'"DurationInSeconds": ' + literal)
    message = read(raw)
    assert message.events[0].duration_seconds is None
    assert any("DurationInSeconds" in line for line in message.warnings)


def test_a_huge_integer_elsewhere_costs_nothing() -> None:
    """An unknown field holding a 10,000-digit integer is parsed as a marker, never as a number."""
    assert read(body([{**spec_event(), "extra": 0}]).replace(b'"extra": 0', b'"extra": ' + b"7" * 10_000)).events


def test_lone_surrogates_and_control_characters_are_spelt_out() -> None:
    """Strings kept are encodable and printable: a lone surrogate and NUL become visible text."""
    raw = body([grid(event_id="E\ud800\x00", resources=["web\x1b3"])])
    [event] = read(raw).events
    assert event.event_id == "E\\ud800\\x00"
    assert event.resources == ("web\\x1b3",)
    event.event_id.encode()


def test_many_events_in_one_message_are_read_up_to_the_bound_and_the_bound_is_said() -> None:
    """An array of 100 events gives the first 16 and names the bound reached."""
    message = read([grid(event_id=f"E{i}") for i in range(100)])
    assert [event.event_id for event in message.events] == [f"E{i}" for i in range(16)]
    assert message.bounds == ("platform_events_per_message",)


def test_resources_are_bounded_and_deduplicated() -> None:
    """Thousands of VM names keep the first ``resources_per_event`` distinct ones and name the bound; a name
    repeated in another case is the same VM."""
    message = read([grid(resources=[f"web_{i % 3000}" for i in range(6000)])])
    assert len(message.events[0].resources) == 1000
    assert message.bounds == ("platform_resources_per_event",)
    assert read([grid(resources=["Web_3", "web_3", "WEB_3", "web_7"])]).events[0].resources == ("Web_3", "web_7")


def test_a_mixed_array_reads_its_platform_events_and_lists_what_it_skipped() -> None:
    """One foreign and one broken event beside a good one: the good one is read, the others skipped with reasons."""
    foreign = {**spec_event(), "eventType": "Microsoft.Storage.BlobCreated"}
    message = read([foreign, grid(EventId=None), grid()])
    assert [event.event_id for event in message.events] == [EVENT_ID]
    assert [reason for reason, _line in message.skipped] == ["other_event_type", "invalid_platform_event"]
    assert message.skipped[0][1].startswith("event [0]")


def test_an_array_of_only_bad_events_is_refused_with_the_first_reason() -> None:
    """No platform event to apply: refused, the line says how many more were bad."""
    assert "and 1 more" in refused([grid(EventId=None), grid(EventStatus="?")])


def test_reading_never_raises_anything_but_invalid_message() -> None:
    """A table of hostile shapes: each ends in a message, None, or InvalidMessage."""
    shapes: list[object] = [
        [{**spec_event(), "data": {"resourceInfo": {"id": 5, "properties": {"EventId": "E", "EventStatus": "Started",
                                                                           "Resources": [[]]}}}}],
        [{**spec_event(), "eventTime": "2026-13-45T99:99:99Z"}],
        [{**spec_event(), "eventTime": "9" * 70}],
        [{"specversion": "1.0", "type": spec_event()["eventType"]}],
        [{"eventType": spec_event()["eventType"], "data": None, "id": "x"}],
        [grid(NotBefore="Mon, 99 Foo 2050 18:29:47 GMT")],
        [grid(NotBefore="0001-01-01T00:00:00")],
        [grid(EventType="\ud800" * 10_000)],
    ]
    for shape in shapes:
        try:
            read_platform(body(shape), MAX, T0)
        except InvalidMessage as exc:
            assert exc.reason in PLATFORM_INVALID_REASONS



@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59", "0000-01-01T00:00:00Z",
                                   "10000-01-01T00:00:00Z", "-2026-01-01T00:00:00Z", "2026-05-04T10:15:02+99:99"])
def test_absurd_event_times_are_the_enqueue_time_with_a_warning(value: str) -> None:
    """Year 0, 1 or 9999 with an offset (once an OverflowError), year 10000, negative years and offsets past 23:59
    are not times from 2000 to 2199: the enqueue time stands in, said aloud."""
    event = grid()
    event["eventTime"] = value
    message = read([event])
    assert message.events[0].event_time == 42.0
    assert any("eventTime" in line for line in message.warnings)


@pytest.mark.parametrize("value", ["Mon, 01 Jan 0001 00:00:00 GMT", "Sat, 01 Jan 0000 00:00:00 GMT",
                                   "Mon, 19 Sep 50 18:29:47 GMT"])
def test_a_not_before_of_a_year_below_100_is_not_read_as_this_century(value: str) -> None:
    """email.utils reads the year 0001 as 2001: the year read must be the year written, or NotBefore is left out
    (give or take one: 23:30 on New Year's Eve at -01:00 is New Year's Day in UTC)."""
    message = read([grid(NotBefore=value)])
    assert message.events[0].not_before is None
    assert any("NotBefore" in line for line in message.warnings)
    [event] = read([grid(NotBefore="2049-12-31T23:30:00-01:00")]).events
    assert event.not_before == datetime(2050, 1, 1, 0, 30, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("literal", [b"1" * 5000, b"NaN", b"-Infinity"])
def test_a_huge_number_where_a_string_or_object_belongs_is_named_as_a_number(literal: bytes) -> None:
    """The refusal says a JSON huge number, not the reader's internal marker type."""
    raw = body([grid()]).replace(f'"EventId": "{EVENT_ID}"'.encode(), b'"EventId": ' + literal)
    line = refused(raw)
    assert "a JSON huge number" in line and "OutOfRangeNumber" not in line
    line = refused(body([{**spec_event(), "data": 0}]).replace(b'"data": 0', b'"data": ' + literal))
    assert "a JSON huge number" in line


def _vm_scoped() -> dict[str, Any]:
    event = grid(resources=[])
    info = event["data"]["resourceInfo"]
    info["id"] = event["subject"] = info["id"].replace("virtualMachineScaleSets/web", "virtualMachines/web_7")
    return event


def _without(name: str) -> dict[str, Any]:
    event = grid()
    del event["data"]["resourceInfo"]["properties"][name]
    return event


USUAL = [grid(status) for status in ("Scheduled", "Started", "Completed", "Canceled")] + [
    grid(resources=["web_1", "WEB_1", "web_2"]), grid(Description=""), grid(EventType=""), _without("Description"),
    _without("NotBefore"), _without("DurationInSeconds"), _without("Resources"), _vm_scoped(), spec_event()]


@pytest.mark.parametrize("event", USUAL)
def test_the_usual_shapes_of_an_event_are_read_without_a_warning(event: dict[str, Any]) -> None:
    """An event as Event Grid sends it today (a field left out where Azure may leave it out) is read whole: no
    warning, no bound reached."""
    message = read([event])
    assert len(message.events) == 1 and not message.warnings and not message.bounds and not message.skipped


def test_cloudevents_data_base64_with_a_utf8_byte_order_mark_is_read() -> None:
    """JSON data in base64 that starts with a UTF-8 BOM is read as the JSON after it."""
    event = cloud(grid())
    data = event.pop("data")
    event["data_base64"] = base64.b64encode(b"\xef\xbb\xbf" + json.dumps(data).encode()).decode()
    [read_event] = read(event).events
    assert read_event.key == KEY and read_event.schema == "cloudevents"


@pytest.mark.parametrize("raw", [SPEC_EXAMPLE[:-40], b'[{"eventType": "x"', b"[" + "é".encode("latin-1") + b"]"])
def test_an_array_cut_short_or_not_utf8_is_not_json_not_a_missing_envelope(raw: bytes) -> None:
    """An array that does not parse (a truncated Event Grid message) is counted as not_json, saying so, rather than
    as a sidecar document lacking its envelope: no sidecar document is an array."""
    with pytest.raises(InvalidMessage) as caught:
        read_platform(raw, MAX, 0.0)
    assert caught.value.reason == "not_json" and "not UTF-8 JSON" in str(caught.value)


@pytest.mark.parametrize("kind", ["Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted",
                                  "Microsoft.Maintenance.ScheduledEvents.ScheduledEventEmitted",
                                  "microsoft.maintenance/scheduledevents/write",
                                  "Microsoft.Maintenance/ScheduledEvents/Write"])
@pytest.mark.parametrize("schema", ["eventgrid", "cloudevents"])
def test_both_documented_names_of_the_stream_are_read(kind: str, schema: str) -> None:
    """Azure's documents name the topic and the event type two ways each: every one is read as a platform event,
    in either schema, with the fields of the spec's example."""
    event = {**spec_event(), "eventType": kind}
    if "write" in kind.casefold():
        event["topic"] = f"/subscriptions/{SUB}/providers/Microsoft.Maintenance.ScheduledEvents"
    sent = cloud(event) if schema == "cloudevents" else event
    [read_event] = read([sent]).events
    assert (read_event.event_id, read_event.event_status, read_event.resources) == (EVENT_ID, "Completed",
                                                                                    ("web_3", "web_7"))


def test_a_write_type_of_another_resource_is_another_event_type() -> None:
    """Only the scheduled events' write: another resource provider's write is not a platform event."""
    assert "microsoft.compute/virtualmachines/write" in refused(
        [{**spec_event(), "eventType": "microsoft.compute/virtualmachines/write"}], "other_event_type")
