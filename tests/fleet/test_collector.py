"""The fleet's /metrics families, read from a fresh registry: labels, counts, countdown, and series that vanish."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from se_exporter.fleet.collector import FleetMetrics, PartitionCollector, PartitionView
from se_exporter.fleet.message import read_message
from se_exporter.fleet.scrape import FleetExposition, scrape
from se_exporter.fleet.vms import Fleet
from se_exporter.infra.http_server import serve
from se_exporter.infra.options import Listen
from tests.fleet.reference_exposition import fleet_text, text
from tests.fleet.test_vms import EMPTY, FREEZE, NEIGHBOUR, props
from tests.support.helpers import Samples, http_get, parse_samples

NOW = 2_000_000_000.0
REBOOT = (b'{"DocumentIncarnation": 9, "Events": [{"EventId": "R1", "EventType": "Reboot", "Resources": ["ss_2"], '
          b'"EventStatus": "Started", "NotBefore": "", "EventSource": "User"}]}')


def registry_for(views: dict[str, PartitionView] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry()
    FleetMetrics(registry)
    registry.register(PartitionCollector(lambda: views or {}, lambda: 4, clock=lambda: NOW))
    return registry


class Scrape:
    """The per-VM families as /metrics writes them, read back with prometheus-client's own parser."""

    def __init__(self, fleet: Fleet) -> None:
        self.text = fleet_text(fleet, NOW)
        self.samples: Samples = parse_samples(self.text)

    def get(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.samples.get((name, frozenset((labels or {}).items())))


def add(fleet: Fleet, partition_id: str, body: bytes, vm_id: str, vm_name: str, vmss: str = "") -> None:
    properties = {**props(), b"vm_id": vm_id.encode(), b"vm_name": vm_name.encode(), b"vmss_name": vmss.encode()}
    assert fleet.apply(partition_id, read_message(body, properties, f"{vm_id}:1".encode(), vm_id.encode(), 1500.0,
                                                  1 << 20)) == "applied"


def fleet_of_three() -> Fleet:
    fleet = Fleet()
    fleet.claim("0")
    fleet.claim("1")
    add(fleet, "0", FREEZE, "id0", "WestNO_0")
    add(fleet, "0", NEIGHBOUR, "id2", "WestNO_2")  # lists the Freeze, for WestNO_1 only
    add(fleet, "1", REBOOT, "id9", "ss_2", vmss="ss")
    return fleet


def test_each_vm_and_event_is_one_series_with_its_labels() -> None:
    """event_info carries the VM's identity and the event's labels; countdown and duration are per VM and event."""
    get = Scrape(fleet_of_three()).get
    assert get("azure_scheduled_fleet_event_info", {
        "vm_id": "id0", "vm_name": "WestNO_0", "vmss_name": "", "location": "norwayeast", "event_id": "e1",
        "event_type": "Freeze", "event_status": "Scheduled", "event_source": "Platform",
        "affects_this_vm": "true"}) == 1
    assert get("azure_scheduled_fleet_event_info", {
        "vm_id": "id2", "vm_name": "WestNO_2", "vmss_name": "", "location": "norwayeast", "event_id": "e1",
        "event_type": "Freeze", "event_status": "Scheduled", "event_source": "Platform",
        "affects_this_vm": "false"}) == 1
    assert get("azure_scheduled_fleet_event_seconds_until_not_before", {"vm_id": "id0", "event_id": "e1"}) == \
        2547224987.0 - NOW
    assert get("azure_scheduled_fleet_event_duration_seconds", {"vm_id": "id0", "event_id": "e1"}) == 5
    # A started event has no NotBefore, and this one no duration: no series rather than a made-up value.
    assert get("azure_scheduled_fleet_event_seconds_until_not_before", {"vm_id": "id9", "event_id": "r1"}) is None
    assert get("azure_scheduled_fleet_event_duration_seconds", {"vm_id": "id9", "event_id": "r1"}) is None
    assert get("azure_scheduled_fleet_vm_last_seen_timestamp_seconds", {
        "vm_id": "id9", "vm_name": "ss_2", "vmss_name": "ss", "location": "norwayeast"}) == 1500.0


def test_fleet_counts_only_vms_an_event_concerns() -> None:
    """VMs known, VMs pending by type and status, and an event's blast radius leave out a neighbour's listing."""
    get = Scrape(fleet_of_three()).get
    assert get("azure_scheduled_fleet_vms") == 3
    assert get("azure_scheduled_fleet_pending_vms", {"event_type": "Freeze", "event_status": "Scheduled"}) == 1
    assert get("azure_scheduled_fleet_pending_vms", {"event_type": "Reboot", "event_status": "Started"}) == 1
    assert get("azure_scheduled_fleet_pending_vms", {"event_type": "Redeploy", "event_status": "Scheduled"}) == 0
    assert get("azure_scheduled_fleet_event_vms", {"event_id": "e1", "event_type": "Freeze"}) == 1
    assert get("azure_scheduled_fleet_event_vms", {"event_id": "r1", "event_type": "Reboot"}) == 1


def test_series_vanish_with_their_event_their_vm_and_their_partition() -> None:
    """A completed event, then a released partition, leave /metrics without any bookkeeping."""
    fleet = fleet_of_three()
    properties = {**props(sequence=2), b"vm_id": b"id0", b"vm_name": b"WestNO_0"}
    fleet.apply("0", read_message(EMPTY, properties, b"id0:2", properties[b"vm_id"], 1600.0, 1 << 20))
    scrape = Scrape(fleet)
    assert scrape.get("azure_scheduled_fleet_vm_last_seen_timestamp_seconds", {
        "vm_id": "id0", "vm_name": "WestNO_0", "vmss_name": "", "location": "norwayeast"}) == 1600.0
    assert [labels for (name, labels) in scrape.samples if name == "azure_scheduled_fleet_event_info"
            and ("vm_id", "id0") in labels] == []
    assert scrape.get("azure_scheduled_fleet_event_vms", {"event_id": "e1", "event_type": "Freeze"}) is None
    fleet.release("1")
    scrape = Scrape(fleet)
    assert "id9" not in scrape.text and "r1" not in scrape.text
    assert scrape.get("azure_scheduled_fleet_vms") == 2


def test_partition_gauges_follow_what_the_consumer_knows() -> None:
    """Owned partitions, lag as the SDK said, and how long handled events wait for a checkpoint."""
    views = {"0": PartitionView(lag_events=12, lag_seconds=3.5, unsaved_since=NOW - 7),
             "1": PartitionView()}
    get = registry_for(views).get_sample_value
    assert get("azure_scheduled_fleet_owned_partitions") == 2
    assert get("azure_scheduled_fleet_hub_partitions") == 4
    assert get("azure_scheduled_fleet_partition_lag_events", {"partition_id": "0"}) == 12
    assert get("azure_scheduled_fleet_partition_lag_seconds", {"partition_id": "0"}) == 3.5
    assert get("azure_scheduled_fleet_partition_checkpoint_age_seconds", {"partition_id": "0"}) == 7
    assert get("azure_scheduled_fleet_partition_checkpoint_age_seconds", {"partition_id": "1"}) == 0
    assert get("azure_scheduled_fleet_partition_lag_events", {"partition_id": "1"}) is None


def test_counters_exist_at_zero_from_the_start() -> None:
    """rate() and alerts see the first invalid message or duplicate, not a series appearing from nothing."""
    get = registry_for().get_sample_value
    for reason in ("too_large", "not_json", "invalid_document", "not_envelope"):
        assert get("azure_scheduled_fleet_invalid_messages_total", {"reason": reason}) == 0
    assert get("azure_scheduled_fleet_duplicate_documents_total", {"reason": "resend"}) == 0
    assert get("azure_scheduled_fleet_documents_applied_total", {"kind": "heartbeat"}) == 0
    assert get("azure_scheduled_fleet_vm_expirations_total") == 0


def test_label_values_are_escaped_and_the_text_parses() -> None:
    """A VM name with a quote, a backslash or a newline cannot break the exposition."""
    fleet = Fleet()
    fleet.claim("0")
    add(fleet, "0", FREEZE, 'id"1', 'bad\\name\n"x"')
    scrape = Scrape(fleet)
    assert scrape.get("azure_scheduled_fleet_vm_last_seen_timestamp_seconds", {
        "vm_id": 'id"1', "vm_name": 'bad\\name\n"x"', "vmss_name": "", "location": "norwayeast"}) == 1500.0


def test_every_family_has_help_and_type_even_when_empty() -> None:
    """An empty fleet still declares its families, so Prometheus and the dashboards see them from the start."""
    text = Scrape(Fleet()).text
    for name in ("vms", "pending_vms", "event_vms", "event_info", "event_seconds_until_not_before",
                 "event_duration_seconds", "vm_last_seen_timestamp_seconds"):
        assert f"# TYPE azure_scheduled_fleet_{name} gauge" in text
    assert "azure_scheduled_fleet_vms 0.0" in text
    assert generate_latest(registry_for()).decode().count("# TYPE") >= 10


def test_vms_that_cannot_read_imds_are_counted_and_listed_older_sidecars_are_not() -> None:
    """imds_unreachable_vms counts VMs whose sidecar says its poll fails (or whose last read is stale); each is
    listed with its last successful read; a VM without the properties (an older sidecar) is neither."""
    fleet = Fleet()
    fleet.claim("0")
    observed = "2026-11-22T03:04:28.024Z"
    for vm_id, extra in (("blind", {"imds_failing": True, "imds_last_success": "2026-11-22T03:00:00.000Z"}),
                         ("never", {"imds_failing": True}),
                         ("fine", {"imds_failing": False, "imds_last_success": observed}),
                         ("old", {})):
        properties = {**props(observed_at=observed, **extra), b"vm_id": vm_id.encode(), b"vm_name": vm_id.encode()}
        fleet.apply("0", read_message(EMPTY, properties, f"{vm_id}:1".encode(), vm_id.encode(), 1500.0, 1 << 20))
    get = Scrape(fleet).get
    assert get("azure_scheduled_fleet_imds_unreachable_vms") == 2
    since = "azure_scheduled_fleet_vm_imds_unreachable_since_timestamp_seconds"
    labels = {"vmss_name": "", "location": "norwayeast"}
    assert get(since, {"vm_id": "blind", "vm_name": "blind", **labels}) == 1795316400.0
    assert get(since, {"vm_id": "never", "vm_name": "never", **labels}) == 0
    assert get(since, {"vm_id": "fine", "vm_name": "fine", **labels}) is None
    assert get(since, {"vm_id": "old", "vm_name": "old", **labels}) is None
    assert "# TYPE azure_scheduled_fleet_imds_unreachable_vms gauge" in Scrape(Fleet()).text


def test_a_surrogate_event_id_renders_as_utf8() -> None:
    """An EventId that is an unpaired surrogate in the JSON is shown spelt out, and the exposition encodes."""
    fleet = Fleet()
    fleet.claim("0")
    add(fleet, "0", FREEZE.replace(b'"E1"', b'"\\udc00"'), "id1", "WestNO_0")
    written = fleet_text(fleet, NOW)
    written.encode("utf-8")
    assert 'event_id="\\\\udc00"' in written


def test_state_and_bound_counters_exist_at_zero_and_newer_format_partitions_are_counted() -> None:
    """Damaged state and bounds reached are counted from zero; a partition with a newer release's state shows."""
    get = registry_for({"0": PartitionView(newer_format=True), "1": PartitionView()}).get_sample_value
    for reason in ("unreadable", "wrong_shape", "format", "row", "position"):
        assert get("azure_scheduled_fleet_state_damaged_total", {"reason": reason}) == 0
    for bound in ("vms_per_partition", "vms_per_installation", "events_per_vm", "body_bytes", "label_length"):
        assert get("azure_scheduled_fleet_bound_hits_total", {"bound": bound}) == 0
    for reason in ("bad_property", "wrong_partition_key", "internal_error"):
        assert get("azure_scheduled_fleet_invalid_messages_total", {"reason": reason}) == 0
    assert get("azure_scheduled_fleet_state_newer_format_partitions") == 1


def test_batch_counts_are_exact_whenever_the_registry_is_read_even_while_batches_arrive() -> None:
    """What each batch counts is queued and added when the registry is collected (or flushed): a read right after
    a batch sees it, and batches queued from the consumer's thread while scrapes collect from another are each
    counted once, none lost."""
    registry = CollectorRegistry()
    metrics = FleetMetrics(registry)
    metrics.batch(3, 1, 2, 100.0)
    metrics.batch(1, 0, 0, None)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"azure_scheduled_fleet_{name}", labels)

    assert value("documents_consumed_total") == 4 and value("last_applied_timestamp_seconds") == 100.0
    assert value("documents_applied_total", kind="change") == 1
    assert value("documents_applied_total", kind="heartbeat") == 2

    def consumer() -> None:
        for n in range(20_000):
            metrics.batch(1, n % 2, 1 - n % 2, float(n))

    thread = threading.Thread(target=consumer)
    thread.start()
    while thread.is_alive():
        registry.get_sample_value("azure_scheduled_fleet_documents_consumed_total")  # a scrape, meanwhile
    thread.join()
    metrics.flush()
    assert value("documents_consumed_total") == 20_004 and value("last_applied_timestamp_seconds") == 19_999.0
    assert value("documents_applied_total", kind="change") == 10_001
    assert value("documents_applied_total", kind="heartbeat") == 10_002


