"""The project's own errors, one small tree.

    SeExporterError
    ├── ConfigError            bad flag or environment value; the CLI prints it as one line, exit 2
    └── ImdsError              one failed poll; the loop counts it under ``outcome`` and goes on
        ├── ImdsThrottled      HTTP 429 (carries Retry-After, if any)
        ├── ImdsHttpError      any other non-200 status, including an unfollowed redirect
        ├── ImdsTimeout        connect/read timeout
        ├── ImdsConnectionError refused, reset, unreachable
        └── InvalidDocument    a 200 whose body is not a Scheduled Events document

Each ImdsError names its ``outcome``: the value of the ``outcome`` label of
``azure_scheduled_events_polls_total``, so classification lives in exactly one place.
"""

from __future__ import annotations


class SeExporterError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(SeExporterError):
    """A setting has a value we cannot run with; the message names the setting and the fix."""


class ImdsError(SeExporterError):
    """A poll of IMDS did not yield a document."""

    outcome = "error"


class ImdsThrottled(ImdsError):
    outcome = "throttled"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ImdsHttpError(ImdsError):
    outcome = "http_error"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ImdsTimeout(ImdsError):
    outcome = "timeout"


class ImdsConnectionError(ImdsError):
    outcome = "connection_error"


class InvalidDocument(ImdsError):
    outcome = "invalid_document"


POLL_OUTCOMES = ("ok", "throttled", "http_error", "timeout", "connection_error", "invalid_document")
