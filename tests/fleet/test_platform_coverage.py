"""Reconciliation per EventId and VM (observed, missed, imds_unreachable, no_sidecar), the reverse, and the
platform gauges as Prometheus text."""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families

from se_exporter.fleet.message import Imds, VmState
from se_exporter.fleet.platform.coverage import Reconciler, ReconcileSettings, Reconciliation, imds_blind_since
from se_exporter.fleet.platform.records import PlatformPicture, PlatformRecord
from tests.fleet.platform_helpers import EVENT_ID, KEY, SUB, T0, platform_event, platform_text, vm

EXPIRY, GRACE = 600.0, 60.0
AFTER_GRACE = T0 + GRACE + 1


def picture_of(*statuses: str, **kwargs: object) -> PlatformPicture:
    picture = PlatformPicture()
    for status in statuses:
        picture.apply(platform_event(status, at=T0 + 10 * ("Scheduled", "Started", "Completed", "Canceled").index(
            status), **kwargs), T0)  # type: ignore[arg-type]
    return picture


def reconcile(records: list[PlatformRecord], vms: list[VmState], now: float = AFTER_GRACE,
              reconciler: Reconciler | None = None) -> Reconciliation:
    return (reconciler or Reconciler(ReconcileSettings(EXPIRY, GRACE))).update(records, vms, now)


def coverage_of(result: Reconciliation) -> dict[str, str]:
    return {row.vm_name: row.coverage for row in result.coverage}


def lags(result: Reconciliation) -> list[float]:
    return sorted(row.lag for row in result.coverage if row.lag is not None)


def unannounced(result: Reconciliation) -> list[str]:
    return [event_type for _key, event_type, _name in result.listed]


def test_a_vm_whose_sidecar_listed_the_event_observed_it_and_its_lag_is_measured_once() -> None:
    """observed, with the lag first listed minus announced, the same however often it is reconciled."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    records = picture_of("Scheduled").records()
    vms = [vm("web_3", (EVENT_ID,), seen_at=T0 + 7), vm("web_7", (EVENT_ID.lower(),), seen_at=T0 - 3)]
    first = reconcile(records, vms, T0 + 8, reconciler)
    assert coverage_of(first) == {"web_3": "observed", "web_7": "observed"}
    assert lags(first) == [-3.0, 7.0] and unannounced(first) == []
    assert lags(reconcile(records, vms, T0 + 9, reconciler)) == [-3.0, 7.0]


def test_observed_stays_observed_after_the_vm_stops_listing_and_the_event_ends() -> None:
    """A finished event vanishes from IMDS; the VM that listed it keeps its observed."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    reconcile(picture_of("Scheduled").records(), [vm("web_3", (EVENT_ID,)), vm("web_7", (EVENT_ID,))], T0 + 5,
              reconciler)
    later = reconcile(picture_of("Scheduled", "Started", "Completed").records(), [vm("web_3"), vm("web_7")],
                      T0 + 500, reconciler)
    assert coverage_of(later) == {"web_3": "observed", "web_7": "observed"}