def test_every_family_of_the_fleets_metrics_is_selected_by_its_name() -> None:
    """The fleet's /metrics (its registry, per-VM and platform families) answers ``/metrics?name[]=N`` over HTTP
    with exactly the series named N of the whole page, for every series name on it, and several names at once."""
    from se_exporter.fleet.main import make_http_app  # noqa: PLC0415 - brings the Azure SDKs
    from se_exporter.fleet.platform.exposition import PlatformCollector  # noqa: PLC0415
    from se_exporter.fleet.platform.service import LastReconciliation, Platform  # noqa: PLC0415
    from se_exporter.fleet.report import Report  # noqa: PLC0415

    fleet = fleet_of_three()
    fleet.show("0")
    fleet.show("1")
    registry = CollectorRegistry(auto_describe=True)  # as the fleet's: the process collector has no describe()
    metrics = FleetMetrics(registry)
    registry.register(PartitionCollector(lambda: {"0": PartitionView(1, 1, 1)}, lambda: 2, clock=lambda: NOW))
    ProcessCollector(registry=registry)
    platform = Platform(metrics, Report(metrics), 3600.0, 60.0, 900.0, 1024, lambda: NOW)
    platform.view = LastReconciliation(sizes={"events": 3})  # a platform gauge with a series
    registry.register(PlatformCollector(lambda: platform.view))
    service = SimpleNamespace(healthy=True, ready=True, storage_problem=None)
    running = serve(Listen("127.0.0.1", 0), make_http_app(registry, [fleet], [service],  # type: ignore[list-item]
                                                          clock=lambda: NOW))
    url = f"http://127.0.0.1:{running.server_port}/metrics"
    try:
        whole = series_by_name(http_get(url)[1])
        assert {"azure_scheduled_fleet_vms", "azure_scheduled_fleet_event_info",
                "azure_scheduled_fleet_owned_partitions", "azure_scheduled_fleet_documents_applied_total",
                "azure_scheduled_fleet_platform_events_total", "azure_scheduled_fleet_platform_kept",
                "azure_scheduled_fleet_announcement_lag_seconds_bucket", "process_cpu_seconds_total"} <= whole.keys()
        for name, series in sorted(whole.items()):
            status, text = http_get(f"{url}?name[]={name}")
            assert status == 200
            assert series_by_name(text) == {name: series}, name
        both = http_get(f"{url}?name[]=azure_scheduled_fleet_vms&name[]=azure_scheduled_fleet_event_info")[1]
        assert series_by_name(both).keys() == {"azure_scheduled_fleet_vms", "azure_scheduled_fleet_event_info"}
    finally:
        running.server_close()


