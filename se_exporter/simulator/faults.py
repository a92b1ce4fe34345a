"""Fault injection: what can go wrong between a VM and IMDS, on demand.

A fault applies to the next ``count`` GETs of the Scheduled Events endpoint (``count=0``: until cleared). It is
given as a spec string (``--fault``, ``SE_EXPORTER_SIMULATOR_FAULTS``, ``;``-separated) or as the JSON object of
``POST /_simulator/faults`` with the same keys; docs/simulator.md lists the kinds and their keys. Every value is
checked when the fault is made, so a bad one is refused there (the CLI's one line, or HTTP 400) and never reaches a
request.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from se_exporter.core.errors import ConfigError
from se_exporter.infra.options import parse_duration

KINDS = ("throttle", "status", "delay", "first_call_delay", "hang", "reset", "malformed", "non_json",
         "invalid", "empty", "redirect", "huge", "body", "truncate", "drip", "chunked", "gzip")
CHUNK_ERRORS = ("none", "missing_last", "bad_size")
MAX_SECONDS = 3600.0
MAX_BYTES = 2**30
MAX_COUNT = 10**9
# Header values go out as they are: no control characters (a CR/LF would write headers of its own).
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")
# The spec key and the JSON key of each field; the field itself is ``size`` (``bytes`` would shadow the type).
_KEYS = {"count": "count", "status": "status", "retry_after": "retry_after", "seconds": "seconds",
         "location": "location", "bytes": "size", "text": "text", "error": "error"}
# How a spec's numbers read (seconds as every duration setting does: 1.5, 500ms, 2m); the rest is text.
_NUMBERS: dict[str, Callable[[str], float]] = {"count": int, "status": int, "seconds": parse_duration, "bytes": int}
_DEFAULT_SIZE = {"huge": 10 * 1024 * 1024}
_DEFAULT_SECONDS = {"hang": 30.0, "drip": 1.0}


@dataclass(frozen=True)
class Fault:
    kind: str
    count: int = 1
    status: int = 500
    retry_after: str | None = None
    seconds: float = 0.0
    location: str = "http://127.0.0.1:9/metadata/scheduledevents"
    size: int | None = None  # "bytes": huge's body, truncate's bytes sent, gzip's blanks; None: the kind's default
    text: str = ""
    error: str = "none"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"fault kind {self.kind!r} is not one of {', '.join(KINDS)}")
        self._check_numbers()
        self._check_texts()
        if self.error not in CHUNK_ERRORS:
            raise ConfigError(f"fault error {self.error!r} is not one of {', '.join(CHUNK_ERRORS)}")

    def _check_numbers(self) -> None:
        _integer("count", self.count, 0, MAX_COUNT, " (0: until cleared)")
        _integer("status", self.status, 100, 599, " (an HTTP status)")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) \
                or not math.isfinite(self.seconds) or not 0 <= self.seconds <= MAX_SECONDS:
            raise ConfigError(f"fault seconds must be a number from 0 to {MAX_SECONDS:g}, not {self.seconds!r}")
        if self.kind == "drip" and self.seconds == 0:
            raise ConfigError("fault drip needs seconds > 0 (the pause between bytes)")
        if self.size is not None:
            _integer("bytes", self.size, 0, MAX_BYTES, "")

    def _check_texts(self) -> None:
        for name, value in (("retry_after", self.retry_after), ("location", self.location)):
            if value is not None and not _header_value(value):
                raise ConfigError(f"fault {name} must be printable ASCII text of at most 2048 characters "
                                  f"(it is sent as a header), not {value!r}")
        if self.retry_after is not None and not _retry_after_ok(self.retry_after):
            raise ConfigError(f"fault retry_after must be whole seconds (0 or more) or an HTTP date, "
                              f"not {self.retry_after!r}")
        if not isinstance(self.text, str):
            raise ConfigError(f"fault text must be a string, not {self.text!r}")
        try:
            self.text.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError("fault text must be valid Unicode (it is sent as UTF-8); to serve an unpaired "
                              "surrogate, write its JSON escape: a backslash, then ud800") from None

    def size_or(self, default: int) -> int:
        return self.size if self.size is not None else _DEFAULT_SIZE.get(self.kind, default)


def _header_value(value: object) -> bool:
    """Text a header can carry as it is: printable ASCII, at most 2048 characters."""
    return isinstance(value, str) and len(value) <= 2048 and _HEADER_VALUE.fullmatch(value) is not None


def _retry_after_ok(value: str) -> bool:
    """A Retry-After value as RFC 9110 10.2.3 defines it: delay-seconds (digits) or an HTTP date."""
    if value.isascii() and value.isdigit():
        return True
    try:
        return email.utils.parsedate_to_datetime(value) is not None
    except (TypeError, ValueError):
        return False


def _integer(name: str, value: object, low: int, high: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"fault {name} must be an integer from {low} to {high}{hint}, not {value!r}")


def split_specs(text: str) -> list[str]:
    """``SE_EXPORTER_SIMULATOR_FAULTS`` as specs: split on ``;`` up to the first ``text=``, which takes the rest of
    the variable, semicolons included (so a body fault, if any, comes last)."""
    head, sep, rest = text.partition(",text=")
    specs = head.split(";")
    if sep:
        specs[-1] += sep + rest
    return specs


def parse_fault(spec: str) -> Fault:
    """``kind,key=value,...`` as documented above; ``text=`` takes the rest of the spec, commas and all (JSON)."""
    head, sep, text = spec.partition(",text=")
    kind, *pairs = [part.strip() for part in head.split(",") if part.strip()] or [""]
    values: dict[str, str] = {**({"text": text} if sep else {}), **_pairs(spec, pairs)}
    unknown = set(values) - set(_KEYS)
    if unknown:
        raise ConfigError(f"fault {spec!r}: unknown keys {', '.join(sorted(unknown))}")
    try:
        return _make(kind, {key: _NUMBERS.get(key, str)(values[key]) if key in values else None for key in _KEYS})
    except (ValueError, ConfigError) as exc:  # a number that does not read, or a value Fault refuses
        raise ConfigError(f"fault {spec!r}: {exc}") from None


def _pairs(spec: str, pairs: list[str]) -> dict[str, str]:
    """A spec's ``key=value`` parts, by key."""
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"fault {spec!r}: {pair!r} is not key=value")
        values[key.strip()] = value.strip()
    return values


