"""In-process figures of bench.py, each beside its reference: ``python bench/core.py REPEATS`` prints them as JSON.

bench.py runs this in a process of its own that imports what the sidecar imports and nothing else (no test
servers, no SDKs): a full garbage collection walks every tracked object, so in the benchmark's own, larger heap
the same parse would look slower than it is in the sidecar. Each timed call starts after an untimed
``gc.collect()``, so that it pays for the collections its own allocations cause and for nobody else's; the two
sides of each ratio are interleaved so that they see the same moments of a noisy machine.
"""

from __future__ import annotations

import gc
import gzip
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent))

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

import se_exporter.cli  # noqa: F401 - the sidecar's own imports, so the heap is the sidecar's size
from se_exporter.app import make_http_app
from se_exporter.lifecycle import diff
from se_exporter.metrics import Metrics, Snapshot
from se_exporter.model import parse_document


def document(events: int) -> bytes:
    return json.dumps({"DocumentIncarnation": 7, "Events": [
        {"EventId": f"E{i:05d}", "EventType": "Reboot", "EventStatus": "Scheduled", "ResourceType": "VirtualMachine",
         "Resources": [f"vm{i % 50}", f"vm{(i + 1) % 50}"], "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
         "Description": "Host update", "EventSource": "Platform", "DurationInSeconds": -1}
        for i in range(events)]}).encode()


class Prebuilt(Collector):
    """The families our collector produced, handed back as they are: prometheus-client's writer alone."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def core_figures(repeats: int) -> dict[str, float]:
    raw = document(1000)
    loads, parse_diff = [], []
    records: dict[str, Any] = {}
    for index in range(repeats):
        loads.append(timed(lambda: json.loads(raw))[0])
        previous = {} if index % 2 == 0 else records  # every other one finds all 1,000 events already known
        now = 1000.0 + index
        took, step = timed(lambda p=previous, t=now: diff(p, parse_document(raw), t))  # type: ignore[misc]
        parse_diff.append(took)
        records = dict(step.records)
    snapshot = Snapshot(records=records, incarnation=7, up=True, has_document=True, vm_name="vm1")
    registry = CollectorRegistry()
    Metrics(registry, lambda: snapshot)
    # Through the sidecar's own /metrics app, asked the way Prometheus asks (OpenMetrics preferred, gzip) ...
    app = make_http_app(registry, SimpleNamespace(healthy=True, snapshot=snapshot))  # type: ignore[arg-type]
    environ = {"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET", "QUERY_STRING": "", "HTTP_ACCEPT_ENCODING": "gzip",
               "HTTP_ACCEPT": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                              "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"}
    # ... beside prometheus-client writing the very same families, built beforehand, gzipped the same way.
    static = CollectorRegistry()
    static.register(Prebuilt(list(registry.collect())))
    ours, floor = [], []
    for _ in range(repeats):
        ours.append(timed(lambda: b"".join(app(dict(environ), lambda status, headers: None)))[0])
        floor.append(timed(lambda: gzip.compress(generate_latest(static), compresslevel=1))[0])
    return {"json_loads_1000_ms": statistics.median(loads) * 1000,
            "parse_diff_1000_ms": statistics.median(parse_diff) * 1000,
            "scrape_1000_ms": statistics.median(ours) * 1000, "scrape_floor_1000_ms": statistics.median(floor) * 1000}


if __name__ == "__main__":
    print(json.dumps(core_figures(int(sys.argv[1]))))
