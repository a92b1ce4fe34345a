"""The platform seam: the POSIX implementation for real, the Windows one on Linux with fake OS functions handed in.

The Windows implementation is also put in place of ``HOST_OS`` in the modules that use it (spool, state files,
instance lock), so that the spool's crash-safety paths run with positional I/O done as seek + read under a lock, no
directory fsync, and deletions refused while a handle is open, as on Windows.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import io
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from se_exporter.infra import dirlock, files, host_os, logs, processwide
from se_exporter.infra.host_os import (
    CTRL_BREAK_EVENT,
    CTRL_C_EVENT,
    CTRL_CLOSE_EVENT,
    CTRL_LOGOFF_EVENT,
    CTRL_SHUTDOWN_EVENT,
    HOST_OS,
    LOCK_OFFSET,
    REPLACE_PATIENCE,
    STOP_SIGNALS,
    Posix,
    Windows,
    utf8_stream,
)
from se_exporter.sidecar.forwarding import spool as spool_module
from se_exporter.sidecar.forwarding.spool import Spool
from tests.conftest import Reliability
from tests.support.fakes.documents import envelope
from tests.support.helpers import free_port, http_get, wait_until

SO_EXCLUSIVEADDRUSE = -5  # winsock2.h: ~SO_REUSEADDR


class FakeMsvcrt:
    """``msvcrt.locking`` as the C runtime does it: a byte range at the current position, EACCES when another
    descriptor holds it."""

    LK_NBLCK = 2

    def __init__(self) -> None:
        self.held: dict[int, int] = {}  # inode -> fd holding the lock
        self.calls: list[tuple[int, int, int]] = []

    def locking(self, fd: int, mode: int, nbytes: int, /) -> None:
        self.calls.append((os.lseek(fd, 0, os.SEEK_CUR), mode, nbytes))
        inode = os.fstat(fd).st_ino
        if self.held.setdefault(inode, fd) != fd:
            raise OSError(errno.EACCES, "Permission denied")


class FakeWindows:
    """A Windows implementation with its OS edges recorded: handlers registered, sleeps taken, files held open."""

    def __init__(self, binary_flag: int = 0, replace: Callable[[str, str], None] = os.replace) -> None:
        self.handlers: list[Callable[[int], bool]] = []
        self.sleeps: list[float] = []
        self.held: set[str] = set()  # paths "open in another process": deleting them is refused
        self.msvcrt = FakeMsvcrt()
        self.platform = Windows(self.msvcrt, self.handlers.append, SO_EXCLUSIVEADDRUSE, binary_flag, replace,
                                sleep=self.sleeps.append, unlink=self._unlink, close_grace=7.0)

    def _unlink(self, path: str | os.PathLike[str]) -> None:
        if os.fspath(path) in self.held:
            raise PermissionError(errno.EACCES, "The process cannot access the file because it is being used",
                                  os.fspath(path))
        os.unlink(path)


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> FakeWindows:
    """The Windows implementation in place of HOST_OS wherever state files, the spool and the lock use it."""
    fake = FakeWindows()
    for module in (files, spool_module, dirlock):
        monkeypatch.setattr(module, "HOST_OS", fake.platform)
    return fake


def test_the_platform_is_chosen_by_sys_platform() -> None:
    """On this Linux machine the POSIX implementation is in use, with the Linux defaults."""
    assert isinstance(HOST_OS, Posix)
    assert (HOST_OS.open_flags, HOST_OS.fifo_flags, HOST_OS.reuse_address) == (0, os.O_NONBLOCK, True)
    assert HOST_OS.default_state_dir({"ProgramData": r"C:\ProgramData"}) == "/var/lib/se-exporter"


def test_posix_positional_io_and_durable_calls(tmp_path: Path) -> None:
    """pread/pwrite leave the file position alone; datasync, directory sync and replace work on a real file."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        HOST_OS.pwrite(fd, b"hello world", 0)
        HOST_OS.pwrite(fd, b"W", 6)
        HOST_OS.datasync(fd)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        assert HOST_OS.pread(fd, 5, 6) == b"World"
    finally:
        os.close(fd)
    HOST_OS.sync_directory(tmp_path)
    (tmp_path / "new").write_bytes(b"new")
    HOST_OS.replace(str(tmp_path / "new"), str(tmp_path / "f"))
    assert (tmp_path / "f").read_bytes() == b"new"


