"""The collector's values, read from a fresh registry."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from se_exporter.cli import SimulatedImds
from se_exporter.core.lifecycle import diff
from se_exporter.core.model import EVENT_STATUSES, EVENT_TYPES, VmIdentity, parse_document
from se_exporter.infra.options import Listen
from se_exporter.sidecar.assembly import Sidecar
from se_exporter.sidecar.metrics import Metrics
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import DocumentChange
from se_exporter.sidecar.sinks.transition_metrics import MetricsSink
from se_exporter.sidecar.snapshot import Snapshot
from tests.support.helpers import http_get, wait_until

NOW = 1_649_715_000.0  # 1018 s before the NotBefore below
NOT_BEFORE = 1_649_716_018.0  # Mon, 11 Apr 2022 22:26:58 GMT


def _document(*events: dict[str, object], incarnation: int = 2) -> bytes:
    return json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}).encode()


FREEZE = {"EventId": "C7061BAC", "EventStatus": "Scheduled", "EventType": "Freeze", "ResourceType": "VirtualMachine",
          "Resources": ["WestNO_0", "WestNO_1"], "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
          "Description": "Live migration", "EventSource": "Platform", "DurationInSeconds": 5}
NEIGHBOUR = {"EventId": "F1A3", "EventStatus": "Started", "EventType": "Reboot", "ResourceType": "VirtualMachine",
             "Resources": ["WestNO_1"], "NotBefore": "", "EventSource": "Platform"}


def _registry(snapshot: Snapshot, now: float = NOW) -> tuple[CollectorRegistry, Metrics]:
    registry = CollectorRegistry()
    metrics = Metrics(registry, lambda: snapshot, clock=lambda: now)
    return registry, metrics


def _snapshot(body: bytes, vm_name: str | None = "WestNO_0", **kwargs: object) -> Snapshot:
    document = parse_document(body)
    records = diff({}, document, NOW - 60).records
    return Snapshot(records=records, incarnation=document.incarnation, up=True, has_document=True,
                    last_success=NOW - 1, vm_name=vm_name, api_version="2020-07-01", **kwargs)  # type: ignore[arg-type]


def test_per_event_series() -> None:
    """Each listed event has info, NotBefore, countdown, duration and first-seen series with the contract labels."""
    registry, _ = _registry(_snapshot(_document(FREEZE, NEIGHBOUR)))
    get = registry.get_sample_value
    assert get("azure_scheduled_event_info", {
        "event_id": "C7061BAC", "event_type": "Freeze", "event_status": "Scheduled", "event_source": "Platform",
        "resource_type": "VirtualMachine", "affects_this_vm": "true"}) == 1.0
    assert get("azure_scheduled_event_info", {
        "event_id": "F1A3", "event_type": "Reboot", "event_status": "Started", "event_source": "Platform",
        "resource_type": "VirtualMachine", "affects_this_vm": "false"}) == 1.0
    key = {"event_id": "C7061BAC", "event_type": "Freeze"}
    assert get("azure_scheduled_event_not_before_timestamp_seconds", key) == NOT_BEFORE
    assert get("azure_scheduled_event_seconds_until_not_before", key) == NOT_BEFORE - NOW
    assert get("azure_scheduled_event_duration_seconds", key) == 5.0
    assert get("azure_scheduled_event_first_seen_timestamp_seconds", key) == NOW - 60


def test_started_event_has_no_countdown_and_absent_duration_stays_absent() -> None:
    """Empty NotBefore means no countdown series; a document without DurationInSeconds has no duration series."""
    registry, _ = _registry(_snapshot(_document(NEIGHBOUR)))
    key = {"event_id": "F1A3", "event_type": "Reboot"}
    assert registry.get_sample_value("azure_scheduled_event_seconds_until_not_before", key) is None
    assert registry.get_sample_value("azure_scheduled_event_not_before_timestamp_seconds", key) is None
    assert registry.get_sample_value("azure_scheduled_event_duration_seconds", key) is None
    assert registry.get_sample_value("azure_scheduled_event_started_timestamp_seconds", key) == NOW - 60


def test_countdown_is_computed_at_scrape_time() -> None:
    """seconds_until_not_before follows the clock of the scrape, and goes negative once NotBefore passed."""
    snapshot = _snapshot(_document(FREEZE))
    late, _ = _registry(snapshot, now=NOT_BEFORE + 30)
    assert late.get_sample_value("azure_scheduled_event_seconds_until_not_before",
                                 {"event_id": "C7061BAC", "event_type": "Freeze"}) == -30.0


def test_pending_shows_only_the_combinations_listed() -> None:
    """pending has a series for each type x status x affects_this_vm listed now and none for the others (an idle VM
    exports none: a series costs every VM of a fleet); a neighbour's event is counted apart, under "false"."""
    registry, _ = _registry(_snapshot(_document(FREEZE, NEIGHBOUR)))
    values = {(t, s): registry.get_sample_value("azure_scheduled_events_pending",
                                                {"event_type": t, "event_status": s, "affects_this_vm": "true"})
              for t in EVENT_TYPES for s in EVENT_STATUSES}
    assert values.pop(("Freeze", "Scheduled")) == 1.0
    assert set(values.values()) == {None}
    assert registry.get_sample_value("azure_scheduled_events_pending", {
        "event_type": "Reboot", "event_status": "Started", "affects_this_vm": "false"}) == 1.0
    idle, _ = _registry(_snapshot(_document()))
    assert "azure_scheduled_events_pending" not in generate_latest(idle).decode()  # not even its HELP


