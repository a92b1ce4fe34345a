"""The fleet's per-VM families written by prometheus-client itself (``GaugeMetricFamily``, ``generate_latest``): the
reference the hand-built writer (``scrape.FleetExposition``) is checked against by the tests and measured against
by ``scripts/fleet_bench.py --scrape``. The library is the reference: what it writes for the same VMs is right."""

from __future__ import annotations

import json
import math
from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from se_exporter.core import pause
from se_exporter.core.model import EVENT_STATUSES, EVENT_TYPES
from se_exporter.fleet.collector import FLEET
from se_exporter.fleet.message import NO_IMDS, VmState
from se_exporter.fleet.scrape import FleetExposition
from se_exporter.fleet.vms import Fleet, imds_unreachable
from se_exporter.infra.http_pages import Part, pieces

VM_LABELS = ["vm_id", "vm_name", "vmss_name", "location"]
Family = tuple[str, str, str, list[tuple[str, tuple[tuple[str, str], ...], float]]]


class LibraryFleet(Collector):
    """The per-VM families of ``vms`` at ``now``, each family's HELP the fleet's own (``FleetExposition.describe``)."""

    def __init__(self, vms: list[VmState], now: float) -> None:
        self.vms, self.now = vms, now
        self.help = {family.name: family.documentation for family in FleetExposition([]).describe()}

    def family(self, name: str, labels: list[str] | None = None, value: float | None = None) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{FLEET}_{name}", self.help[f"{FLEET}_{name}"], labels=labels, value=value)

    def collect(self) -> Iterator[Metric]:
        info = self.family("event_info", [*VM_LABELS, "event_id", "event_type", "event_status", "event_source",
                                          "affects_this_vm"])
        until = self.family("event_seconds_until_not_before", ["vm_id", "event_id"])
        duration = self.family("event_duration_seconds", ["vm_id", "event_id"])
        seen = self.family("vm_last_seen_timestamp_seconds", VM_LABELS)
        unreachable = self.family("vm_imds_unreachable_since_timestamp_seconds", VM_LABELS)
        pending: Tally[tuple[str, str]] = Tally({(t, s): 0 for t in EVENT_TYPES for s in EVENT_STATUSES})
        blast: Tally[tuple[str, str]] = Tally()
        for vm in self.vms:
            identity = [vm.vm_id or vm.key, vm.vm_name, vm.vmss_name, vm.location]
            seen.add_metric(identity, vm.seen_at)
            if vm.imds is not NO_IMDS and imds_unreachable(vm):
                unreachable.add_metric(identity, float(vm.imds.last_success or 0.0))
            kinds = set()
            for event in vm.events:
                info.add_metric([*identity, event.event_id, event.event_type, event.event_status, event.event_source,
                                 event.affects_this_vm], 1.0)
                if event.not_before is not None:
                    until.add_metric([identity[0], event.event_id], event.not_before - self.now)
                if event.duration_seconds is not None:
                    duration.add_metric([identity[0], event.event_id], event.duration_seconds)
                if event.counts_for_vm:
                    kinds.add((event.event_type, event.event_status))
                    blast[(event.event_id, event.event_type)] += 1
            pending.update(kinds)
        pending_family = self.family("pending_vms", ["event_type", "event_status"])
        for (event_type, status), n in sorted(pending.items()):
            pending_family.add_metric([event_type, status], n)
        blast_family = self.family("event_vms", ["event_id", "event_type"])
        for (event_id, event_type), n in sorted(blast.items()):
            blast_family.add_metric([event_id, event_type], n)
        yield self.family("vms", value=len(self.vms))
        yield from (pending_family, blast_family, info, until, duration, seen)
        yield self.family("imds_unreachable_vms", value=len(unreachable.samples))
        yield unreachable
        yield from self.pauses()

    def pauses(self) -> Iterator[Metric]:
        """The pause families: per event the VMs that paused and the longest pause, and the cumulative buckets of
        each (VM, event)'s longest pause by event type."""
        felt = [(event_id, entry["type"], entry["longest"]) for vm in self.vms if vm.value("pauses") is not None
                for event_id, entry in json.loads(str(vm.value("pauses"))).items()]
        vms, longest = self.family("event_paused_vms", ["event_id", "event_type"]), {}
        for (event_id, event_type), n in sorted(Tally((e, t) for e, t, _ in felt).items()):
            vms.add_metric([event_id, event_type], n)
            longest[event_id, event_type] = max(s for e, t, s in felt if (e, t) == (event_id, event_type))
        most = self.family("event_longest_pause_seconds", ["event_id", "event_type"])
        for (event_id, event_type), seconds in sorted(longest.items()):
            most.add_metric([event_id, event_type], seconds)
        buckets = self.family("pause_seconds_bucket", ["event_type", "le"])
        for event_type in sorted({t for _, t, _ in felt}):
            for le in (*pause.BUCKETS, math.inf):
                n = sum(1 for _, t, s in felt if t == event_type and s <= le)
                buckets.add_metric([event_type, "+Inf" if le == math.inf else repr(float(le))], n)
        yield from (vms, most, buckets)


def library_writer(vms: list[VmState], now: float) -> Callable[[], bytes]:
    """A scrape of ``vms``' families by the library (a registry's collection and ``generate_latest``), per call."""
    registry = CollectorRegistry()
    registry.register(LibraryFleet(vms, now))
    return lambda: generate_latest(registry)


def library_text(vms: list[VmState], now: float) -> str:
    return library_writer(vms, now)().decode()


def text(parts: list[Part]) -> str:
    return b"".join(pieces(parts)).decode()


def fleet_text(fleet: Fleet, now: float) -> str:
    """The per-VM families of a fleet's shown VMs as its first scrape writes them (``FleetExposition``)."""
    return text(FleetExposition(fleet).render(now))


def families(written: str) -> list[Family]:
    """An exposition's families, each with its type, HELP and samples (sorted: a family's samples may come in any
    order; a family or a sample written twice shows twice)."""
    return sorted((family.name, family.type, family.documentation,
                   sorted((sample.name, tuple(sorted(sample.labels.items())), sample.value)
                          for sample in family.samples))
                  for family in text_string_to_metric_families(written))
