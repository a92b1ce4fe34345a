"""Every way Linux (POSIX) and Windows differ for this program, behind one object chosen once: ``HOST_OS``.

What differs, and why it matters here (what an operator sees of it: docs/deploy.md, "Run on a Windows VM"):

* **Files.** ``os.open`` opens in *text* mode on Windows unless ``O_BINARY`` is given (CRLF translation, Ctrl-Z read
  as end of file): every spool record would fail its checksum. ``fdatasync``, ``pread`` and ``pwrite`` do not exist
  there (``fsync`` is ``FlushFileBuffers``; positional I/O is a seek and a read under a lock). A replace fails with
  "access denied" while another process (an antivirus scanner, a backup agent, the indexer) briefly holds the target
  open, so it is retried for a moment before the error counts.
* **The instance lock** (dirlock): ``flock`` on POSIX, ``msvcrt.locking`` on one byte past the owner's pid on Windows.
* **Stopping.** POSIX sends SIGTERM/SIGINT/SIGHUP. Windows sends console control events (Ctrl+C from the service
  wrapper, Ctrl+Break, closing the console, shutdown). They are taken with ``SetConsoleCtrlHandler``, whose handler
  runs in a thread of its own: it sets the stop event directly, so the main thread's untimed ``Event.wait()``
  (which Ctrl+C cannot interrupt on Windows with Python 3.10-3.13) returns, and neither OS needs a periodic wake-up.
  On POSIX, Python runs a signal's handler in the main thread only, and only once that thread runs again: a signal
  the kernel gives another thread (it may, the process has many) leaves a main thread asleep in an untimed lock
  wait asleep for good (seen: a SIGTERM that never stopped the sidecar). So the main thread waits on a pipe the C
  handler writes to, whichever thread took the signal (``signal.set_wakeup_fd``): ``wait_for_stop``.
* **Listening.** ``SO_REUSEADDR`` means "share the port" on Windows: there ``SO_EXCLUSIVEADDRUSE`` is set instead.

Both implementations take the OS functions they use as arguments, so the tests run the Windows one on Linux with
fakes through this same seam; only the end of this module looks at ``sys.platform``, once.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    import asyncio  # annotations only: importing it costs a sidecar without Event Hubs ~1.7 MB of RSS

StopCallback = Callable[[], object]  # what it returns is ignored
# The signals that ask for the orderly stop, where the platform has them (Windows: SIGINT and SIGTERM only, and its
# console control events below): one list for the command's handlers, the early ones in __main__ and processwide.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))
# Windows console control events (wincon.h).
CTRL_C_EVENT, CTRL_BREAK_EVENT, CTRL_CLOSE_EVENT, CTRL_LOGOFF_EVENT, CTRL_SHUTDOWN_EVENT = 0, 1, 2, 5, 6
# The Windows lock is taken on this byte of the lock file: far past the pid written at its start.
LOCK_OFFSET = 1 << 20
# How long a Windows replace keeps trying while another process holds the target open.
REPLACE_PATIENCE = 2.0


class HostOs(Protocol):
    """The operations whose implementation differs; see the module docstring for each reason."""

    open_flags: int  # or-ed into every os.open of a data file
    fifo_flags: int  # or-ed in where a FIFO put in a file's place must fail at once (state files, forward file)
    reuse_address: bool  # SO_REUSEADDR on the HTTP server's listening socket

    def datasync(self, fd: int) -> None: ...

    def sync_directory(self, directory: str | os.PathLike[str]) -> None: ...

    def replace(self, source: str, target: str) -> None: ...

    def remove(self, path: str | os.PathLike[str]) -> None:
        """Delete a file if it is there. On Windows this fails (PermissionError) while any handle holds it open."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def pread(self, fd: int, size: int, offset: int) -> bytes: ...

    def pwrite(self, fd: int, data: bytes, offset: int) -> None: ...

    def try_lock(self, fd: int) -> bool:
        """Lock the open file ``fd`` for this process without waiting; False if another process has it."""

    def on_stop(self, callback: StopCallback) -> None:
        """Call ``callback`` (from any thread) when the OS asks this process to stop."""

    def on_stop_async(self, loop: asyncio.AbstractEventLoop, callback: StopCallback) -> None:
        """``on_stop`` for an asyncio program: ``callback`` runs in the loop's thread."""

    def wait_for_stop(self, stop: threading.Event) -> None:
        """Block until ``stop`` is set by ``on_stop``'s callback (Windows: its handler's thread sets it)."""
        stop.wait()

    def prepare_listener(self, sock: socket.socket) -> None:
        """Socket options before bind: exclusive use where the OS needs asking, dual stack for ``[::]``."""
        if sock.family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
            # [::] serves IPv4 too, on every OS: Linux does by default, Windows only when asked.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)

    def default_state_dir(self, environ: Mapping[str, str]) -> str: ...