def test_posix_lock_is_exclusive_per_open_file(tmp_path: Path) -> None:
    """flock refuses a second open of the lock file (as a second process would be refused) until the first closes."""
    first = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    second = os.open(tmp_path / "lock", os.O_RDWR)
    try:
        assert HOST_OS.try_lock(first)
        assert not HOST_OS.try_lock(second)
        os.close(first)
        first = -1
        assert HOST_OS.try_lock(second)
    finally:
        os.close(second)
        if first >= 0:
            os.close(first)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_posix_stop_signals_call_the_stop_callback(signum: int) -> None:
    """SIGTERM, SIGINT and SIGHUP each take the stop path (and only set the stop event: the process lives on)."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    stop = threading.Event()
    try:
        HOST_OS.on_stop(stop.set)
        signal.raise_signal(signum)
        assert stop.is_set()
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


@pytest.mark.timeout(30)  # what breaks here is a main thread asleep for good
def test_a_stop_signal_another_thread_takes_still_ends_the_main_threads_wait() -> None:
    """SIGTERM delivered to a thread other than the main one (the kernel may pick any thread of the process): the
    main thread's wait_for_stop wakes and runs the handler. Under an untimed stop.wait() it slept on for good. The
    stop comes only with the tenth signal, so the first ones may come before the main thread sleeps: the later ones
    find it asleep."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run only in the main thread")
    saved = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    stop, handled = threading.Event(), []

    def tenth() -> None:
        handled.append(True)
        if len(handled) == 10:
            stop.set()

    def signal_this_thread() -> None:
        while not stop.is_set():  # to this thread, not the process: the main thread is not interrupted
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            stop.wait(0.05)

    other = threading.Thread(target=signal_this_thread, name="taker")
    try:
        HOST_OS.on_stop(tenth)
        other.start()
        HOST_OS.wait_for_stop(stop)
        assert len(handled) >= 10
    finally:
        stop.set()
        other.join(10)
        for number, handler in saved.items():
            signal.signal(number, handler)
    assert signal.set_wakeup_fd(-1) == -1  # the wake-up fd it set is put back


