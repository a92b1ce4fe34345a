"""scripts/platform_memory.py keeps working: its smoke mode floods small bounds and reports (no memory target here;
the figures are the script's to print)."""

from __future__ import annotations

from se_exporter.fleet.platform.exposition import NAMED_VMS_TOTAL
from tests.support.helpers import smoke_report


def test_the_platform_memory_script_reports_both_profiles_within_their_bounds() -> None:
    """--smoke exits 0 and reports bytes and series for both profiles, every count at most its bound."""
    report = smoke_report("platform_memory.py")
    limits, settings = report["limits"], report["settings"]
    for profile in ("typical", "worst"):
        figures = report[profile]
        assert figures["picture_bytes"] > 0 and figures["reconciler_bytes"] > 0 and figures["message_bytes"] > 0
        assert figures["records"] <= limits["events"] and figures["vm_names"] <= limits["vms"]
        assert figures["ids"] <= limits["ids"] and figures["forgotten"] <= limits["ids"]
        assert figures["pairs"] <= settings["pairs"] and figures["scopes"] <= settings["scopes"]
        assert figures["announced"] <= settings["ids"]
        named = figures["series"] - 5 * figures["records"]  # the VMs a missed-event alert names, bounded in all
        assert 0 <= named <= NAMED_VMS_TOTAL