class _Msvcrt(Protocol):
    LK_NBLCK: int

    def locking(self, fd: int, mode: int, nbytes: int, /) -> None: ...


class Windows(HostOs):
    """Windows: the C runtime's file calls, ``msvcrt.locking``, console control events, exclusive binds."""

    fifo_flags = 0  # no FIFOs in the file namespace (named pipes live under \\.\pipe\)
    reuse_address = False

    def __init__(self, msvcrt: _Msvcrt, set_console_ctrl_handler: Callable[[Callable[[int], bool]], None],
                 exclusive_address_option: int, binary_flag: int, replace: Callable[[str, str], None],
                 fsync: Callable[[int], None] = os.fsync, sleep: Callable[[float], None] = time.sleep,
                 unlink: Callable[[str | os.PathLike[str]], None] = os.unlink, close_grace: float = 20.0) -> None:
        self._msvcrt = msvcrt
        self._set_handler = set_console_ctrl_handler
        self._exclusive = exclusive_address_option
        self.open_flags = binary_flag
        self._replace = replace
        self._fsync = fsync
        self._sleep = sleep
        self._unlink = unlink
        self._close_grace = close_grace
        self._position = threading.Lock()  # seek + read/write must not interleave between threads
        self._handlers: list[Callable[[int], bool]] = []  # kept alive: Windows calls them later

    def datasync(self, fd: int) -> None:
        self._fsync(fd)  # _commit -> FlushFileBuffers: data and metadata, there is nothing lighter

    def sync_directory(self, directory: str | os.PathLike[str]) -> None:
        """Nothing to do: NTFS logs the rename in its journal, and ``replace`` asked for write-through."""

    def replace(self, source: str, target: str) -> None:
        waited, pause = 0.0, 0.01
        while True:
            try:
                self._replace(source, target)
                return
            except PermissionError:  # ERROR_ACCESS_DENIED / ERROR_SHARING_VIOLATION: someone holds the target
                if waited >= REPLACE_PATIENCE:
                    raise
                self._sleep(pause)
                waited += pause
                pause = min(pause * 2, 0.25)

    def remove(self, path: str | os.PathLike[str]) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._unlink(path)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._position:
            os.lseek(fd, offset, os.SEEK_SET)
            chunks, left = [], size
            while left:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        with self._position:
            os.lseek(fd, offset, os.SEEK_SET)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]

    def try_lock(self, fd: int) -> bool:
        with self._position:
            os.lseek(fd, LOCK_OFFSET, os.SEEK_SET)
            try:
                self._msvcrt.locking(fd, self._msvcrt.LK_NBLCK, 1)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EDEADLK):  # what the CRT answers for a range locked by another
                    return False
                raise
        return True

    def on_stop(self, callback: StopCallback) -> None:
        def handler(event: int) -> bool:
            if event == CTRL_LOGOFF_EVENT:
                return True  # a user logging off: not ours to act on (a service receives it for every user)
            callback()
            if event in (CTRL_CLOSE_EVENT, CTRL_SHUTDOWN_EVENT):
                # Windows ends the process as soon as this handler returns: hold it while the main thread stops
                # in order; the process exiting ends this wait.
                self._sleep(self._close_grace)
            return True  # handled: no default handler (which would end the process at once)

        self._handlers.append(handler)
        self._set_handler(handler)

    def on_stop_async(self, loop: asyncio.AbstractEventLoop, callback: StopCallback) -> None:
        self.on_stop(lambda: loop.call_soon_threadsafe(callback))

    def prepare_listener(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, self._exclusive, 1)
        super().prepare_listener(sock)

    def default_state_dir(self, environ: Mapping[str, str]) -> str:
        root = environ.get("ProgramData") or environ.get("PROGRAMDATA") or r"C:\ProgramData"
        return f"{root.rstrip(chr(92))}\\se-exporter"