def test_posix_stop_signals_reach_an_event_loop() -> None:
    """In an asyncio program (consume, fleet) SIGTERM sets the stop event in the loop's thread."""
    async def main() -> bool:
        stop = asyncio.Event()
        HOST_OS.on_stop_async(asyncio.get_running_loop(), stop.set)
        signal.raise_signal(signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 10)
        return stop.is_set()

    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        assert asyncio.run(main())
    finally:  # closing the loop removes its handlers, but sets the default, not what was there (nohup: SIGHUP ignored)
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_posix_listener_keeps_reuse_and_serves_ipv4_on_ipv6_any() -> None:
    """[::] is dual stack (IPV6_V6ONLY off) and no Windows-only option is touched."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        HOST_OS.prepare_listener(sock)
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0


def test_windows_defaults_come_from_its_arguments_and_programdata() -> None:
    """Binary-mode opens, no non-blocking flag, no SO_REUSEADDR, state under %ProgramData%."""
    platform = FakeWindows(binary_flag=0x8000).platform
    assert (platform.open_flags, platform.fifo_flags, platform.reuse_address) == (0x8000, 0, False)
    assert platform.default_state_dir({"ProgramData": "D:\\Data\\"}) == "D:\\Data\\se-exporter"
    assert platform.default_state_dir({}) == "C:\\ProgramData\\se-exporter"


def test_windows_replace_retries_while_the_target_is_held_then_succeeds(tmp_path: Path) -> None:
    """Access denied twice (a scanner holds the file), then the replace goes through: no error reaches the caller."""
    refusals = [PermissionError(errno.EACCES, "denied"), PermissionError(errno.EACCES, "denied")]

    def replace(source: str, target: str) -> None:
        if refusals:
            raise refusals.pop()
        os.replace(source, target)

    fake = FakeWindows(replace=replace)
    (tmp_path / "temp").write_bytes(b"new")
    fake.platform.replace(str(tmp_path / "temp"), str(tmp_path / "state"))
    assert (tmp_path / "state").read_bytes() == b"new"
    assert len(fake.sleeps) == 2


def test_windows_replace_gives_up_after_its_patience() -> None:
    """A target held for good fails with the PermissionError after about REPLACE_PATIENCE seconds of retries."""
    def replace(source: str, target: str) -> None:
        raise PermissionError(errno.EACCES, "denied")

    fake = FakeWindows(replace=replace)
    with pytest.raises(PermissionError):
        fake.platform.replace("a", "b")
    assert REPLACE_PATIENCE <= sum(fake.sleeps) < REPLACE_PATIENCE + 0.5


def test_windows_positional_io_is_seek_and_read_under_a_lock(tmp_path: Path) -> None:
    """Reads and writes at offsets from many threads at once each get their own bytes (no interleaved seeks)."""
    platform = FakeWindows().platform
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        def writer(index: int) -> None:
            for _ in range(200):
                platform.pwrite(fd, bytes([index]) * 64, index * 64)
                assert platform.pread(fd, 64, index * 64) == bytes([index]) * 64

        threads = [threading.Thread(target=writer, args=(index,)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert platform.pread(fd, 8 * 64 + 10, 0) == b"".join(bytes([i]) * 64 for i in range(8))
    finally:
        os.close(fd)


def test_windows_lock_takes_a_byte_past_the_pid(tmp_path: Path) -> None:
    """msvcrt.locking is called non-blocking on one byte at LOCK_OFFSET; EACCES from another holder means busy."""
    fake = FakeWindows()
    first = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    second = os.open(tmp_path / "lock", os.O_RDWR)
    try:
        assert fake.platform.try_lock(first)
        assert not fake.platform.try_lock(second)
        assert fake.msvcrt.calls == [(LOCK_OFFSET, FakeMsvcrt.LK_NBLCK, 1)] * 2
    finally:
        os.close(first)
        os.close(second)


def test_windows_lock_errors_other_than_busy_are_raised(tmp_path: Path) -> None:
    """A lock that fails for another reason (here EBADF) is an error, not a busy directory."""
    class Broken(FakeMsvcrt):
        def locking(self, fd: int, mode: int, nbytes: int, /) -> None:
            raise OSError(errno.EBADF, "bad descriptor")

    platform = Windows(Broken(), lambda handler: None, SO_EXCLUSIVEADDRUSE, 0, os.replace)
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(OSError, match="bad descriptor"):
            platform.try_lock(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("event", [CTRL_C_EVENT, CTRL_BREAK_EVENT, CTRL_CLOSE_EVENT, CTRL_SHUTDOWN_EVENT])
def test_windows_console_control_events_take_the_stop_path(event: int) -> None:
    """Ctrl+C (what the service wrapper sends), Ctrl+Break, close and shutdown set the stop event and are handled;
    close and shutdown hold the handler (Windows ends the process when it returns) while the stop runs."""
    fake = FakeWindows()
    stop = threading.Event()
    fake.platform.on_stop(stop.set)
    assert fake.handlers[0](event) is True
    assert stop.is_set()
    assert fake.sleeps == ([7.0] if event in (CTRL_CLOSE_EVENT, CTRL_SHUTDOWN_EVENT) else [])


def test_windows_logoff_is_not_a_stop() -> None:
    """A user logging off (sent to every service) is handled without stopping the sidecar."""
    fake = FakeWindows()
    stop = threading.Event()
    fake.platform.on_stop(stop.set)
    assert fake.handlers[0](CTRL_LOGOFF_EVENT) is True
    assert not stop.is_set()


def test_windows_console_event_from_another_thread_wakes_an_untimed_wait() -> None:
    """The handler runs in a thread Windows creates: it sets the event, and the main thread's Event.wait() with no
    timeout returns (no periodic wake-up is needed to notice the stop)."""
    fake = FakeWindows()
    stop = threading.Event()
    fake.platform.on_stop(stop.set)
    threading.Thread(target=fake.handlers[0], args=(CTRL_C_EVENT,)).start()
    assert stop.wait()


def test_windows_console_event_reaches_an_event_loop() -> None:
    """consume and fleet: a control event from a foreign thread sets the asyncio stop event in the loop's thread."""
    fake = FakeWindows()

    async def main() -> bool:
        stop = asyncio.Event()
        fake.platform.on_stop_async(asyncio.get_running_loop(), stop.set)
        threading.Thread(target=fake.handlers[0], args=(CTRL_BREAK_EVENT,)).start()
        await asyncio.wait_for(stop.wait(), 10)
        return stop.is_set()

    assert asyncio.run(main())


class RecordingSocket:
    family = socket.AF_INET

    def __init__(self) -> None:
        self.options: list[tuple[int, int, int]] = []

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.options.append((level, option, value))


def test_windows_listener_asks_for_exclusive_address_use() -> None:
    """SO_EXCLUSIVEADDRUSE is set before bind, and the HTTP server is told not to set SO_REUSEADDR."""
    fake = FakeWindows()
    sock: Any = RecordingSocket()
    fake.platform.prepare_listener(sock)
    assert sock.options == [(socket.SOL_SOCKET, SO_EXCLUSIVEADDRUSE, 1)]
    assert fake.platform.reuse_address is False