def test_a_live_sidecar_that_has_not_listed_the_event_after_the_grace_missed_it() -> None:
    """missed once the grace has passed; within the grace, no coverage yet."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    records = picture_of("Scheduled").records()
    vms = [vm("web_3", seen_at=T0 + 50), vm("web_7", (EVENT_ID,))]
    early = reconcile(records, vms, T0 + GRACE - 1, reconciler)
    assert coverage_of(early) == {"web_7": "observed"}
    result = reconcile(records, vms, AFTER_GRACE, reconciler)
    assert coverage_of(result) == {"web_3": "missed", "web_7": "observed"}
    assert coverage_of(reconcile(records, vms, AFTER_GRACE + 30, reconciler))["web_3"] == "missed"


def test_an_announcement_dated_in_the_future_is_judged_from_when_it_was_learnt() -> None:
    """A platform clock dating Scheduled in 2199 cannot keep a live sidecar's miss hidden for ever: the grace
    counts from when the picture learnt of it at the latest."""
    picture = PlatformPicture()
    picture.apply(platform_event("Scheduled", at=7_258_000_000.0), T0)
    result = reconcile(picture.records(), [vm("web_3", seen_at=T0 + 50)], AFTER_GRACE)
    assert coverage_of(result)["web_3"] == "missed"

def test_a_sidecar_that_has_not_read_imds_since_before_the_announcement_could_not_see_it() -> None:
    """imds_unreachable: reported after the announcement that its last IMDS read was before it, or failing."""
    stale = Imds(observed_at=T0 + 30, last_success=T0 - 200, failing=False)
    failing = Imds(observed_at=T0 + 30, last_success=T0 + 29, failing=True)
    never = Imds(observed_at=None, last_success=None, failing=True)
    old_report = Imds(observed_at=T0 - 10, last_success=T0 - 500, failing=False)
    result = reconcile(picture_of("Started", resources=["a", "b", "c", "d"]).records(), [
        vm("a", imds=stale), vm("b", imds=failing), vm("c", imds=never, seen_at=T0 + 50), vm("d", imds=old_report)],
        T0 + 100)
    assert coverage_of(result) == {"a": "imds_unreachable", "b": "imds_unreachable", "c": "imds_unreachable",
                                   "d": "missed"}
    assert not imds_blind_since(vm("e", imds=Imds(T0 + 30, T0 + 29, False)), T0)


def test_a_vm_no_sidecar_has_been_heard_from_has_no_sidecar_whatever_the_status() -> None:
    """no_sidecar for a VM never heard from or silent past the vm expiry, shown even once ended."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    vms = [vm("web_7", seen_at=T0 - EXPIRY - 1)]
    result = reconcile(picture_of("Scheduled").records(), vms, T0 + 1, reconciler)
    assert coverage_of(result) == {"web_3": "no_sidecar", "web_7": "no_sidecar"}
    ended = reconcile(picture_of("Scheduled", "Canceled").records(), vms, T0 + 100, reconciler)
    assert coverage_of(ended) == {"web_3": "no_sidecar", "web_7": "no_sidecar"}


def test_once_ended_a_live_sidecars_pair_is_judged_no_more() -> None:
    """After the end a live sidecar cannot miss any more, and its IMDS shows the event no more: its pair gets no
    coverage from the reconciler (a miss said while it was open is kept by its partition's judgement)."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    assert coverage_of(reconcile(picture_of("Scheduled").records(), [vm("web_3")], AFTER_GRACE, reconciler)) == {
        "web_3": "missed", "web_7": "no_sidecar"}
    ended = picture_of("Scheduled", "Started", "Completed").records()
    result = reconcile(ended, [vm("web_3", seen_at=T0 + 200), vm("web_7", seen_at=T0 + 200)], T0 + 200, reconciler)
    assert coverage_of(result) == {}


def test_the_join_is_on_the_vm_name_without_case_narrowed_by_scale_set_and_location() -> None:
    """Names compare without case or the preview's underscore; a VM of another scale set or region is not it."""
    records = picture_of("Scheduled", resources=["Web_3", "web_7", "web_8", "web_9"]).records()
    result = reconcile(records, [vm("_WEB_3", (EVENT_ID,)), vm("web_7", (EVENT_ID,), vmss="other"),
                                 vm("web_8", (EVENT_ID,), location="eastus"), vm("web_9", (EVENT_ID,), vmss="",
                                                                                 location="")])
    assert coverage_of(result) == {"Web_3": "observed", "web_7": "no_sidecar", "web_8": "no_sidecar",
                                   "web_9": "observed"}


def test_the_join_is_on_subscription_and_resource_group_as_the_sidecars_forward_them() -> None:
    """A VM of the event's name in another subscription or resource group is another VM; one that says neither (an
    older sidecar) is joined on its name alone."""
    records = picture_of("Scheduled", resources=["web_3", "web_7", "web_8", "web_9"]).records()
    result = reconcile(records, [vm("web_3", (EVENT_ID,), subscription=SUB.upper(), group="RG"),
                                 vm("web_7", (EVENT_ID,), subscription="another", group="rg"),
                                 vm("web_8", (EVENT_ID,), subscription=SUB, group="other-rg"),
                                 vm("web_9", (EVENT_ID,))])
    assert coverage_of(result) == {"web_3": "observed", "web_7": "no_sidecar", "web_8": "no_sidecar",
                                   "web_9": "observed"}