def utf8_stream(stream: TextIO | None) -> TextIO | None:
    """``stream`` if it writes UTF-8; else a UTF-8 writer on a copy of its file descriptor; None if there is none.

    A Windows service host (or a redirect to a file) gives stderr the ANSI code page, cp1252 on most VMs: a
    resource name in another script would come out as ``?`` or backslash escapes. A copy of the descriptor, so
    that the new writer can be closed or collected without closing the process's stderr.
    """
    if stream is None:
        return None
    if (getattr(stream, "encoding", None) or "").replace("_", "-").lower() in ("utf-8", "utf8"):
        return stream
    try:
        fd = os.dup(stream.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return stream
    stream.flush()
    return open(fd, "w", encoding="utf-8", errors="backslashreplace", buffering=1)


if sys.platform == "win32":
    import ctypes
    import msvcrt
    from ctypes import wintypes

    def _windows() -> Windows:
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        handler_type = ctypes.WINFUNCTYPE(wintypes.BOOL, wintypes.DWORD)
        kept: list[object] = []

        def set_handler(handler: Callable[[int], bool]) -> None:
            function = handler_type(handler)
            kept.append(function)  # ctypes frees the thunk when the object goes: Windows would call freed memory
            if not kernel32.SetConsoleCtrlHandler(function, True):
                raise ctypes.WinError(ctypes.get_last_error())

        def replace(source: str, target: str) -> None:
            # MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH: returns once the rename is on disk.
            if not kernel32.MoveFileExW(source, target, 0x1 | 0x8):
                raise ctypes.WinError(ctypes.get_last_error())

        return Windows(msvcrt, set_handler, socket.SO_EXCLUSIVEADDRUSE, os.O_BINARY, replace)

    HOST_OS: HostOs = _windows()
else:
    import fcntl

    class Posix(HostOs):
        """Linux and other POSIX systems: the calls the code was first written against."""

        open_flags = 0  # os.open descriptors are close-on-exec already (PEP 446)
        fifo_flags = os.O_NONBLOCK  # opening a FIFO put where a file belongs must not wait for its other end
        reuse_address = True  # a restart can bind while the old connections sit in TIME_WAIT

        def datasync(self, fd: int) -> None:
            (getattr(os, "fdatasync", None) or os.fsync)(fd)  # macOS has no fdatasync

        def sync_directory(self, directory: str | os.PathLike[str]) -> None:
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        def replace(self, source: str, target: str) -> None:
            os.replace(source, target)

        def pread(self, fd: int, size: int, offset: int) -> bytes:
            return os.pread(fd, size, offset)

        def pwrite(self, fd: int, data: bytes, offset: int) -> None:
            view = memoryview(data)
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written

        def try_lock(self, fd: int) -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    return False
                raise
            return True

        def on_stop(self, callback: StopCallback) -> None:
            # SIGHUP too: a closed terminal or `kill -HUP` must not skip the orderly stop (spans flushed,
            # "stopping" logged). Nothing is reloaded: the settings come from flags and the environment.
            for signum in STOP_SIGNALS:
                signal.signal(signum, lambda number, frame: callback())

        def on_stop_async(self, loop: asyncio.AbstractEventLoop, callback: StopCallback) -> None:
            for signum in STOP_SIGNALS:
                loop.add_signal_handler(signum, callback)

        def wait_for_stop(self, stop: threading.Event) -> None:
            """Sleep on a wake-up pipe, not on ``stop`` itself: the main thread wakes for every signal, whichever
            thread the kernel gave it to, and runs its handler (the module docstring says why)."""
            if threading.current_thread() is not threading.main_thread():
                stop.wait()  # a handler is only ever run, and the wake-up fd only set, in the main thread
                return
            read, write = os.pipe()
            os.set_blocking(write, False)
            previous = signal.set_wakeup_fd(write)
            try:
                while not stop.is_set():
                    select.select([read], [], [])
                    os.read(read, 4096)  # the signals' numbers; their handlers run as this thread goes on
            finally:
                signal.set_wakeup_fd(previous)
                os.close(read)
                os.close(write)

        def default_state_dir(self, environ: Mapping[str, str]) -> str:
            return "/var/lib/se-exporter"

    HOST_OS = Posix()

DEFAULT_STATE_DIR = HOST_OS.default_state_dir(os.environ)  # read once, where the platform is known