def test_spool_works_through_the_windows_implementation(tmp_path: Path, windows: FakeWindows) -> None:
    """Append, read, acknowledge, restart: the cursor and records go through seek + read/write, and no directory is
    opened to be fsynced."""
    spool = Spool(tmp_path, 1 << 20, segment_bytes=400)
    for sequence in range(1, 7):
        spool.append(envelope(sequence))
    assert [e.sequence for e in spool.peek(3)] == [1, 2, 3]
    spool.remove(map(envelope, [1, 2, 3]))
    reopened = Spool(tmp_path, 1 << 20, segment_bytes=400)
    assert [e.sequence for e in reopened.peek(10)] == [4, 5, 6]
    assert not windows.sleeps


def test_a_segment_held_open_is_deleted_once_released(tmp_path: Path, windows: FakeWindows,
                                                      reliability: Reliability) -> None:
    """Windows refuses to delete a file while a handle is open on it: the acknowledged segment stays known and is
    deleted by a later remove or peek once it is released, and the spool goes on meanwhile."""
    spool = Spool(tmp_path, 1 << 20, segment_bytes=1)  # one record per segment
    for sequence in (1, 2, 3):
        spool.append(envelope(sequence))
    first = str(spool._segment_path(1))
    windows.held.add(first)
    spool.remove([envelope(1)])
    assert os.path.exists(first)
    assert [e.sequence for e in spool.peek(10)] == [2, 3]
    windows.held.clear()
    spool.remove([envelope(2)])
    assert not os.path.exists(first)
    assert sorted(p.name for p in tmp_path.glob("*.seg")) == [f"{3:020d}.seg"]
    reliability("Windows (on Linux, through the platform seam)", "an acknowledged spool segment held open by another "
                "process (deletion refused, as on Windows)", "the spool went on; the segment was deleted once released")


def test_data_files_are_opened_with_the_platforms_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The platform's open flags (O_BINARY on Windows) reach the spool's segment and cursor files and the lock file:
    shown here with O_SYNC in its place, which the kernel reports back."""
    fake = FakeWindows(binary_flag=os.O_SYNC)
    for module in (spool_module, dirlock):
        monkeypatch.setattr(module, "HOST_OS", fake.platform)
    spool = Spool(tmp_path / "spool", 1 << 20)
    spool.append(envelope(1))
    lock = dirlock.lock_directory(tmp_path / "state")
    try:
        for fd in (spool._acked_fd, spool._writer, lock.fileno()):
            assert fd is not None
            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_SYNC == os.O_SYNC
    finally:
        lock.close()


def test_the_windows_lock_refuses_a_second_instance_naming_the_first(tmp_path: Path, windows: FakeWindows) -> None:
    """Through the Windows implementation the directory lock is exclusive and the pid beside the lock is readable."""
    with dirlock.lock_directory(tmp_path), pytest.raises(dirlock.DirectoryBusy) as busy:
        dirlock.lock_directory(tmp_path)
    assert busy.value.pid == os.getpid()


def test_state_files_are_replaced_through_the_platform(tmp_path: Path, windows: FakeWindows) -> None:
    """write_atomically uses the platform's replace (retried on Windows) and needs no directory handle."""
    files.write_atomically(tmp_path / "state.json", b"one")
    files.write_atomically(tmp_path / "state.json", b"two")
    assert files.read_state_file(tmp_path / "state.json") == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_logs_are_utf8_when_stderr_is_cp1252(tmp_path: Path) -> None:
    """A cp1252 stderr (a Windows service's redirect) gets a UTF-8 writer on a copy of its descriptor: names in any
    script arrive intact, and closing that writer leaves the original stream open."""
    with open(tmp_path / "stderr", "w", encoding="cp1252") as stderr:
        stream = utf8_stream(stderr)
        assert stream is not None and stream is not stderr
        stream.write("Zürich 東京 ✓\n")
        stream.close()
        stderr.write("still open\n")
    assert (tmp_path / "stderr").read_bytes() == "Zürich 東京 ✓\nstill open\n".encode()


def test_a_utf8_stderr_is_used_as_it_is() -> None:
    """Linux's usual UTF-8 stderr (and pytest's capture) is not wrapped; no stderr stays None."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    assert utf8_stream(stream) is stream
    assert utf8_stream(None) is None


def test_without_stderr_logs_go_to_a_file_in_the_state_directory(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A process with no stderr (pythonw.exe, some service hosts) writes its log lines to se-exporter.log instead of
    dropping them."""
    monkeypatch.setattr("sys.stderr", None)
    monkeypatch.setattr("se_exporter.infra.host_os.DEFAULT_STATE_DIR", str(tmp_path))
    with processwide.restored():  # the logging set-up is put back afterwards
        logs.setup("info", "text")
        logging.getLogger("se_exporter").info("stopping à l'heure")
        (handler,) = logging.getLogger().handlers
        assert isinstance(handler, logging.StreamHandler)
        handler.stream.close()
    assert "stopping à l'heure" in (tmp_path / "se-exporter.log").read_text(encoding="utf-8")


