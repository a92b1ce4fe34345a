"""Integration tests start real peers and need the integration dependencies (python-qpid-proton for the AMQP test
server, Azurite, Prometheus). A unit run (``-m "not integration"``, ``make unit``) does not even import these modules,
so it needs none of them: every test here is marked integration and would be deselected anyway."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("markexpr").strip() == "not integration":
        return True
    return None