def test_a_vm_of_the_same_name_elsewhere_listing_the_event_first_does_not_hide_the_real_vms_listing() -> None:
    """A sidecar of the event's VM name in another subscription (another VM, or one claiming the name) that lists
    the EventId first leaves the real VM observed, not missed; the listings of each place count against the
    pairs' bound."""
    records = picture_of("Scheduled", resources=["web_3"]).records()
    impostor = vm("web_3", (EVENT_ID,), seen_at=T0 + 5, subscription="another", group="rg")
    real = vm("web_3", (EVENT_ID,), seen_at=T0 + 30, subscription=SUB, group="rg")
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    reconciler.note(impostor)
    result = reconcile(records, [impostor, real], AFTER_GRACE, reconciler)
    assert coverage_of(result) == {"web_3": "observed"}
    assert lags(result) == [30.0]
    assert reconciler.sizes()["pairs"] == 2
    alone = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    alone.note(impostor)
    assert coverage_of(reconcile(records, [impostor], AFTER_GRACE, alone)) == {"web_3": "no_sidecar"}


def test_listings_of_one_vm_name_at_ever_more_places_stay_within_the_pairs_bound() -> None:
    """A sidecar claiming one VM name in a thousand subscriptions is held to the pairs' bound, which is said."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE, pairs=10))
    reconcile(picture_of("Scheduled", resources=["web_3"]).records(), [], T0 + 1, reconciler)
    for index in range(1000):
        reconciler.note(vm("web_3", (EVENT_ID,), seen_at=T0 + 5, subscription=f"sub-{index}"))
    result = reconcile(picture_of("Scheduled", resources=["web_3"]).records(), [], T0 + 2, reconciler)
    assert reconciler.sizes()["pairs"] == 10 and "platform_coverage_pairs" in result.bounds


def test_an_event_a_sidecar_listed_that_the_platform_never_announced_is_listed_once_after_the_grace() -> None:
    """The reverse, for a VM of a scope that publishes: listed once per EventId, and only past the grace."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    records = picture_of("Scheduled").records()
    vms = [vm("web_3", ("E-ghost",), seen_at=T0 + 10), vm("web_5", ("E-ghost",), seen_at=T0 + 10)]
    assert unannounced(reconcile(records, vms, T0 + 20, reconciler)) == []
    assert unannounced(reconcile(records, vms, T0 + 71, reconciler)) == ["Reboot"]
    assert unannounced(reconcile(records, vms, T0 + 90, reconciler)) == ["Reboot"]


def test_events_of_scopes_that_never_published_are_not_unannounced() -> None:
    """A scope that has not opted in to the platform stream simply has not: its VMs' events are not counted."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    records = picture_of("Scheduled").records()
    others = [vm("db_1", ("E-other",), vmss="db", seen_at=T0 + 10), vm("solo", ("E-other",), vmss="")]
    reconcile(records, others, T0 + 20, reconciler)
    assert unannounced(reconcile(records, others, T0 + 200, reconciler)) == []
    assert unannounced(reconcile([], others, T0 + 300, Reconciler(ReconcileSettings(EXPIRY, GRACE)))) == []


def test_an_announced_event_the_picture_has_forgotten_is_not_unannounced() -> None:
    """An EventId once announced stays known to the reconciler after its record's retention."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    reconcile(picture_of("Scheduled").records(), [], T0, reconciler)
    vms = [vm("web_3", (EVENT_ID,), seen_at=T0 + 10)]
    reconcile([], vms, T0 + 20, reconciler)
    assert unannounced(reconcile([], vms, T0 + 200, reconciler)) == []


def test_pairs_remembered_are_bounded_and_the_bound_is_said() -> None:
    """More affected VMs than pairs remembered: every VM still gets its coverage, the bound hit is reported."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE, pairs=10))
    records = picture_of("Scheduled", resources=[f"web_{i}" for i in range(50)]).records()
    result = reconcile(records, [], T0 + 1, reconciler)
    assert len(result.coverage) == 50 and result.bounds == ("platform_coverage_pairs",)


def test_note_dates_a_first_listing_by_the_document_that_carried_it() -> None:
    """The consumer's per-document hook: the lag uses the first document listing the event, not the latest."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    records = picture_of("Scheduled").records()
    reconcile(records, [], T0 + 1, reconciler)
    reconciler.note(vm("web_3", (EVENT_ID,), seen_at=T0 + 2))
    result = reconcile(records, [vm("web_3", (EVENT_ID,), seen_at=T0 + 40)], T0 + 41, reconciler)
    assert lags(result) == [2.0]


