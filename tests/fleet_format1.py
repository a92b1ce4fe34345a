"""A replica of the previous release's state handling, as a test fixture: today's codec limited to the formats that
release read and wrote (format 1 only). ``python -m tests.fleet_format1 fleet ...`` runs ``se-exporter fleet`` with
it in place of today's: it writes format 1 whatever ``--state-format`` says, and a format-2 state is a newer
release's to it (left in place, not written over). The rolling-upgrade test
(``tests/integration/test_fleet_upgrade.py``) runs it beside today's replicas.

It is derived, not copied: format 1 is read by the one reader there is, whose format-1 layout is pinned byte for byte
against what the previous release wrote and read (``tests/fleet/test_state_formats.py``), so a change there that the
previous release could not read fails that test rather than passing here in a copy that drifted with it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from se_exporter.fleet import persistence, stateformat, statestore
from se_exporter.fleet.message import DEFAULT_BOUNDS, Bounds, VmState

FORMATS = (1,)  # what the previous release read; it wrote the newest of them


def decode(data: bytes, partition_id: str, now: float, bounds: Bounds = DEFAULT_BOUNDS) -> stateformat.Decoded:
    return stateformat.decode(data, partition_id, now, bounds, formats=FORMATS)


def encode(partition_id: str, position: int, vms: Iterable[VmState], state_format: int = 1) -> bytes:
    return stateformat.encode(partition_id, position, vms, max(FORMATS))


def install() -> None:
    """Today's replica with the previous release's state formats: the state's one reader and one writer rebound."""
    statestore.decode = decode
    persistence.encode = encode  # what the Keeper writes formats 1 and 2 with


if __name__ == "__main__":
    install()
    from se_exporter.__main__ import entry

    sys.exit(entry())
