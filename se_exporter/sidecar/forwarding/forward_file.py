"""The JSON-lines forward file (``--forward-file``): one forwarding target, for log shippers.

Each envelope is one line, written whole and fsynced before it counts; a line that fails half-way is cut off again.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from pathlib import Path
from typing import BinaryIO

from se_exporter.core.errors import ForwardFileError
from se_exporter.infra.files import DISK, Disk, LineFile, NotRegularFile, write_all
from se_exporter.sidecar.forwarding.envelope import Envelope
from se_exporter.sidecar.forwarding.forward import ForwardMetrics

log = logging.getLogger("se_exporter.forward")


def file_line(envelope: Envelope) -> bytes:
    """One JSON object per line: the envelope's header and the document's exact text as ``body``."""
    record = envelope.header()
    del record["observed_at"]  # already in properties, as RFC 3339
    record["body"] = envelope.body.decode("utf-8", errors="surrogateescape")
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape") + b"\n"


class FileTarget:
    """Appends envelopes to a JSON-lines file for log shippers, each line whole and fsynced before it counts."""

    name = "file"

    def __init__(self, path: Path, metrics: ForwardMetrics, disk: Disk = DISK) -> None:
        self._metrics = metrics
        self._disk = disk
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = LineFile(path, disk, sync=True)
            self.last_sequence = self._recover(path)
        except NotRegularFile:
            raise ForwardFileError(path, "it is not a regular file: give the path of a regular file (or of one to "
                                         "create)") from None
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # what fifo_flags (O_NONBLOCK) make of a FIFO without a reader
                raise ForwardFileError(path, "it is a FIFO, not a regular file: give the path of a regular file (or "
                                             "of one to create)") from None
            raise ForwardFileError(path, f"cannot open it for appending ({exc.strerror or exc}); give the path of "
                                         "a regular file the sidecar may write") from None
        self.path = path

    def accept(self, envelope: Envelope) -> None:
        line = file_line(envelope)
        with self._lock:
            self._file.append(line)
        self._metrics.forwarded.labels(self.name).inc()

    def close(self, timeout: float) -> None:
        with self._lock:
            self._file.close()

    def _recover(self, path: Path) -> int:
        """The sequence of the file's last line (0 if none), after cutting off a line of ours left incomplete by
        a crash; a file that ends in text of another writer gets a newline so our first line starts clean."""
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            tail = _tail(handle, size)
        if not tail:
            return 0
        start = tail.rfind(b"\n", 0, len(tail) - 1) + 1
        if not tail.endswith(b"\n"):
            if not tail[start:].startswith(b'{"sequence":'):
                write_all(self._disk, self._file.fd, b"\n")
                return 0
            log.warning("%s ends in an incomplete line (%d bytes, a write cut short): removed", path,
                        len(tail) - start)
            os.ftruncate(self._file.fd, size - (len(tail) - start))
            return self._recover(path)
        try:
            sequence = json.loads(tail[start:])["sequence"]
        except (ValueError, RecursionError, TypeError, KeyError, IndexError):
            return 0
        return sequence if type(sequence) is int else 0


def _tail(handle: BinaryIO, size: int, limit: int = 16 << 20) -> bytes:
    """The end of a file, read backwards until it holds the whole last line (or ``limit`` bytes)."""
    end, data = size, b""
    while end > 0 and len(data) < limit:
        start = max(0, end - (1 << 16))
        handle.seek(start)
        data = handle.read(end - start) + data
        end = start
        if data.count(b"\n", 0, len(data) - 1):  # a newline before the last byte: the last line is all here
            break
    return data