def from_json(data: object) -> Fault:
    """A fault object of ``POST /_simulator/faults``: the spec's keys, with JSON values."""
    if not isinstance(data, dict) or "kind" not in data:
        raise ConfigError("a fault is an object with at least 'kind'")
    unknown = set(data) - {"kind", *_KEYS}
    if unknown:
        hint = " (the body size is 'bytes')" if "size" in unknown else ""
        raise ConfigError(f"unknown fault keys {', '.join(sorted(unknown))}{hint}")
    if not isinstance(data["kind"], str):
        raise ConfigError(f"fault kind must be a string, not {data['kind']!r}")
    retry_after = data.get("retry_after")
    if isinstance(retry_after, int) and not isinstance(retry_after, bool) and retry_after >= 0:
        data = {**data, "retry_after": str(retry_after)}  # seconds may be given as a JSON number
    return _make(data["kind"], {key: data.get(key) for key in _KEYS})


def _make(kind: str, values: dict[str, object]) -> Fault:
    """A Fault from the given values (None: the kind's default); Fault checks every one of them."""
    fields: dict[str, object] = {_KEYS[key]: value for key, value in values.items() if value is not None}
    if "status" not in fields:
        fields["status"] = 429 if kind == "throttle" else 500
    if "seconds" not in fields:
        fields["seconds"] = _DEFAULT_SECONDS.get(kind, 0.0)
    return Fault(kind, **fields)  # type: ignore[arg-type]  # each value's type is checked in __post_init__
