"""One timeline, both streams: the fleet's own core, fed the simulator's sidecar documents and its platform copy,
finds every coverage state the ``fleet`` scenario is written to show."""

from __future__ import annotations

import json
from collections import defaultdict

from se_exporter.core.lifecycle import diff
from se_exporter.core.model import VmIdentity, parse_document
from se_exporter.fleet.message import VmState, read_message
from se_exporter.fleet.platform.coverage import Reconciler, ReconcileSettings
from se_exporter.fleet.platform.reader import read_platform
from se_exporter.fleet.platform.records import PlatformPicture
from se_exporter.sidecar.forwarding.envelope import build
from se_exporter.sidecar.sinks import DocumentChange
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.platform import PlatformCopy
from se_exporter.simulator.server import Simulator, every_vm

EPOCH = 1_800_000_000.0
SIDECARS = ("web_0", "web_1", "web_2")  # web_3 runs none


class Clock:
    def __init__(self) -> None:
        self.now = EPOCH

    def __call__(self) -> float:
        return self.now


def forwarded(sim: Simulator, now: float, sequence: int) -> VmState:
    """The VM's document as its sidecar forwards it (the real envelope) and the fleet reads it (the real reader)."""
    raw = json.dumps(sim.document()).encode()
    document = parse_document(raw)
    change = DocumentChange(raw, document, (), diff({}, document, now).records, now, None,
                            VmIdentity.from_compute(sim.vm), "2020-07-01")
    envelope = build(change, sequence, f"installation-{sim.vm['name']}")
    return read_message(envelope.body, envelope.properties, envelope.message_id, envelope.partition_key, now,
                        1 << 20).vm


def test_the_fleet_core_finds_each_coverage_state_the_scenario_plays() -> None:
    """Along one cycle of the ``fleet`` scenario: the Freeze observed by web_0 and web_1, the canceled Reboot observed
    by web_1, the Reboot web_2's sidecar is blind to missed, the Redeploy of web_3 (no sidecar) no_sidecar; nothing
    unannounced; every EventId ends Completed or Canceled in the picture; Event Grid's duplicates are dropped."""
    clock = Clock()
    sims = {sim.vm["name"]: sim for sim in every_vm(scenarios.load("fleet"), clock=clock)}
    timeline = sims["web_0"].timeline
    copy = PlatformCopy(timeline.scenario)
    picture = PlatformPicture()
    reconciler = Reconciler(ReconcileSettings(vm_expiry=900, grace=5))
    vms: dict[str, VmState] = {}
    coverage: dict[tuple[str, str], set[str]] = defaultdict(set)
    outcomes: dict[str, int] = defaultdict(int)
    unannounced: list[str] = []
    for second in range(1, 200):
        clock.now = EPOCH + second
        for name in SIDECARS:
            vms[name] = forwarded(sims[name], clock.now, second)
        now = timeline.now()
        for message in copy.due(now[1], timeline.approvals(), lambda t, now=now: timeline.wall_at(t, now)):
            read = read_platform(message.body, 1 << 20, clock.now)
            assert read is not None
            for event in read.events:
                outcomes[picture.apply(event, clock.now).outcome] += 1
        result = reconciler.update(picture.records(), vms.values(), clock.now)
        unannounced += [key for key, _event_type, _name in result.listed]
        for row in result.coverage:
            coverage[(row.event_id, row.vm_name)].add(row.coverage)
    freeze, blind, redeploy, canceled = (spec.event_id for spec in timeline.scenario.events)
    assert dict(coverage) == {(freeze, "web_0"): {"observed"}, (freeze, "web_1"): {"observed"},
                              (canceled, "web_1"): {"observed"}, (blind, "web_2"): {"missed"},
                              (redeploy, "web_3"): {"no_sidecar"}}
    assert unannounced == []
    assert {record.event.event_id: record.status for record in picture.records()} == {
        freeze: "Completed", blind: "Completed", redeploy: "Completed", canceled: "Canceled"}
    assert outcomes["duplicate"] >= 2 and outcomes["applied"] == 11