def test_a_neighbours_event_is_never_counted_as_this_vms() -> None:
    """A document listing only a neighbour's Reboot shows no Reboot of this VM: pending and the transition counter
    carry it under affects_this_vm="false" (and "unknown" while the VM's name is not known)."""
    registry, metrics = _registry(_snapshot(_document(NEIGHBOUR)))
    get = registry.get_sample_value
    assert get("azure_scheduled_events_pending",
               {"event_type": "Reboot", "event_status": "Started", "affects_this_vm": "true"}) is None
    assert get("azure_scheduled_events_pending",
               {"event_type": "Reboot", "event_status": "Started", "affects_this_vm": "false"}) == 1.0
    body = _document(NEIGHBOUR)
    document = parse_document(body)
    step = diff({}, document, NOW)
    sink = MetricsSink(metrics)
    sink.on_change(DocumentChange(body, document, step.transitions, step.records, NOW, "WestNO_0", None, ""))
    sink.on_change(DocumentChange(body, document, step.transitions, step.records, NOW, None, None, ""))
    for affects, count in (("true", None), ("false", 1.0), ("unknown", 1.0)):
        assert get("azure_scheduled_events_transitions_total",
                   {"event_type": "Reboot", "transition": "started", "affects_this_vm": affects}) == count


def test_unknown_types_get_their_own_pending_series() -> None:
    """An EventType Azure adds later is counted under its own name, not dropped."""
    registry, _ = _registry(_snapshot(_document({**FREEZE, "EventType": "LiveMigrate"})))
    assert registry.get_sample_value("azure_scheduled_events_pending",
                                     {"event_type": "LiveMigrate", "event_status": "Scheduled",
                                      "affects_this_vm": "true"}) == 1.0


def test_series_vanish_with_their_event() -> None:
    """Once the event is gone from the snapshot, none of its series are exposed."""
    state = {"snapshot": _snapshot(_document(FREEZE))}
    registry = CollectorRegistry()
    Metrics(registry, lambda: state["snapshot"], clock=lambda: NOW)
    assert b"C7061BAC" in generate_latest(registry)
    state["snapshot"] = _snapshot(_document(incarnation=3))
    assert b"C7061BAC" not in generate_latest(registry)


def test_health_gauges_while_failing_keep_the_last_state() -> None:
    """up=0 with the last incarnation, events and last-success time still shown."""
    failing = replace(_snapshot(_document(FREEZE)), up=False)
    registry, _ = _registry(failing)
    assert registry.get_sample_value("azure_scheduled_events_up") == 0.0
    assert registry.get_sample_value("azure_scheduled_events_document_incarnation") == 2.0
    assert registry.get_sample_value("azure_scheduled_events_last_success_timestamp_seconds") == NOW - 1
    assert registry.get_sample_value("azure_scheduled_events_pending",
                                     {"event_type": "Freeze", "event_status": "Scheduled",
                                      "affects_this_vm": "true"}) == 1.0


def test_before_any_document() -> None:
    """Before the first valid document: up 0, last success 0, no incarnation series."""
    registry, _ = _registry(Snapshot())
    assert registry.get_sample_value("azure_scheduled_events_up") == 0.0
    assert registry.get_sample_value("azure_scheduled_events_last_success_timestamp_seconds") == 0.0
    assert registry.get_sample_value("azure_scheduled_events_document_incarnation") is None


