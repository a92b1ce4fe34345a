"""What the platform stream's core keeps at most, measured: bytes and series after a flood of distinct EventIds.

    python scripts/platform_memory.py            100,000 EventIds at the default bounds, typical and worst strings
    python scripts/platform_memory.py --smoke    1,000 EventIds at bounds a hundred times smaller

A flood of distinct EventIds (one message each, every tenth one open, the others Completed, so ended events keep
making room) goes through one ``PlatformPicture`` at ``DEFAULT_LIMITS``, and every 5,000 EventIds (100 in --smoke)
its records through one ``Reconciler`` at its default settings, with 100 live sidecars listing 64 EventIds each that
the platform never announced (new ones each time, so the pairs fill while there is room).
Two string profiles: ``typical`` (GUID EventIds and Event Grid ids, VM names like ``web7_123``, two VMs per event,
100 scale sets) and ``worst`` (every string at its bound, 256 characters of 4 bytes each; 1,024 for Description;
20 VMs per event, so 10,000 events name the 200,000 the picture keeps and fill the reconciler's pairs; a scope per
event). Memory is what tracemalloc counts as still allocated after ``gc.collect()``, the picture and the reconciler
apart, plus the peaks of one ``update`` and one scrape of the platform gauges (``PlatformCollector``, written by
prometheus-client; their results dropped after). Printed per record and in total, with the series the exposition
writes; the reference, measured in the same run, is the bytes of one message on the wire (the ratio says what a
record costs in memory per byte it took to send). The last line is the same figures as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from se_exporter.fleet.message import VmState
from se_exporter.fleet.platform.coverage import Reconciler, ReconcileSettings
from se_exporter.fleet.platform.reader import PlatformEvent
from se_exporter.fleet.platform.records import DEFAULT_LIMITS, PlatformLimits, PlatformPicture
from tests.fleet.platform_helpers import T0, grid, platform_event, platform_text, vm

WIDE = "\U0001f600"  # a 4-byte character: CPython keeps a string of them at 4 bytes per character


def fresh(text: str) -> str:
    """A new string object equal to ``text``: each message parsed gives its record strings of its own."""
    return (text + ".")[:-1]


def make_event(base: PlatformEvent, number: int, profile: str) -> PlatformEvent:
    status = "Scheduled" if number % 10 == 0 else "Completed"
    if profile == "typical":
        event_id = str(uuid.UUID(int=number)).upper()
        return dataclasses.replace(
            base, grid_id=str(uuid.UUID(int=number + 2**64)), event_id=event_id, key=event_id.lower(),
            event_status=status, event_type=fresh("Reboot"), event_source=fresh("Platform"),
            resource_type=fresh("VirtualMachine"), resources=(f"web{number % 100}_{number}", f"web{number % 100}_7"),
            scope_name=f"web{number % 100}", subscription_id=fresh(base.subscription_id),
            resource_group=fresh("rg"), location=fresh("westeurope"), description=fresh(base.description))

    def text(tag: str, limit: int = 256) -> str:
        head = f"{tag}{number}-"
        return head + WIDE * (limit - len(head))

    event_id = text("E")
    return dataclasses.replace(
        base, grid_id=text("g"), event_id=event_id, key=event_id.lower(), event_status=status,
        event_type=text("t"), event_source=text("s"), resource_type=text("r"),
        resources=tuple(text(f"v{index}-") for index in range(20)),
        scope_name="web0" if number % 50 == 49 else text("scope"),  # the sidecars' scale set publishes too
        subscription_id=text("sub"), resource_group=text("rg"), location=text("loc"), description=text("d", 1024))


def sidecars(profile: str, batch: int, now: float, templates: list[VmState]) -> list[VmState]:
    """100 live sidecars in published scale sets, each listing 64 EventIds the platform never announced (new ones
    for each ``batch``): ``templates`` (from ``templates_of``) with the EventIds and the time replaced."""
    def ghost(index: int, slot: int) -> str:
        head = f"ghost-{index}-{slot}-{batch}-"
        return head + (WIDE * (256 - len(head)) if profile == "worst" else "")

    return [dataclasses.replace(template, seen_at=now - 100, events=tuple(
        dataclasses.replace(event, event_id=ghost(index, slot)) for slot, event in enumerate(template.events)))
        for index, template in enumerate(templates)]


def templates_of(profile: str) -> list[VmState]:
    return [vm(f"side{index}_7", tuple(f"ghost-{index}-{slot}" for slot in range(64)),
               vmss="web0" if profile == "worst" else f"web{index}") for index in range(100)]


def message_bytes(event: PlatformEvent) -> int:
    """The bytes of the message that carried ``event`` (the spec's shape with its strings), UTF-8 on the wire."""
    obj: dict[str, Any] = grid(event.event_status, grid_id=event.grid_id, event_id=event.event_id,
                               resources=list(event.resources), event_type=event.event_type,
                               EventSource=event.event_source, ResourceType=event.resource_type,
                               Description=event.description)
    obj["data"]["resourceInfo"]["location"] = event.location
    return len(json.dumps([obj], ensure_ascii=False).encode())


def allocated() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def measure(profile: str, flood: int, every: int, limits: PlatformLimits, settings: ReconcileSettings,
            ) -> dict[str, float]:
    base = platform_event("Scheduled")
    templates = templates_of(profile)
    tracemalloc.start()
    start = allocated()
    picture = PlatformPicture(limits)
    reconciler = Reconciler(settings)
    picture_bytes = reconciler_bytes = 0
    for number in range(flood):
        picture.apply(make_event(base, number, profile), T0 + number * 1e-3)
        if number % every == every - 1 or number == flood - 1:
            before = allocated()
            picture_bytes = before - start - reconciler_bytes
            now = T0 + 10**4 + number
            reconciler.update(picture.records(), sidecars(profile, number, now, templates), now)
            reconciler_bytes = allocated() - start - picture_bytes
    fleet = sidecars(profile, flood, T0 + 10**5, templates)
    held = allocated()
    tracemalloc.reset_peak()
    result = reconciler.update(picture.records(), fleet, T0 + 10**5)
    update_peak = tracemalloc.get_traced_memory()[1] - held
    held = allocated()
    tracemalloc.reset_peak()
    text = platform_text(picture.records(), result.coverage)
    render_peak = tracemalloc.get_traced_memory()[1] - held
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    text_bytes = len(text.encode())
    del result, text, fleet
    tracemalloc.stop()
    sizes, remembered = picture.sizes(), reconciler.sizes()
    sample = make_event(base, 1, profile)
    return {"records": sizes["events"], "vm_names": sizes["vms"], "ids": sizes["ids"], "forgotten": sizes["forgotten"],
            "pairs": remembered["pairs"], "announced": remembered["announced"],
            "scopes": remembered["scopes"],
            "picture_bytes": picture_bytes, "reconciler_bytes": reconciler_bytes, "update_peak": update_peak,
            "render_peak": render_peak, "text_bytes": text_bytes, "series": series,
            "message_bytes": message_bytes(sample)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--profile", choices=("typical", "worst"), action="append", help="(default: both)")
    args = parser.parse_args()
    limits, settings, flood, every = DEFAULT_LIMITS, ReconcileSettings(vm_expiry=600.0), 100_000, 5000
    if args.smoke:
        limits = PlatformLimits(events=100, ids=1000, vms=2000)
        settings = ReconcileSettings(vm_expiry=600.0, pairs=2000, ids=1000, scopes=1000)
        flood, every = 1000, 100
    print(f"{flood:,} distinct EventIds; picture limits: {limits.events:,} events, {limits.vms:,} VM names, "
          f"{limits.ids:,} ids; reconciler: {settings.pairs:,} pairs, {settings.ids:,} ids, {settings.scopes:,} scopes")
    report: dict[str, Any] = {"mode": "smoke" if args.smoke else "full", "event_ids": flood,
                              "limits": dataclasses.asdict(limits), "settings": dataclasses.asdict(settings)}
    for profile in args.profile or ("typical", "worst"):
        figures = report[profile] = measure(profile, flood, every, limits, settings)
        print(f"{profile}: " + ", ".join(f"{name} {value:,.0f}" for name, value in figures.items()))
        total = figures["picture_bytes"] + figures["reconciler_bytes"]
        per_record = figures["picture_bytes"] / figures["records"]
        mib = {name: figures[name] / 2**20 for name in ("picture_bytes", "reconciler_bytes", "update_peak")}
        print(f"  held: {total / 2**20:,.1f} MiB (picture {mib['picture_bytes']:,.1f} MiB, reconciler "
              f"{mib['reconciler_bytes']:,.1f} MiB); peak of one update {mib['update_peak']:,.1f} MiB, of one render "
              f"{figures['render_peak'] / 2**20:,.1f} MiB for {figures['series']:,.0f} series "
              f"({figures['series'] / max(1, figures['records']):.1f} per record) in "
              f"{figures['text_bytes'] / 2**20:,.1f} MiB of text")
        print(f"  picture per record (its ids and forgotten EventIds included): {per_record:,.0f} bytes = "
              f"{per_record / figures['message_bytes']:.2f}x one message's {figures['message_bytes']:,.0f} bytes")

    print(json.dumps(report))


if __name__ == "__main__":
    main()
