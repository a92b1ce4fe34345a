"""`se-exporter fleet` start-up while the storage account cannot be reached: it listens and obeys signals first."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from azure.storage.blob.aio import ContainerClient

from se_exporter.core.errors import ConfigError
from se_exporter.infra.azure import storage
from se_exporter.infra.azure.storage import ensure_container
from tests.support.eventhubs_server import EventHubsTestServer
from tests.support.fakes.http_server import ScriptedServer
from tests.support.fleet_helpers import DEV_ACCOUNT, DEV_KEY, FleetProcess
from tests.support.helpers import free_port, http_get, wait_until

pytestmark = pytest.mark.integration


def unreachable_storage() -> str:
    """A connection string whose blob endpoint is a closed loopback port: every connection is refused."""
    return (f"DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{free_port()}/{DEV_ACCOUNT};")


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


class Stop(Exception):
    """Raised by the test's ``sleep`` to end the container check after its first failed attempt."""


async def first_problem(url: str) -> list[str | None]:
    reports: list[str | None] = []

    async def sleep(_seconds: float) -> None:
        raise Stop

    async with ContainerClient(url, "fleet", credential=None) as container:
        with pytest.raises(Stop):
            await ensure_container(container, "fleet", reports.append, sleep=sleep)
    return reports


def test_a_refused_connection_is_reported_as_refused_at_the_first_attempt() -> None:
    """The container check names a closed port "connection refused", after one attempt (the SDK's retries are off,
    so neither its backoff nor a timeout around it hides the cause)."""
    reports = asyncio.run(first_problem(f"http://127.0.0.1:{free_port()}/{DEV_ACCOUNT}"))
    assert reports == ["connection refused"]


def test_a_storage_that_never_answers_is_reported_as_a_timeout(
        silent_listener: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer that accepts and stays silent is reported as a timeout, not as refused."""
    monkeypatch.setattr(storage, "CHECK_TIMEOUT", 0.5)
    reports = asyncio.run(first_problem(f"http://127.0.0.1:{silent_listener}/{DEV_ACCOUNT}"))
    assert reports == ["no answer within 0.5 s (timeout)"]


def test_a_missing_container_that_cannot_be_created_is_a_configuration_error() -> None:
    """A storage account that answers "no such container" and then refuses to create it stops start-up with one
    line naming --checkpoint-container (the check is in the background now, its verdict is not lost)."""
    def answer(status: str) -> bytes:
        return (f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nx-ms-error-code: ContainerNotFound\r\n\r\n"
                if status.startswith("404") else
                f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nx-ms-error-code: AuthorizationFailure\r\n\r\n").encode()

    server = ScriptedServer([answer("404 The specified container does not exist."),
                             answer("403 This request is not authorized to perform this operation.")])
    reports: list[str | None] = []

    async def check() -> None:
        async with ContainerClient(f"{server.url}/{DEV_ACCOUNT}", "fleet", credential=None) as container:
            await ensure_container(container, "fleet", reports.append)
    try:
        with pytest.raises(ConfigError, match=r"^--checkpoint-container fleet: it does not exist and cannot be"):
            asyncio.run(check())
    finally:
        server.close()
    assert reports == [None]
    assert [request.split(b" ", 1)[0] for request in server.requests] == [b"GET", b"PUT"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_fleet_listens_and_stops_cleanly_while_the_storage_refuses_connections(
        signum: signal.Signals, hubs: Callable[..., EventHubsTestServer], tmp_path: Path) -> None:
    """With the storage account unreachable, fleet still serves /healthz (alive) and /readyz (503, naming the cause),
    logs the real cause, and SIGTERM, SIGINT or SIGHUP in that phase ends it with exit 0 within 10 s, no traceback."""
    replica = FleetProcess(hubs().connection_string(), unreachable_storage(), tmp_path)
    try:
        wait_until(lambda: "connection refused" in replica.log(), timeout=10, what="the container check's warning")
        assert "cannot check the blob container se-exporter-fleet: connection refused" in replica.log()
        assert http_get(replica.base_url + "/healthz") == (200, "consumer loop running\n")
        status, body = http_get(replica.base_url + "/readyz")
        assert (status, body) == (503, "the storage account is unreachable: connection refused\n")
        replica.process.send_signal(signum)
        assert replica.process.wait(timeout=10) == 0
    finally:
        replica.stop()
    assert "Traceback" not in replica.log()


def test_a_busy_listen_port_fails_at_once_with_one_line(tmp_path: Path) -> None:
    """--listen on a port already in use stops start-up with one line, before any storage attempt (the storage here
    is unreachable: a check first would take seconds)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "se_exporter", "fleet", "--listen", f"127.0.0.1:{port}"],
            env={"PATH": "/usr/bin:/bin", "SE_EXPORTER_CHECKPOINT_CONNECTION_STRING": unreachable_storage(),
                 "SE_EXPORTER_EVENTHUB_CONNECTION_STRING":
                     "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0a2V5;"
                     "UseDevelopmentEmulator=true;EntityPath=hub"},
            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"se-exporter: error: --listen 127.0.0.1:{port}: cannot listen there (Address already in use)"]