def test_an_idle_sidecar_exports_no_counter_of_what_never_happened() -> None:
    """Before anything is counted there is no series of any poll outcome, transition, bound or histogram: no type,
    transition or outcome this VM never saw costs a series (the first count of each is held at 0 first:
    tests/infra/test_held.py)."""
    registry, _ = _registry(Snapshot())
    names = {sample.name for family in registry.collect() for sample in family.samples}
    assert not {name for name in names if name.startswith(("azure_scheduled_events_polls",
                                                          "azure_scheduled_events_transitions",
                                                          "azure_scheduled_events_bound_hits",
                                                          "azure_scheduled_events_notice",
                                                          "azure_scheduled_events_poll_duration"))}, names


def test_vm_info_from_identity() -> None:
    """The VM's identity is exposed once known, with --vm-name taking precedence."""
    identity = VmIdentity(name="imds-name", vm_id="id-1", vmss_name="ss", location="westeurope")
    registry, _ = _registry(Snapshot(identity=identity, vm_name="override"))
    assert registry.get_sample_value("azure_scheduled_events_vm_info", {
        "vm_name": "override", "vm_id": "id-1", "vmss_name": "ss", "location": "westeurope",
        "resource_group": "", "subscription_id": "", "vm_size": "", "zone": ""}) == 1.0


def test_metrics_sink_counts_transitions_and_observes_notice_and_impact() -> None:
    """Transitions feed the counters; started observes notice, completed observes impact."""
    registry, metrics = _registry(Snapshot())
    sink = MetricsSink(metrics)
    records: dict[str, object] = {}
    for now, body in ((100.0, _document(FREEZE)), (1000.0, _document({**FREEZE, "EventStatus": "Started",
                                                                         "NotBefore": ""})),
                      (1007.0, _document())):
        document = parse_document(body)
        step = diff(records, document, now)  # type: ignore[arg-type]
        records = dict(step.records)
        sink.on_change(DocumentChange(body, document, step.transitions, step.records, now, "WestNO_0", None, ""))
    get = registry.get_sample_value
    for transition in ("scheduled", "started", "completed"):
        assert get("azure_scheduled_events_transitions_total",
                   {"event_type": "Freeze", "transition": transition, "affects_this_vm": "true"}) == 1.0
    mine = {"event_type": "Freeze", "affects_this_vm": "true"}
    assert get("azure_scheduled_events_notice_seconds_sum", mine) == 900.0
    assert get("azure_scheduled_events_impact_seconds_sum", mine) == 7.0
    assert get("azure_scheduled_events_impact_seconds_bucket", {**mine, "le": "5.0"}) == 0.0
    assert get("azure_scheduled_events_impact_seconds_bucket", {**mine, "le": "10.0"}) == 1.0


def test_scrapes_of_one_document_reuse_its_families_but_not_the_countdown() -> None:
    """Families are built once per document, yet the countdown follows each scrape's clock, and a new VM name
    (or a new document) is reflected at the next scrape."""
    clock = {"now": NOW}
    state = {"snapshot": _snapshot(_document(FREEZE), vm_name="WestNO_9")}
    registry = CollectorRegistry()
    Metrics(registry, lambda: state["snapshot"], clock=lambda: clock["now"])
    until = {"event_id": "C7061BAC", "event_type": "Freeze"}
    info = {"event_id": "C7061BAC", "event_type": "Freeze", "event_status": "Scheduled", "event_source": "Platform",
            "resource_type": "VirtualMachine"}
    assert registry.get_sample_value("azure_scheduled_event_seconds_until_not_before", until) == 1018.0
    assert registry.get_sample_value("azure_scheduled_event_info", {**info, "affects_this_vm": "false"}) == 1.0
    clock["now"] = NOW + 10
    state["snapshot"] = replace(state["snapshot"], up=False)  # as every poll does: same records, new snapshot
    assert registry.get_sample_value("azure_scheduled_event_seconds_until_not_before", until) == 1008.0
    state["snapshot"] = replace(state["snapshot"], vm_name="WestNO_0")  # the identity was read meanwhile
    assert registry.get_sample_value("azure_scheduled_event_info", {**info, "affects_this_vm": "true"}) == 1.0
    state["snapshot"] = _snapshot(_document({**FREEZE, "EventStatus": "Started"}))
    assert registry.get_sample_value("azure_scheduled_event_info", {
        **info, "event_status": "Started", "affects_this_vm": "true"}) == 1.0


