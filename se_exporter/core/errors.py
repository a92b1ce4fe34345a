"""The project's own errors, one small tree.

    SeExporterError
    ├── ConfigError            bad flag or environment value; the CLI prints it as one line, exit 2
    ├── StorageError           a directory or file the sidecar must use cannot be used (carries ``path``)
    │   ├── StateDirError      the state directory: lifecycles, forwarding sequence, span events, the lock
    │   ├── SpoolError         the Event Hubs spool directory
    │   └── ForwardFileError   the JSON-lines forward file
    └── ImdsError              one failed poll; the loop counts it under ``outcome`` and goes on
        ├── ImdsThrottled      HTTP 429 (carries Retry-After, if any)
        ├── ImdsHttpError      any other non-200 status, including an unfollowed redirect
        ├── ImdsTimeout        connect/read timeout
        ├── ImdsConnectionError refused, reset, unreachable
        └── InvalidDocument    a 200 whose body is not a Scheduled Events document

A StorageError's message says what is wrong with its ``path`` but names no flag: the layers that raise it (the
spool, the sequencer, the file target) know nothing of the command line. The CLI maps each class to the flag that
sets the path (``--state-dir``, ``--spool-dir``, ``--forward-file``) and prints it as a ConfigError would be.

Each ImdsError names its ``outcome``: the value of the ``outcome`` label of
``azure_scheduled_events_polls_total``, so classification lives in exactly one place.
"""

from __future__ import annotations

from pathlib import Path


class SeExporterError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(SeExporterError):
    """A setting has a value we cannot run with; the message names the setting and the fix."""


class StorageError(SeExporterError):
    """A directory or file cannot be used; ``reason`` says why (e.g. ``cannot use it (Permission denied)``)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


class StateDirError(StorageError):
    """The state directory cannot be used (or another se-exporter holds it)."""


class SpoolError(StorageError):
    """The spool directory cannot be used (or another se-exporter holds it)."""


class ForwardFileError(StorageError):
    """The forward file cannot be opened for appending."""


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

    def __init__(self, message: str, status: int, body: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.body = body  # the start of the answer's body (400 and 404 only): whether it names the api-version


class ImdsTimeout(ImdsError):
    outcome = "timeout"


class ImdsConnectionError(ImdsError):
    outcome = "connection_error"


class InvalidDocument(ImdsError):
    outcome = "invalid_document"


POLL_OUTCOMES = ("ok", "throttled", "http_error", "timeout", "connection_error", "invalid_document")