def test_a_fleet_that_has_not_opted_in_costs_the_reconciler_nothing() -> None:
    """Before any platform event, and for VMs of scopes that never published one, listings are not remembered."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    reconciler.note(vm("web_3", (EVENT_ID, "E2")))
    assert reconciler.sizes()["pairs"] == 0
    reconcile(picture_of("Scheduled").records(), [], T0 + 1, reconciler)
    reconciler.note(vm("db_1", ("E3",), vmss="db"))
    assert reconciler.sizes()["pairs"] == 2  # the event's two VMs, with no sidecar: db_1's E3 is not kept
    reconciler.note(vm("web_5", ("E4",)))
    assert reconciler.sizes()["pairs"] == 3  # web_5 is in the scale set that published


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_gauges_show_each_event_with_its_labels_and_its_vms_by_coverage() -> None:
    """platform_event_info per EventId with the issue's labels; platform_event_vms with all four coverages."""
    records = picture_of("Scheduled", "Started").records()
    result = reconcile(records, [vm("web_3", (EVENT_ID,))])
    samples = scrape(platform_text(records, result.coverage))
    info = {"event_id": EVENT_ID, "event_type": "Reboot", "event_status": "Started", "event_source": "Platform",
            "scope_type": "scale_set", "scope_name": "web", "resource_group": "rg",
            "subscription_id": "00000000-0000-0000-0000-000000000000", "location": "westeurope"}
    assert samples[("azure_scheduled_fleet_platform_event_info", tuple(sorted(info.items())))] == 1.0
    vms = {state: samples[("azure_scheduled_fleet_platform_event_vms", tuple(sorted(
        {"event_id": EVENT_ID, "event_type": "Reboot", "coverage": state}.items())))]
        for state in ("observed", "missed", "imds_unreachable", "no_sidecar")}
    assert vms == {"observed": 1.0, "missed": 0.0, "imds_unreachable": 0.0, "no_sidecar": 1.0}


def test_the_families_are_declared_when_empty_and_series_go_with_their_event() -> None:
    """HELP and TYPE always; no event, no series."""
    text = platform_text([], [])
    assert "# TYPE azure_scheduled_fleet_platform_event_info gauge" in text
    assert "# TYPE azure_scheduled_fleet_platform_event_vms gauge" in text
    assert [sample for family in text_string_to_metric_families(text) for sample in family.samples] == []


def test_hostile_label_values_are_escaped_and_the_text_parses() -> None:
    """Quotes, backslashes, newlines and spelt-out surrogates in what Azure sent keep the exposition valid."""
    records = picture_of("Scheduled", event_id='E"\\\n\ud800', EventSource="a\nb").records()
    samples = scrape(platform_text(records, []))
    assert [dict(labels)["event_id"] for name, labels in samples if name.endswith("_info")] == ['E"\\\n\\ud800']
    assert KEY not in platform_text(records, [])


def test_a_hundred_thousand_event_ids_leave_the_reconcilers_memory_bounded() -> None:
    """EventIds announced and scopes, each remembered up to its bound, pairs too, hits said."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE, pairs=500, ids=1000, scopes=100))
    base = picture_of("Scheduled").records()[0]
    hits: set[str] = set()
    for batch in range(100):
        records = [dataclasses.replace(base, event=dataclasses.replace(
            base.event, event_id=f"E{batch}-{n}", key=f"e{batch}-{n}", scope_name=f"s{batch}-{n}"))
            for n in range(1000)]
        vms = [vm("web_3", tuple(f"ghost{batch}-{n}" for n in range(64)), seen_at=T0 + batch)]
        hits.update(reconciler.update(records, vms, T0 + 1000 + batch).bounds)
    sizes = reconciler.sizes()
    assert sizes["pairs"] <= 500 and sizes["announced"] <= 1000
    assert sizes["scopes"] <= 100
    assert hits == {"platform_coverage_pairs", "platform_coverage_ids", "platform_scopes"}

def test_a_replica_that_shows_part_of_the_fleet_claims_no_vm_has_no_sidecar() -> None:
    """absent=False: a named VM not among the VMs given may be shown by another replica, so it gets no coverage."""
    reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
    result = reconciler.update(picture_of("Scheduled").records(), [vm("web_3", (EVENT_ID,))], AFTER_GRACE,
                               absent=False)
    assert coverage_of(result) == {"web_3": "observed"}
