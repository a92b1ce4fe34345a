"""Logging set-up: plain text for people, one JSON object per line for log shippers.

Structured fields travel in ``extra=fields(...)``; the text format appends them as key=value,
the JSON format merges them into the object.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone
from typing import Any

_FIELDS = "se_fields"
# Connection-string keys, SAS signatures and bearer tokens, wherever they might surface (an SDK's
# exception text included): the value is replaced, the name stays so the line still makes sense.
_SECRETS = re.compile(
    r"(?i)(SharedAccessKey\s*=\s*|SharedAccessSignature\s*=\s*|AccountKey\s*=\s*|\bsig=|Bearer\s+|"
    r"\"access_token\"\s*:\s*\")"
    r"[^;&\s\"']+")


def redact(text: str) -> str:
    return _SECRETS.sub(lambda match: match.group(1) + "<redacted>", text)


def fields(**values: Any) -> dict[str, Any]:
    return {_FIELDS: {key: value for key, value in values.items() if value is not None}}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
        line = f"{stamp}Z {record.levelname.lower():<7} {record.getMessage()}"
        extra = getattr(record, _FIELDS, None)
        if extra:
            line += " " + " ".join(f"{key}={_text(value)}" for key, value in extra.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
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
        return redact(json.dumps(body, default=str, ensure_ascii=False))


def setup(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO: at one poll a second that is noise, not news.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    # The Azure SDK narrates every AMQP connection, session and link state change at INFO.
    logging.getLogger("azure").setLevel(logging.WARNING)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value) if (" " in value or not value) else value
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
