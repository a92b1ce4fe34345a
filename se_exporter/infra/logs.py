"""Logging set-up: plain text for people, one JSON object per line for log shippers.

Structured fields travel in ``extra=fields(...)``; the text format appends them as key=value,
the JSON format merges them into the object.

Values from IMDS reach messages and fields, so the formatters, not each call site, make every record one line
that says what it says (what is escaped: docs/architecture.md, "Log lines stay lines"); a traceback keeps its line
breaks but every line of it is indented, so no part of it can pass for a record of its own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from se_exporter.infra import host_os
from se_exporter.infra.host_os import utf8_stream

_FIELDS = "se_fields"
# Connection-string keys, SAS signatures and bearer tokens, wherever they might surface (an SDK's
# exception text included): the value is replaced, the name stays so the line still makes sense.
_SECRETS = re.compile(
    r"(?i)(SharedAccessKey\s*=\s*|SharedAccessSignature\s*=\s*|AccountKey\s*=\s*|\bsig=|Bearer\s+|"
    r"\"access_token\"\s*:\s*\")"
    r"[^;&\s\"']+")
# What can end, forge or disguise a log line: C0 controls (newline, carriage return, ESC of ANSI sequences), DEL,
# C1 controls (0x9b is a one-character CSI), line/paragraph separators, bidi overrides, unpaired surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
# The same for a line json.dumps wrote: it has escaped the C0 controls already; the rest become \uXXXX escapes.
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# A bare key=value value holds no blank and no quote; anything else is written as a JSON string.
_BARE = re.compile(r"[^\s\"]+")


# The password of a URL's userinfo (``http://user:password@collector``, basic auth to an OTLP collector): from the
# ``:`` after the user name to the last ``@`` before a blank, so that a password holding an ``@``, ``/``, ``?``,
# ``#`` or a quote (unencoded, as people paste them) is hidden whole, also inside the quotes of an error's repr. A
# ``:`` after a ``/`` is a path's, not a password's (``http://host/a:b@c`` stays as it is).
_URL_PASSWORD = re.compile(r"(//[^/?#@\s:'\"]*:)\S*@")


def redact(text: str) -> str:
    """``text`` with every secret it may hold replaced by ``<redacted>``: the one redaction of whatever reaches a
    person, log records (the formatters) and what a command prints itself (``say``)."""
    text = _URL_PASSWORD.sub(lambda match: match.group(1) + "<redacted>@", text)
    return _SECRETS.sub(lambda match: match.group(1) + "<redacted>", text)


def say(text: str, stream: TextIO | None = None) -> None:
    """Print what a command tells a person outside the log (its one-line start-up error, the demo's banner and
    summary), redacted as a log record is: a value given in a flag or a variable reaches those too."""
    print(redact(text), file=stream or sys.stdout, flush=True)


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, "..." saying it was: the one shortener of what peers say."""
    return text if len(text) <= limit else text[:limit] + "..."


class Throttle:
    """The one policy for a line that may repeat without end (invalid messages, a partition's storage errors): at
    most one per ``key`` per ``every`` seconds; the counters count every occurrence. A peer that fails and
    recovers is logged by ``retry.Health`` instead: once when it starts failing, once when it recovers."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._last: dict[str, float] = {}

    def due(self, key: str, now: float) -> bool:
        """True when a line about ``key`` may be logged at ``now`` (monotonic seconds); it then counts as logged."""
        if now - self._last.get(key, -self.every) < self.every:
            return False
        self._last[key] = now
        return True


def escape(text: str) -> str:
    """``text`` with every character in ``_UNSAFE`` written as a visible escape: one line, shown as it is."""
    return _UNSAFE.sub(_escaped, text) if _UNSAFE.search(text) else text


def escape_json(line: str) -> str:
    """A line ``json.dumps`` wrote, with what it leaves that can forge or disguise a line (C1 controls, line
    separators, bidi overrides, unpaired surrogates) as ``\\uXXXX``: only ever inside a string, so the same JSON,
    made visible. ``escape``'s rule for a JSON line."""
    if not _UNSAFE_IN_JSON.search(line):
        return line
    return _UNSAFE_IN_JSON.sub(lambda match: f"\\u{ord(match.group()):04x}", line)


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def fields(**values: Any) -> dict[str, Any]:
    return {_FIELDS: {key: value for key, value in values.items() if value is not None}}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
        line = f"{stamp}Z {record.levelname.lower():<7} {escape(record.getMessage())}"
        extra = getattr(record, _FIELDS, None)
        if extra:
            line += " " + " ".join(f"{escape(key)}={_text(value)}" for key, value in extra.items())
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            line += "".join("\n    " + escape(part) for part in trace.split("\n"))
        return redact(line)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
        body: dict[str, Any] = {
            "time": stamp.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        body.update(getattr(record, _FIELDS, None) or {})
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return redact(escape_json(json.dumps(body, default=str, ensure_ascii=False)))


def setup(level: str, fmt: str) -> None:
    """Log to stderr in UTF-8 whatever its code page (host_os.utf8_stream); with no stderr at all, to a file."""
    handler = logging.StreamHandler(utf8_stream(sys.stderr) or fallback_stream())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The Azure SDK narrates every AMQP connection, session and link state change at INFO.
    logging.getLogger("azure").setLevel(logging.WARNING)


def fallback_stream() -> TextIO:
    """``se-exporter.log`` in the default state directory, for a process without stderr (``pythonw.exe``, a service
    host that hands none; the WinSW service in deploy/windows gives one): lines are kept rather than dropped."""
    directory = host_os.DEFAULT_STATE_DIR  # read when needed: tests point it elsewhere
    try:
        os.makedirs(directory, exist_ok=True)
        return open(os.path.join(directory, "se-exporter.log"), "a", encoding="utf-8",
                    errors="backslashreplace", buffering=1)
    except OSError:
        return open(os.devnull, "w", encoding="utf-8")


def _text(value: Any) -> str:
    """A field value as key=value: bare when it is one plain word, else a JSON string (quotes, newlines and
    other controls escaped); non-ASCII stays readable, and whatever json leaves is escaped by ``escape``."""
    if isinstance(value, str):
        return value if _BARE.fullmatch(value) and not _UNSAFE.search(value) else escape(
            json.dumps(value, ensure_ascii=False))
    if isinstance(value, (list, dict)):
        return escape(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))
    return escape(str(value))
