"""The suite's own guards: a hung test fails at its time limit, and the pytest process talks to loopback only."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import tomllib

from tests.conftest import SHARED_SET_UP
from tests.support import loopback

ROOT = Path(__file__).resolve().parent.parent.parent
METADATA = "169.254.169.254"  # IMDS: the address the suite must never reach


def test_a_hung_test_fails_at_the_time_limit_and_the_run_goes_on(pytester: pytest.Pytester) -> None:
    """pyproject.toml sets a per-test limit (pytest-timeout); a test blocked forever then fails with a stack dump
    instead of hanging the run, and the next test still runs."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 300
    pytester.makepyfile(test_hang="""
        import threading

        def test_blocked_forever():
            threading.Event().wait()

        def test_after():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "timeout=1", timeout=60)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*Timeout*"])


def test_a_connection_to_the_metadata_address_is_refused_before_anything_is_sent() -> None:
    """TCP and UDP connects, a UDP datagram and a name lookup for the IMDS address all raise before reaching the OS:
    the UDP socket is left without a peer (a connect that reached the kernel would have set one, sending nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        with pytest.raises(loopback.NonLoopbackError):
            udp.connect((METADATA, 80))
        with pytest.raises(OSError) as unconnected:
            udp.getpeername()
        assert not isinstance(unconnected.value, loopback.NonLoopbackError)
        with pytest.raises(loopback.NonLoopbackError):
            udp.sendto(b"x", (METADATA, 80))
    with socket.socket() as tcp, pytest.raises(loopback.NonLoopbackError):
        tcp.connect((METADATA, 80))
    with pytest.raises(loopback.NonLoopbackError):
        socket.getaddrinfo(METADATA, 80)
    with pytest.raises(loopback.NonLoopbackError):
        socket.getaddrinfo("management.azure.com", 443)  # no DNS query either
    refused, loopback.REFUSED[:] = list(loopback.REFUSED), []  # seen here: this test is not to fail for them
    assert refused == [f"socket.connect '{METADATA}'", f"socket.sendto '{METADATA}'", f"socket.connect '{METADATA}'",
                       f"socket.getaddrinfo '{METADATA}'", "socket.getaddrinfo 'management.azure.com'"]


def test_loopback_stays_allowed() -> None:
    """127.0.0.1, ::1 and localhost connect as before."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        socket.create_connection(("localhost", listener.getsockname()[1]), timeout=5).close()
        socket.create_connection(("127.0.0.1", listener.getsockname()[1]), timeout=5).close()
    assert loopback.is_loopback("::1") and loopback.is_loopback("::ffff:127.0.0.1")
    assert not loopback.is_loopback("::ffff:169.254.169.254")


def test_a_caught_refusal_still_fails_the_test(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library that catches the refusal and goes on (as HTTP clients' retries do) does not hide it: the test in
    which it happened fails."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_quiet=f"""
        import socket

        def test_swallows_it():
            try:
                socket.create_connection(("{METADATA}", 80), timeout=0.1)
            except OSError:
                pass
    """)
    result = pytester.runpytest_subprocess("-p", "tests.support.loopback", "-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"*non-loopback network use refused: socket.getaddrinfo '{METADATA}'*"])


def test_each_module_kept_whole_on_one_worker_still_has_its_shared_set_up() -> None:
    """Every module that tests/conftest.py sends whole to one pytest-xdist worker (SHARED_SET_UP) exists and has a
    module-scoped fixture, the set-up it is kept together for: a renamed module would silently get its set-up once
    per worker again."""
    for module in SHARED_SET_UP:
        assert '@pytest.fixture(scope="module")' in (ROOT / module).read_text(), module