def test_the_module_picks_its_implementation_once() -> None:
    """HOST_OS is one object for the process: everything imports that same object."""
    assert files.HOST_OS is host_os.HOST_OS is dirlock.HOST_OS is spool_module.HOST_OS


def test_a_console_control_event_stops_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str],
                                                    reliability: Reliability) -> None:
    """The whole sidecar with the Windows implementation: Ctrl+C from the service wrapper arrives in a thread of its
    own, and ``run`` takes the SIGTERM path (serving until then, "stopping" logged, the demo summary, exit 0)."""
    from se_exporter import cli  # noqa: PLC0415 - the CLI and everything it wires, only for this test

    fake = FakeWindows()
    monkeypatch.setattr(cli, "HOST_OS", fake.platform)
    port = free_port()
    answers: list[int] = []

    def stop_when_serving() -> None:
        wait_until(lambda: fake.handlers, what="the stop handler")
        answers.append(wait_until(lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200, what="/healthz"))
        fake.handlers[0](CTRL_C_EVENT)

    threading.Thread(target=stop_when_serving, daemon=True).start()
    code = cli.main(["run", "--simulate", "demo", "--listen", f"127.0.0.1:{port}", "--state-dir",
                     str(tmp_path / "state"), "--otel-traces-exporter", "none"])  # puts back hooks and logging
    assert code == 0 and answers == [True]
    assert "stopping" in capsys.readouterr().err
    reliability("Windows (on Linux, through the platform seam)",
                "the wrapper's Ctrl+C as a console control event, from a thread of its own, to a serving sidecar",
                "run stopped in order: 'stopping' logged, exit 0")


def test_the_http_server_binds_through_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the Windows implementation the HTTP server's socket gets the exclusive-use option before bind and no
    SO_REUSEADDR (shown with SO_KEEPALIVE standing in for SO_EXCLUSIVEADDRUSE, which Linux does not know)."""
    from se_exporter.infra import http_server as app  # noqa: PLC0415 - the HTTP server, only for this test
    from se_exporter.infra.options import Listen  # noqa: PLC0415

    platform = Windows(FakeMsvcrt(), lambda handler: None, socket.SO_KEEPALIVE, 0, os.replace)
    monkeypatch.setattr(app, "HOST_OS", platform)
    server = app.serve(Listen("127.0.0.1", 0), app.pages({}))
    try:
        assert server.socket.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert server.socket.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 0
    finally:
        server.shutdown()
        server.server_close()
    monkeypatch.undo()
    linux = app.serve(Listen("127.0.0.1", 0), app.pages({}))
    try:
        assert linux.socket.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1  # the POSIX default is kept
    finally:
        linux.shutdown()
        linux.server_close()


def test_a_held_acknowledged_segment_does_not_stop_start_up(tmp_path: Path, windows: FakeWindows) -> None:
    """A segment with nothing left to send that another process holds at start-up (a scanner) is left for later
    instead of failing the spool: it opens, and the segment goes on the next pass once released."""
    spool = Spool(tmp_path, 1 << 20, segment_bytes=1)
    spool.append(envelope(1))
    spool.append(envelope(2))
    first = str(spool._segment_path(1))
    windows.held.add(first)
    spool.remove([envelope(1)])
    reopened = Spool(tmp_path, 1 << 20, segment_bytes=1)
    assert os.path.exists(first) and [e.sequence for e in reopened.peek(10)] == [2]
    windows.held.clear()
    reopened.remove([envelope(2)])
    assert not list(tmp_path.glob("*.seg"))


def test_the_lock_file_names_this_process_over_a_longer_old_pid(tmp_path: Path, windows: FakeWindows) -> None:
    """The pid is written at a fixed width without truncating the file (Windows may refuse to cut a file with a locked
    range): a longer pid left by an earlier holder does not garble it."""
    (tmp_path / dirlock.LOCK_FILE).write_text("4294967295123\n")
    with dirlock.lock_directory(tmp_path), pytest.raises(dirlock.DirectoryBusy) as busy:
        dirlock.lock_directory(tmp_path)
    assert busy.value.pid == os.getpid()