def test_invented_event_types_cannot_grow_the_cumulative_series() -> None:
    """Thousands of EventTypes IMDS never documented, scheduled, started and ended: the transition counters and the
    notice/impact histograms keep to the documented types plus "Other" (here, Other alone), so no answer can add
    series for ever."""
    registry, metrics = _registry(Snapshot())
    sink = MetricsSink(metrics)
    invented = [{**FREEZE, "EventId": f"E{i}", "EventType": f"T{i:05d}"} for i in range(2000)]
    documents = [_document(*invented), _document(*({**e, "EventStatus": "Started", "NotBefore": ""} for e in invented)),
                 _document()]
    records: dict = {}  # type: ignore[type-arg]
    for index, body in enumerate(documents):
        document = parse_document(body)
        step = diff(records, document, NOW + index)
        records = dict(step.records)
        sink.on_change(DocumentChange(body, document, step.transitions, step.records, NOW + index, "WestNO_0", None,
                                      ""))
    types = {sample.labels["event_type"] for family in registry.collect() for sample in family.samples
             if sample.name.startswith(("azure_scheduled_events_transitions", "azure_scheduled_events_notice",
                                        "azure_scheduled_events_impact"))}
    assert types == {"Other"}
    get = registry.get_sample_value
    mine = {"event_type": "Other", "affects_this_vm": "true"}
    assert get("azure_scheduled_events_transitions_total", {**mine, "transition": "completed"}) == 2000
    assert get("azure_scheduled_events_impact_seconds_count", mine) == 2000


def test_long_labels_are_cut_and_marked_and_counted_once_per_document() -> None:
    """A 1 MB EventId made /metrics 5 MB: every label value from IMDS is cut at 256 characters, ending in a visible
    marker, the same cut every time; the hits are counted once per document, not per scrape."""
    long_id = "E" * 1_000_000
    identity = VmIdentity(name="n" * 300_000, vm_id="id-1")
    snapshot = _snapshot(_document({**FREEZE, "EventId": long_id}), vm_name=None, identity=identity)
    registry, _ = _registry(snapshot)
    for _ in range(3):
        text = generate_latest(registry).decode()
    assert len(text) < 64 * 1024
    cut = "E" * (256 - len("...[truncated]")) + "...[truncated]"
    assert registry.get_sample_value("azure_scheduled_event_not_before_timestamp_seconds",
                                     {"event_id": cut, "event_type": "Freeze"}) == NOT_BEFORE
    assert registry.get_sample_value("azure_scheduled_event_seconds_until_not_before",
                                     {"event_id": cut, "event_type": "Freeze"}) == NOT_BEFORE - NOW
    assert f'vm_name="{"n" * 242}...[truncated]"' in text
    assert registry.get_sample_value("azure_scheduled_events_bound_hits_total", {"bound": "label_length"}) == 2


def test_a_document_rebuilt_for_a_new_vm_name_is_not_counted_again() -> None:
    """The identity read after the first document changes only the VM name: the families are rebuilt, but the same
    document's cut labels and events past the series cap are not counted a second time."""
    events = [{**FREEZE, "EventId": f"{n:03d}" + "E" * 300} for n in range(70)]
    state = {"snapshot": _snapshot(_document(*events), vm_name=None)}
    registry = CollectorRegistry()
    Metrics(registry, lambda: state["snapshot"], clock=lambda: NOW)
    generate_latest(registry)
    state["snapshot"] = replace(state["snapshot"], vm_name="WestNO_0")
    assert registry.get_sample_value("azure_scheduled_event_info", {
        "event_id": "000" + "E" * 239 + "...[truncated]", "event_type": "Freeze", "event_status": "Scheduled",
        "event_source": "Platform", "resource_type": "VirtualMachine", "affects_this_vm": "true"}) == 1.0
    get = registry.get_sample_value
    assert (get("azure_scheduled_events_bound_hits_total", {"bound": "label_length"}),
            get("azure_scheduled_events_bound_hits_total", {"bound": "events_per_document"})) == (64, 6)


def test_per_event_series_are_kept_for_the_first_64_events_by_event_id() -> None:
    """3,000 events made /metrics 2 MB: the first 64 by EventId get per-event series (whatever the document's
    order), the rest are counted; pending still counts them all."""
    events = [{**NEIGHBOUR, "EventId": f"E{n:04d}"} for n in reversed(range(3000))]
    registry, _ = _registry(_snapshot(_document(*events)))
    text = generate_latest(registry).decode()
    ids = {line.split('event_id="')[1].split('"')[0] for line in text.splitlines()
           if line.startswith("azure_scheduled_event_info{")}
    assert ids == {f"E{n:04d}" for n in range(64)}
    assert registry.get_sample_value("azure_scheduled_events_bound_hits_total",
                                     {"bound": "events_per_document"}) == 3000 - 64
    assert registry.get_sample_value("azure_scheduled_events_pending",
                                     {"event_type": "Reboot", "event_status": "Started",
                                      "affects_this_vm": "false"}) == 3000


