"""Fault injection: what can go wrong between a VM and IMDS, on demand.

A fault applies to the next ``count`` GETs of the Scheduled Events endpoint (``count=0``: until
cleared). Spec strings, for ``--fault`` and ``SE_EXPORTER_SIMULATOR_FAULTS`` (``;``-separated):

    throttle[,retry_after=S][,count=N]   429 Too Many Requests, with Retry-After if given
    status,status=CODE[,count=N]         any status (500, 503, 404 ...)
    delay,seconds=S[,count=N]            answer normally, S seconds late (slow answers)
    first_call_delay,seconds=S           the first request only, as when the service switches on
    hang,seconds=S[,count=N]             say nothing for S seconds, then close: a client timeout
    reset[,count=N]                      close the connection without an answer
    malformed[,count=N]                  truncated JSON
    non_json[,count=N]                   an HTML page, as from a captive proxy
    invalid[,count=N]                    valid JSON that is not a Scheduled Events document
    empty[,count=N]                      200 with an empty body
    redirect[,location=URL][,count=N]    302 to another place
    huge[,bytes=N][,count=N]             a 200 body of N bytes (default 10 MB)
    body,text=T[,count=N]                200 with exactly T (for unknown fields and types)
"""

from __future__ import annotations

from dataclasses import dataclass

from se_exporter.errors import ConfigError

KINDS = ("throttle", "status", "delay", "first_call_delay", "hang", "reset", "malformed", "non_json",
         "invalid", "empty", "redirect", "huge", "body")


@dataclass(frozen=True)
class Fault:
    kind: str
    count: int = 1
    status: int = 500
    retry_after: str | None = None
    seconds: float = 0.0
    location: str = "http://127.0.0.1:9/metadata/scheduledevents"
    size: int = 10 * 1024 * 1024
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"fault kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.count < 0:
            raise ConfigError("fault count must be >= 0 (0: until cleared)")


def parse_fault(spec: str) -> Fault:
    """``kind,key=value,...`` as documented above."""
    kind, *pairs = [part.strip() for part in spec.split(",") if part.strip()] or [""]
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"fault {spec!r}: {pair!r} is not key=value")
        values[key.strip()] = value.strip()
    try:
        fault = Fault(
            kind=kind,
            count=int(values.pop("count", "1")),
            status=int(values.pop("status", "429" if kind == "throttle" else "500")),
            retry_after=values.pop("retry_after", None),
            seconds=float(values.pop("seconds", "30" if kind == "hang" else "0")),
            location=values.pop("location", Fault.location),
            size=int(values.pop("bytes", str(Fault.size))),
            text=values.pop("text", ""),
        )
    except ValueError as exc:
        raise ConfigError(f"fault {spec!r}: {exc}") from None
    if values:
        raise ConfigError(f"fault {spec!r}: unknown keys {', '.join(sorted(values))}")
    return fault


def from_json(data: object) -> Fault:
    if not isinstance(data, dict) or "kind" not in data:
        raise ConfigError("a fault is an object with at least 'kind'")
    allowed = {"kind", "count", "status", "retry_after", "seconds", "location", "size", "text"}
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"unknown fault keys {', '.join(sorted(unknown))}")
    try:
        return Fault(**{key: data[key] for key in data})
    except TypeError as exc:
        raise ConfigError(f"fault: {exc}") from None
