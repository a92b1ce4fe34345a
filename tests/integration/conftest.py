"""Integration tests start real peers and need the integration dependencies (python-qpid-proton for the AMQP test
server, Azurite, Prometheus). A unit run (``-m "not integration"``, ``make unit``) does not even import these modules,
so it needs none of them: every test here is marked integration and would be deselected anyway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.otlp_receiver import OtlpReceiver


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("markexpr").strip() == "not integration":
        return True
    return None


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """An OTLP receiver (traces and logs, HTTP and gRPC) on loopback, for the tests that export to one."""
    server = OtlpReceiver()
    yield server
    server.close()
