"""The VMs the missed-event alerts name (azure_scheduled_fleet_platform_event_missed_vm_info): of open events only,
the first NAMED_VMS by name per event and coverage, at most NAMED_VMS_TOTAL a scrape, live sidecars' first."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from se_exporter.fleet.platform.coverage import Coverage
from se_exporter.fleet.platform.exposition import NAMED_VMS, NAMED_VMS_TOTAL
from se_exporter.fleet.platform.records import PlatformPicture, PlatformRecord
from tests.fleet.platform_helpers import T0, platform_event, platform_text

NAMED = "azure_scheduled_fleet_platform_event_missed_vm_info"


def record(event_id: str, status: str = "Scheduled") -> PlatformRecord:
    picture = PlatformPicture()
    picture.apply(platform_event(status, event_id=event_id), T0)
    [found] = picture.records()
    return found


def rows(rec: PlatformRecord, coverage: str, names: list[str]) -> list[Coverage]:
    return [Coverage(rec.key, rec.event.event_id, rec.event.event_type, name, coverage) for name in names]


def named(text: str) -> list[tuple[str, str, str]]:
    """(event_id, coverage, vm_name) of every named VM, in the order written."""
    return [(s.labels["event_id"], s.labels["coverage"], s.labels["vm_name"])
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == NAMED]


def test_each_vm_that_missed_an_open_event_is_named_once_and_observed_ones_never() -> None:
    """One series per VM and coverage (a VM judged twice is named once), none for VMs that saw it."""
    rec = record("E1")
    coverage = [*rows(rec, "missed", ["web_2", "web_1", "web_2"]), *rows(rec, "observed", ["web_0"]),
                *rows(rec, "no_sidecar", ["web_9"])]
    assert named(platform_text([rec], coverage)) == [("E1", "missed", "web_1"), ("E1", "missed", "web_2"),
                                                    ("E1", "no_sidecar", "web_9")]


def test_an_ended_event_names_no_vm() -> None:
    """Only open events page or warn: an ended one keeps its counts (platform_event_vms), not its names."""
    rec = record("E1", "Completed")
    text = platform_text([rec], rows(rec, "missed", ["web_1"]))
    assert named(text) == []
    assert 'azure_scheduled_fleet_platform_event_vms{coverage="missed",event_id="E1",event_type="Reboot"} 1.0' in text


def test_names_are_bounded_per_event_and_coverage_and_in_all_live_sidecars_first() -> None:
    """A wave of 1,000 VMs names its first NAMED_VMS by name; past NAMED_VMS_TOTAL no more are written, and the VMs
    whose sidecar is alive (missed, imds_unreachable) are named before those without one."""
    wave = record("E-wave")
    assert named(platform_text([wave], rows(wave, "missed", [f"vm_{n:04}" for n in range(1000)]))) == \
        [("E-wave", "missed", f"vm_{n:04}") for n in range(NAMED_VMS)]
    records = [record(f"E{n:03}") for n in range(NAMED_VMS_TOTAL // NAMED_VMS + 5)]
    coverage = [row for rec in records for row in rows(rec, "no_sidecar", [f"{rec.event.event_id}_{n}"
                                                                          for n in range(NAMED_VMS)])]
    coverage += rows(records[-1], "imds_unreachable", ["blind_vm"])
    found = named(platform_text(records, coverage))
    assert len(found) == NAMED_VMS_TOTAL
    assert found[0] == (records[-1].event.event_id, "imds_unreachable", "blind_vm")