def test_this_vms_event_keeps_its_series_when_neighbours_events_sort_first() -> None:
    """70 neighbours' Freezes whose EventIds sort before this VM's Reboot: the Reboot keeps its per-event series (an
    impactful-event alert needs azure_scheduled_event_info), and 64 series are kept in all; pending counts all 71."""
    neighbours = [{**FREEZE, "EventId": f"A{n:03d}", "Resources": ["WestNO_1"]} for n in range(70)]
    mine = {**NEIGHBOUR, "EventId": "Z-REBOOT", "Resources": ["WestNO_0"]}
    registry, _ = _registry(_snapshot(_document(*neighbours, mine)))
    assert registry.get_sample_value("azure_scheduled_event_info", {
        "event_id": "Z-REBOOT", "event_type": "Reboot", "event_status": "Started", "event_source": "Platform",
        "resource_type": "VirtualMachine", "affects_this_vm": "true"}) == 1.0
    text = generate_latest(registry).decode()
    ids = [line.split('event_id="')[1].split('"')[0] for line in text.splitlines()
           if line.startswith("azure_scheduled_event_info{")]
    assert sorted(ids) == sorted(["Z-REBOOT", *(f"A{n:03d}" for n in range(63))])
    assert registry.get_sample_value("azure_scheduled_events_bound_hits_total", {"bound": "events_per_document"}) == 7
    unknown, _ = _registry(_snapshot(_document(*neighbours, mine), vm_name=None))  # no name: every event "unknown"
    assert registry.get_sample_value("azure_scheduled_events_pending", {
        "event_type": "Freeze", "event_status": "Scheduled", "affects_this_vm": "false"}) == 70
    assert unknown.get_sample_value("azure_scheduled_event_seconds_until_not_before",
                                    {"event_id": "A000", "event_type": "Freeze"}) is not None


def test_every_family_of_a_running_sidecar_is_selected_by_its_name(tmp_path: Path) -> None:
    """A running ``se-exporter run`` (simulated IMDS listing an event, documents forwarded to a file, spans to the
    console) answers ``/metrics?name[]=N`` over HTTP with exactly the series named N of its whole /metrics, for
    every name it exposes (gauges, counters' ``_total``, histograms' ``_bucket``/``_sum``/``_count``, process_*):
    each collector describes what it yields, which the registry's name filter needs."""
    settings = Settings(simulate="degraded-hardware", listen=Listen("127.0.0.1", 0), state_dir=tmp_path / "state",
                        poll_interval=0.05, forward_file=tmp_path / "documents.jsonl", otel_traces_exporter="console")
    stop = threading.Event()
    with Sidecar(settings, simulate=SimulatedImds) as sidecar:
        sidecar.listen()
        sidecar.start(stop)
        url = sidecar.metrics_url
        wait_until(lambda: "azure_scheduled_event_info{" in http_get(url)[1], what="the event on /metrics")
        whole = _series_by_name(http_get(url)[1])
        assert {"azure_scheduled_events_up", "azure_scheduled_event_info", "azure_scheduled_events_polls_total",
                "azure_scheduled_events_poll_duration_seconds_bucket", "azure_scheduled_events_transitions_total",
                "azure_scheduled_events_vm_info", "azure_scheduled_events_forwarded_documents_total",
                "azure_scheduled_events_spans_exported_total", "process_cpu_seconds_total"} <= whole.keys()
        for name, series in sorted(whole.items()):
            status, text = http_get(f"{url}?name[]={name}")
            assert status == 200
            assert _series_by_name(text) == {name: series}, name
        stop.set()


def _series_by_name(text: str) -> dict[str, set[frozenset[tuple[str, str]]]]:
    """The label sets of each series name of an exposition (values change between two scrapes; series do not)."""
    series: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, set()).add(frozenset(sample.labels.items()))
    return series


def test_a_disabled_group_exports_nothing_and_counts_nowhere() -> None:
    """--disable-metrics notice,poll_duration: observations go nowhere and the families have no series; the others
    are counted as before."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, Snapshot, disabled=("notice", "poll_duration"))
    metrics.notice.labels("Freeze", "true").observe(5.0)
    metrics.poll_duration.observe(0.01)
    metrics.impact.labels("Freeze", "true").observe(5.0)
    names = {sample.name for family in registry.collect() for sample in family.samples}
    assert not {name for name in names if "notice" in name or "poll_duration" in name}, names
    assert registry.get_sample_value("azure_scheduled_events_impact_seconds_count",
                                     {"event_type": "Freeze", "affects_this_vm": "true"}) == 1.0
