"""Timeouts of the outbound clients the project builds itself, where the SDKs' defaults would not apply."""

from __future__ import annotations

import asyncio
from pathlib import Path

from se_exporter.infra.azure.storage import trusting
from tests.support.certs import self_signed_certificate


def test_a_storage_transport_trusting_a_ca_file_keeps_the_storage_sdks_timeouts(tmp_path: Path) -> None:
    """With --checkpoint-ca-file the fleet builds the Blob transport itself: it connects within 20 s and waits at
    most 60 s per read, as the storage SDK's own transport would (azure-core alone would wait 300 s each)."""
    cert, _ = self_signed_certificate(tmp_path)

    async def build() -> tuple[float, float]:
        transport = trusting(str(cert))["transport"]
        try:
            return transport.connection_config.timeout, transport.connection_config.read_timeout
        finally:
            await transport.close()

    assert asyncio.run(build()) == (20.0, 60.0)