def test_a_scrape_filtered_by_name_reads_the_queued_batch_counts_and_only_the_families_named() -> None:
    """``scrape`` with names: the batch counters read exact (their queue flushed, as for a whole scrape), and of
    the registry's and the per-VM families only those named."""
    registry = CollectorRegistry()
    metrics = FleetMetrics(registry)
    metrics.batch(3, 1, 2, 100.0)
    names = ["azure_scheduled_fleet_documents_consumed_total", "azure_scheduled_fleet_vms"]
    written = text(scrape(registry, FleetExposition(fleet_of_three()), NOW, names))
    assert series_by_name(written).keys() == set(names)
    assert parse_samples(written) == {("azure_scheduled_fleet_documents_consumed_total", frozenset()): 3.0,
                                      ("azure_scheduled_fleet_vms", frozenset()): 3.0}


def series_by_name(text: str) -> dict[str, set[frozenset[tuple[str, str]]]]:
    """The label sets of each series name of an exposition (values change between two scrapes; series do not)."""
    series: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, set()).add(frozenset(sample.labels.items()))
    return series
def test_one_event_id_in_two_letter_cases_is_one_series_of_both_vms() -> None:
    """Two VMs listing one GUID, one in upper and one in lower case, are one event_vms series of 2 VMs, labelled in
    the core's canonical case (lower), and their event_info series carry the same event_id."""
    guid = "5D9B2A0E-1C3F-4B7A-9E21-0A4C6D8F1B3E"
    fleet = Fleet()
    fleet.claim("0")
    fleet.claim("1")
    for partition_id, vm_id, spelt in (("0", "id0", guid), ("1", "id1", guid.lower())):
        body = (b'{"DocumentIncarnation": 3, "Events": [{"EventId": "' + spelt.encode() + b'", "EventType": '
                b'"Freeze", "Resources": [], "EventStatus": "Scheduled", "NotBefore": "", "EventSource": "Platform"}]}')
        add(fleet, partition_id, body, vm_id, f"vm_{vm_id}")
    scrape = Scrape(fleet)
    blast = {labels: value for (name, labels), value in scrape.samples.items()
             if name == "azure_scheduled_fleet_event_vms"}
    assert blast == {frozenset({("event_id", guid.lower()), ("event_type", "Freeze")}): 2}
    assert {dict(labels)["event_id"] for (name, labels) in scrape.samples
            if name == "azure_scheduled_fleet_event_info"} == {guid.lower()}
