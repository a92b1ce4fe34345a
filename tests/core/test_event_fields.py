"""The IMDS event's one table of fields (``EVENT_FIELDS``): every row read, written back and listed by api-version."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from se_exporter.core import apiversion
from se_exporter.core.model import (
    EVENT_FIELDS,
    EventField,
    ScheduledEvent,
    event_from_json,
    event_to_json,
    parse_document,
)

_NOT_IN_TABLE = {"extra", "key"}  # what the document holds beside the fields, and the identity worked out from one
_EXAMPLE = {row.json: row.example for row in EVENT_FIELDS}


def test_every_field_of_the_event_has_exactly_one_row() -> None:
    """The dataclass and the table name the same fields, each once, each JSON name once: a field added to one and not
    the other fails here before any reader or writer misses it."""
    attributes = [row.attribute for row in EVENT_FIELDS]
    assert sorted(attributes) == sorted(f.name for f in dataclasses.fields(ScheduledEvent)
                                        if f.name not in _NOT_IN_TABLE)
    assert len(set(attributes)) == len(attributes)
    assert len({row.json for row in EVENT_FIELDS}) == len(EVENT_FIELDS)


@pytest.mark.parametrize("row", EVENT_FIELDS, ids=lambda row: row.json)
def test_every_row_is_read_from_its_json_name(row: EventField) -> None:
    """Each row's example, in a document of every row's example, reads without a warning into something other than
    the attribute's default, and into something else again when that one field is changed: the reader takes the
    value from the field's own JSON name."""
    document = parse_document(json.dumps({"Events": [_EXAMPLE]}))
    assert document.warnings == ()
    event = document.events[0]
    assert event.extra == {}
    default = next(f for f in dataclasses.fields(ScheduledEvent) if f.name == row.attribute).default
    assert getattr(event, row.attribute) != default
    other = parse_document(json.dumps({"Events": [{**_EXAMPLE, row.json: _another(row.example)}]})).events[0]
    assert getattr(other, row.attribute) != getattr(event, row.attribute)


def _another(example: Any) -> Any:
    """A JSON value of the example's type, different from it (and read without a warning where the example is)."""
    if isinstance(example, list):
        return [*example, "other"]
    if isinstance(example, bool) or not isinstance(example, (int, str)):
        raise AssertionError(f"no other value of {example!r} known: teach _another its type")
    if isinstance(example, int):
        return example + 7
    if example.startswith(("Mon, ",)):
        return "Tue, 12 Apr 2022 22:26:58 GMT"
    return example + "x"


@pytest.mark.parametrize("row", EVENT_FIELDS, ids=lambda row: row.json)
def test_every_row_survives_saved_state(row: EventField) -> None:
    """parse -> event_to_json -> event_from_json and parse again give the very event, each field of its own value:
    a row whose writer is missing or lossy loses its field across a restart, here."""
    event = parse_document(json.dumps({"Events": [{**_EXAMPLE, row.json: _another(row.example)}]})).events[0]
    written = event_to_json(event)
    assert set(written) == {r.json for r in EVENT_FIELDS}
    for again in (event_from_json(json.loads(json.dumps(written))),
                  parse_document(json.dumps({"Events": [written]})).events[0]):
        assert vars(again) == vars(event)


@pytest.mark.parametrize("row", EVENT_FIELDS, ids=lambda row: row.json)
def test_every_row_names_a_version_that_lists_it(row: EventField) -> None:
    """A row's ``since`` is a documented api-version, and every later one lists the field too."""
    assert row.since in apiversion.VERSIONS
    assert [apiversion.lists_field(v, row.json) for v in apiversion.VERSIONS] == [
        v >= row.since for v in apiversion.VERSIONS]
