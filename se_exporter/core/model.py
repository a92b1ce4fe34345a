"""Scheduled Events documents as frozen values, parsed from every documented api-version shape.

What parsing tolerates, what it refuses (the caller then keeps its previous state) and why ``event_key`` ignores
case: docs/architecture.md ("Every api-version" to "EventIds are GUIDs"). Whatever the body holds, parsing ends in
a ``Document`` or an ``InvalidDocument``, never another exception.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from enum import Enum
from typing import Any, ClassVar

from se_exporter.core.errors import InvalidDocument

# The documented types, in the order the api-versions added them; SpotRebalanceRecommendation comes with 2024-07-09
# (``core/apiversion.py`` says which version lists which type).
SPOT_REBALANCE = "SpotRebalanceRecommendation"
PREEMPT = "Preempt"
EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", SPOT_REBALANCE)


class EventStatus(str, Enum):
    """The documented ``EventStatus`` values. ``ScheduledEvent.event_status`` stays the string IMDS sent: an
    undocumented status is shown as it is, not refused."""

    SCHEDULED = "Scheduled"
    STARTED = "Started"

    def __str__(self) -> str:  # the value in f-strings, labels and log fields, as on every Python version
        return self.value


EVENT_STATUSES = tuple(status.value for status in EventStatus)
STATUS_STARTED = EventStatus.STARTED.value  # a plain str for hot paths: an Enum class attribute lookup costs ~90 ns

_KNOWN_DOCUMENT_FIELDS = frozenset({"DocumentIncarnation", "Events"})
_INTEGER = re.compile(r"^\s*-?\d+\s*$")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# A JSON escape of a UTF-16 surrogate (\uD800-\uDFFF): only such an escape can put an unpaired one into a decoded
# string (the UTF-8 decoder refuses encoded surrogates), so a body without one skips the walk below. It also
# matches a proper pair (json joins those into one character) and an escaped backslash before "u": the walk then
# finds nothing to do. (Telling pairs apart here is not worth it: the JSON text \\ud83d\ude00 holds a lone low one.)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def event_key(event_id: str) -> str:
    """What identifies an event: the EventId without surrounding blanks, lower-cased (a GUID's case means
    nothing). One lifecycle, one trace and one set of series per key, however IMDS spells it this time."""
    return event_id.strip().lower()


@dataclass(frozen=True)
class ScheduledEvent:
    """One entry of ``Events``; field names follow the Azure documents. Each field but ``extra`` and ``key`` has its
    row in ``EVENT_FIELDS`` (how it is read, written back and which api-version lists it)."""

    event_id: str
    event_type: str
    event_status: str
    resource_type: str | None = None
    resources: tuple[str, ...] = ()
    not_before: datetime | None = None
    description: str | None = None
    event_source: str | None = None
    duration_seconds: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # event_key(event_id): given by the parser, worked out here otherwise (not a cached_property: on Python 3.11 its
    # lock costs a microsecond per event, and the key is read on every diff and scrape)
    key: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", event_key(self.event_id))

    @property
    def started(self) -> bool:
        return self.event_status == STATUS_STARTED


@dataclass(frozen=True)
class Document:
    """A whole Scheduled Events answer. ``warnings`` lists what was tolerated while parsing."""

    incarnation: int | None
    events: tuple[ScheduledEvent, ...]
    warnings: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


def parse_document(body: bytes | str, memo: EventMemo | None = None) -> Document:
    """Parse the raw bytes IMDS returned; raise ``InvalidDocument`` with a reason a person can act on. With a
    ``memo`` (the poller's), events unchanged since the last document read with it are handed out again."""
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InvalidDocument(f"body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    else:
        text = body
    if not text or text.isspace():  # (not text.strip(): that copies the whole body)
        raise InvalidDocument("body is empty")
    try:
        try:
            obj = json.loads(text)
        except ValueError as exc:
            if isinstance(exc, json.JSONDecodeError):
                raise
            # An integer literal past Python's int-string limit: read again (only then), marking such numbers.
            obj = json.loads(text, parse_int=_integer_literal)
    except json.JSONDecodeError as exc:
        raise InvalidDocument(f"body is not JSON: {_snippet(text)!r} ({exc})") from None
    except RecursionError:
        raise InvalidDocument("body is JSON nested too deeply to read") from None
    escaped = 0
    # A backslash first: one memchr over the body, where looking for the two characters "\\u" costs about a fifth of
    # json.loads on a 1,000-event body.
    if ("\\" in text and _SURROGATE_ESCAPE.search(text)) or (not isinstance(body, bytes) and _SURROGATE.search(text)):
        escaped = _escape_surrogates(obj)
    try:
        document = _read_document(obj, memo)
    except InvalidDocument:
        raise
    except Exception as exc:  # whatever a body does to the parser is that body's fault: an invalid document
        raise InvalidDocument(f"document could not be read ({type(exc).__name__}: {_snippet(str(exc))})") from None
    if escaped:
        note = (f"{escaped} strings held unpaired UTF-16 surrogates (\\ud800-\\udfff); "
                "shown with each written out as text")
        document = Document(incarnation=document.incarnation, events=document.events,
                            warnings=(note, *document.warnings), extra=document.extra)
    return document


def _read_document(obj: object, memo: EventMemo | None) -> Document:
    """A Document from decoded JSON; with a ``memo``, for JSON nobody else holds (parse_document's own), the events are
    also remembered for the next such read and taken from the last one (``EventMemo``)."""
    if not isinstance(obj, dict):
        raise InvalidDocument(f"document is a JSON {json_kind(obj)}, not an object")
    raw_events = obj.get("Events")
    if not isinstance(raw_events, list):
        what = "missing" if "Events" not in obj else f"a JSON {json_kind(raw_events)}"
        raise InvalidDocument(f"'Events' is {what}, not a list")
    warnings: list[str] = []
    incarnation = _incarnation(obj.get("DocumentIncarnation"), warnings)
    events: list[ScheduledEvent] = []
    seen: set[str] = set()
    known = memo.last if memo is not None else {}
    read: dict[str, tuple[dict[str, Any], ScheduledEvent]] = {}  # what the next read may take from this one
    for index, raw in enumerate(raw_events):
        event = _known_event(raw, known, read) if known else None
        if event is None:
            told = len(warnings)
            event = _event(raw, index, warnings)
            if memo is not None and len(warnings) == told and not event.extra:
                read[event.event_id] = (raw, event)  # read as it is, nothing tolerated: the next read may take it
        if event.key in seen:  # the same GUID, perhaps spelt in another case
            warnings.append(f"Events[{index}]: duplicate EventId {_snippet(repr(event.event_id))} ignored")
            continue
        seen.add(event.key)
        events.append(event)
    extra = {key: value for key, value in obj.items() if key not in _KNOWN_DOCUMENT_FIELDS}
    if memo is not None:
        memo.last = read
    return Document(incarnation=incarnation, events=tuple(events), warnings=tuple(warnings), extra=extra)


def affects_vm(event: ScheduledEvent, vm_name: str | None) -> bool | None:
    """Say whether ``vm_name`` is listed in ``Resources`` (docs/architecture.md, "Whose event?"); None when that
    cannot be told. Names compare case-insensitively (Azure resource names are) and ignore the leading underscore
    the 2017-03-01 preview added."""
    if not vm_name or not event.resources:
        return None
    own = vm_name.lstrip("_").casefold()
    return any(resource.lstrip("_").casefold() == own for resource in event.resources)


def affects_label(affects: bool | None) -> str:
    """``affects_vm`` as the ``affects_this_vm`` label and log field: ``true``, ``false`` or ``unknown``."""
    return "unknown" if affects is None else "true" if affects else "false"


def parse_not_before(value: str) -> datetime | None:
    """RFC 1123 (current API) or ISO 8601 (2017-03-01 preview) to an aware UTC datetime; '' is None."""
    text = value.strip()
    if not text:
        return None
    return _parse_timestamp(text)


@functools.lru_cache(maxsize=4096)
def _parse_timestamp(text: str) -> datetime:
    # Cached: a changed document usually repeats most NotBefore strings of the previous one.
    try:
        parsed = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
        parsed = datetime.fromisoformat(iso)  # ValueError propagates to the caller's warning
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


_Remembered = dict[str, tuple[dict[str, Any], ScheduledEvent]]


class EventMemo:
    """The events of the last document parsed with this memo: EventId -> (the event's JSON object, the event read
    from it), for events read without a warning and without an extra field. The poller owns one and passes it to
    ``parse_document``; the JSON is parse_document's own, so nobody changes it. Bounded by one document; no I/O."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: _Remembered = {}


def _known_event(raw: object, known: _Remembered, read: _Remembered) -> ScheduledEvent | None:
    """The very event read from the last document when this event's JSON object is equal to the one it was read
    from, each value of the same JSON type (remembering it in ``read`` for the next document); None otherwise: then
    it is read afresh.

    A changed document repeats most events of the one before: a repeated one costs one comparison of two small
    dicts in C instead of building an event, and the lifecycle diff tells it unchanged by identity. The types are
    compared because equal JSON values need not read the same: ``1 == 1.0 == True``, and a duration of ``true`` is
    refused where ``1`` is not. (Only events read without a warning and without an extra field are remembered:
    their values are strings, None, lists of strings and integers, so a type per value is all there is to check.)
    """
    if type(raw) is not dict:
        return None
    event_id = raw.get("EventId")
    if type(event_id) is not str:
        return None
    remembered = known.get(event_id)
    if remembered is None or remembered[0] != raw:
        return None
    then = remembered[0]
    for key, value in raw.items():
        if type(value) is not type(then[key]):
            return None
    read[event_id] = remembered
    return remembered[1]


def _event(raw: object, index: int, warnings: list[str]) -> ScheduledEvent:
    """The one reader of an event: each ``EVENT_FIELDS`` row reads its JSON value into the dataclass's field, and the
    dataclass's own constructor builds it. The position is passed down, not a ready "Events[i]" string: it is needed
    only for warnings."""
    if not isinstance(raw, dict):
        raise InvalidDocument(f"Events[{index}] is a JSON {json_kind(raw)}, not an object")
    values = {row.attribute: row.read(raw.get(row.json), row.json, index, warnings) for row in EVENT_FIELDS}
    extra = {key: value for key, value in raw.items() if key not in _KNOWN_EVENT_FIELDS}
    return ScheduledEvent(**values, extra=extra, key=event_key(values["event_id"]))


def _incarnation(value: object, warnings: list[str]) -> int | None:
    if value is None:
        return None
    number = _int64(value)
    if number is not None:
        return number
    warnings.append(f"DocumentIncarnation {_snippet(repr(value))} is not a 64-bit integer; ignored")
    return None


def _int64(value: object, floats: bool = False) -> int | None:
    """An integer in the signed 64-bit range (what Prometheus, OTLP and AMQP can all carry), from a JSON number
    or a string of digits; None for anything else, an over-long digit string included (never int()'s ValueError)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif (floats and isinstance(value, float) and value.is_integer()) or (
            isinstance(value, str) and len(value) <= 64 and _INTEGER.match(value)):
        number = int(value)
    else:
        return None
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _event_id(value: object, key: str, index: int, warnings: list[str]) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidDocument(f"Events[{index}] has no usable {key} (got {json_kind(value)})")
    return value


def _label_string(value: object, key: str, index: int, warnings: list[str]) -> str:
    if isinstance(value, str) and value:
        return value
    warnings.append(f"Events[{index}]: {key} is {json_kind(value)}; shown as 'unknown'")
    return "unknown"


def _optional_string(value: object, key: str, index: int, warnings: list[str]) -> str | None:
    if value is None or isinstance(value, str):
        return value
    warnings.append(f"Events[{index}]: {key} is a JSON {json_kind(value)}, not a string; ignored")
    return None


def _resources(value: object, key: str, index: int, warnings: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        warnings.append(f"Events[{index}]: {key} is a JSON {json_kind(value)}, not a list; ignored")
        return ()
    names = tuple([item for item in value if isinstance(item, str)])  # a list first: faster than a generator
    if len(names) != len(value):
        warnings.append(f"Events[{index}]: {key} has {len(value) - len(names)} non-string entries; ignored")
    return names


def _not_before(value: object, key: str, index: int, warnings: list[str]) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        warnings.append(f"Events[{index}]: {key} is a JSON {json_kind(value)}, not a string; ignored")
        return None
    try:
        return parse_not_before(value)
    except (ValueError, OverflowError):
        warnings.append(f"Events[{index}]: {key} {_snippet(value)!r} is neither RFC 1123 nor ISO 8601; ignored")
        return None


def _duration(value: object, key: str, index: int, warnings: list[str]) -> int | None:
    if value is None:
        return None
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:  # the common case, first
        return value
    number = _int64(value, floats=True)
    if number is not None:
        return number
    warnings.append(f"Events[{index}]: {key} {_snippet(repr(value))} is not a 64-bit integer; ignored")
    return None


def _same(value: Any) -> Any:
    return value


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


_Reader = Callable[[object, str, int, list[str]], Any]


@dataclass(frozen=True)
class EventField:
    """One field of a Scheduled Events event, declared once: ``_event`` reads it, ``event_to_json`` writes it back
    (saved state, the fleet's reduced bodies), the simulator lists it in every api-version from ``since`` on (the
    first one that lists it: ``apiversion.lists_field``), with ``example`` where a scenario says nothing.
    ``example`` is also what ``tests/core/test_event_fields.py`` reads and writes back: a JSON value that reads,
    without a warning, into something other than the attribute's default.

    ``read(value, json name, position, warnings)`` gets the JSON value (None when missing) and returns the
    attribute's value, appending a warning for what it tolerates or raising ``InvalidDocument`` for what refuses
    the document; ``write`` is its inverse into a JSON value that ``read`` takes back without a warning."""

    json: str
    attribute: str
    read: _Reader
    since: str = "2017-03-01"
    write: Callable[[Any], Any] = _same
    example: Any = None


# Every documented event field, in the order of the Azure documents' examples; ScheduledEvent has one field each.
EVENT_FIELDS: tuple[EventField, ...] = (
    EventField("EventId", "event_id", _event_id, example="C7061BAC-AFDC-4513-B24B-AA5F13A16123"),
    EventField("EventType", "event_type", _label_string, example="Freeze"),
    EventField("ResourceType", "resource_type", _optional_string, example="VirtualMachine"),
    EventField("Resources", "resources", _resources, write=list, example=["WestNO_0"]),
    EventField("EventStatus", "event_status", _label_string, example="Scheduled"),
    EventField("NotBefore", "not_before", _not_before, write=_iso, example="Mon, 11 Apr 2022 22:26:58 GMT"),
    EventField("Description", "description", _optional_string, since="2019-04-01", example=""),
    EventField("EventSource", "event_source", _optional_string, since="2019-08-01", example="Platform"),
    EventField("DurationInSeconds", "duration_seconds", _duration, since="2020-07-01", example=-1),
)
EVENT_FIELD = {row.json: row for row in EVENT_FIELDS}
_KNOWN_EVENT_FIELDS = frozenset(EVENT_FIELD)


class _LongInteger:
    """Stands for an integer literal longer than Python's int-string limit (4,300 digits): the field holding it
    is refused with a warning like any other wrongly typed value, instead of the whole document."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<integer of {self.digits:,} digits>"


def _integer_literal(text: str) -> int | _LongInteger:
    try:
        return int(text)
    except ValueError:
        return _LongInteger(len(text.lstrip("-")))


def _escape_surrogates(obj: object) -> int:
    """Rewrite, in place, every string (keys too) holding an unpaired surrogate with it spelt out as text
    (``\\ud800``); return how many were rewritten. Iterative: the JSON may be nested as deep as json allows."""
    count = 0

    def fix(text: str) -> str:
        nonlocal count
        if not _SURROGATE.search(text):
            return text
        count += 1
        return text.encode("utf-8", "backslashreplace").decode("utf-8")

    stack: list[object] = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            for position, item in enumerate(node):
                if isinstance(item, str):
                    node[position] = fix(item)
                elif isinstance(item, (list, dict)):
                    stack.append(item)
        elif isinstance(node, dict):
            if any(_SURROGATE.search(key) for key in node):
                items = [(fix(key), value) for key, value in node.items()]
                node.clear()
                node.update(items)
            for key, value in node.items():  # replacing the value of a key while iterating is allowed
                if isinstance(value, str):
                    node[key] = fix(value)
                elif isinstance(value, (list, dict)):
                    stack.append(value)
    return count


def encodable(text: str) -> str:
    """``text`` with any unpaired surrogate spelt out as text, for strings from IMDS outside a document."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8") if _SURROGATE.search(text) else text


def json_kind(value: object) -> str:
    """The JSON name of a decoded value's type, for messages a person can act on."""
    if isinstance(value, str):
        return "string" if value else "empty string"
    for kind, names in (("null", (type(None),)), ("boolean", (bool,)), ("number", (int, float, _LongInteger)),
                        ("array", (list,)), ("object", (dict,))):
        if isinstance(value, names):
            return kind
    return type(value).__name__


def _snippet(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class VmIdentity:
    """Who we are, from ``/metadata/instance/compute``; any field may be empty."""

    name: str = ""
    vm_id: str = ""
    vmss_name: str = ""
    location: str = ""
    resource_group: str = ""
    subscription_id: str = ""
    vm_size: str = ""
    zone: str = ""
    resource_id: str = ""
    sku: str = ""
    os_type: str = ""
    os_version: str = ""

    # Each field and the compute metadata key it is read from, a string when present (IMDS never sends another type).
    FIELD_KEYS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("name", "name"), ("vm_id", "vmId"), ("vmss_name", "vmScaleSetName"), ("location", "location"),
        ("resource_group", "resourceGroupName"), ("subscription_id", "subscriptionId"), ("vm_size", "vmSize"),
        ("zone", "zone"), ("resource_id", "resourceId"), ("sku", "sku"), ("os_type", "osType"),
        ("os_version", "version"))
    COMPUTE_KEYS: ClassVar[tuple[str, ...]] = tuple(key for _, key in FIELD_KEYS)

    @classmethod
    def from_compute(cls, data: dict[str, Any]) -> VmIdentity:
        def text(key: str) -> str:  # encodable: these become labels, properties and span attributes
            value = data.get(key)
            return encodable(value) if isinstance(value, str) else ""

        return cls(**{name: text(key) for name, key in cls.FIELD_KEYS})


def vm_name(configured: str | None, identity: VmIdentity | None) -> str | None:
    """This VM's name: ``--vm-name`` if given, else the compute metadata's, else None (not known yet)."""
    return configured or (identity.name if identity is not None else None) or None


def event_to_json(event: ScheduledEvent) -> dict[str, Any]:
    """The event under the names of the documented IMDS shape (``EVENT_FIELDS``, the ones ``parse_document`` reads),
    NotBefore in ISO 8601: how saved state keeps an event (``event_from_json`` reads it back)."""
    return {row.json: row.write(getattr(event, row.attribute)) for row in EVENT_FIELDS}


def event_from_json(data: object) -> ScheduledEvent:
    """The inverse of ``event_to_json``, read as ``parse_document`` reads an event: ValueError for anything parsing
    refuses or warns about, for saved state is taken whole and well typed or not at all."""
    warnings: list[str] = []
    try:
        event = _event(data, 0, warnings)
    except InvalidDocument as exc:
        raise ValueError(f"a saved event is not as written ({exc})") from None
    if warnings:
        raise ValueError(f"a saved event is not as written ({warnings[0]})")
    return event
