"""In-process figures of bench.py, printed as JSON by ``python scripts/core.py REPEATS`` (parse, /metrics writer) and
``python scripts/core.py --poll-anatomy IMDS_URL SAMPLES GAP`` (what a poll's CPU is made of).

bench.py runs this in a process of its own that imports what the sidecar imports and nothing else (no test
servers, no SDKs): a full garbage collection walks every tracked object, so in the benchmark's own, larger heap
the same parse would look slower than it is in the sidecar. Each timed call starts after an untimed
``gc.collect()``, so that it pays for the collections its own allocations cause and for nobody else's; the two
sides of each ratio are interleaved so that they see the same moments of a noisy machine.
"""

from __future__ import annotations

import gc
import gzip
import http.client
import json
import socket
import statistics
import sys
import tempfile
import threading
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
from se_exporter.core.lifecycle import diff
from se_exporter.core.model import EventMemo, parse_document
from se_exporter.infra.http_server import HttpRequest
from se_exporter.sidecar.endpoints import routes
from se_exporter.sidecar.imds import ImdsClient
from se_exporter.sidecar.lifecycle_store import LifecycleStore
from se_exporter.sidecar.metrics import Metrics
from se_exporter.sidecar.poller import Poller
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import FanOut
from se_exporter.sidecar.sinks.eventlog import LogSink
from se_exporter.sidecar.sinks.transition_metrics import MetricsSink
from se_exporter.sidecar.snapshot import Snapshot
from se_exporter.sidecar.transport import KeepAliveTransport


def document(events: int, prefix: str = "E") -> bytes:
    return json.dumps({"DocumentIncarnation": 7, "Events": [
        {"EventId": f"{prefix}{i:05d}", "EventType": "Reboot", "EventStatus": "Scheduled",
         "ResourceType": "VirtualMachine", "Resources": [f"vm{i % 50}", f"vm{(i + 1) % 50}"],
         "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT", "Description": "Host update", "EventSource": "Platform",
         "DurationInSeconds": -1}
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
    loads, parse_diff, parse_only, diff_only, loads_unseen, parse_diff_unseen = [], [], [], [], [], []
    records: dict[str, Any] = {}
    memo = EventMemo()  # as the poller parses: with its memo of the last document's events
    for index in range(repeats):
        loads.append(timed(lambda: json.loads(raw))[0])
        previous = {} if index % 2 == 0 else records  # every other one finds all 1,000 events already known
        now = 1000.0 + index
        took, step = timed(lambda p=previous, t=now: diff(p, parse_document(raw, memo), t))  # type: ignore[misc]
        parse_diff.append(took)
        records = dict(step.records)
        # The two halves apart, to say where the time goes.
        took, parsed = timed(lambda: parse_document(raw, memo))
        parse_only.append(took)
        diff_only.append(timed(lambda p=previous, d=parsed, t=now: diff(p, d, t))[0])  # type: ignore[misc]
    # Events never seen before (other EventIds each time, the same size), in a loop of their own: the poller's memo
    # remembers the last document's events and hands an unchanged one out again (what the loop above finds, as when
    # a changed document repeats most events), so this is what a document of new events costs.
    for index in range(repeats):
        unseen = document(1000, prefix=f"N{index}-")
        loads_unseen.append(timed(lambda u=unseen: json.loads(u))[0])  # type: ignore[misc]
        parse_diff_unseen.append(timed(lambda u=unseen, t=1000.0 + index: diff({}, parse_document(u, memo), t))[0])  # type: ignore[misc]
    snapshot = Snapshot(records=records, incarnation=7, up=True, has_document=True, vm_name="vm1")
    registry = CollectorRegistry()
    Metrics(registry, lambda: snapshot)
    # Through the sidecar's own /metrics app, asked the way Prometheus asks (OpenMetrics preferred, gzip) ...
    page = routes(registry, SimpleNamespace(healthy=True, ready=True))["/metrics"]
    request = HttpRequest("GET", "/metrics", "", (
        ("accept-encoding", "gzip"), ("accept", "application/openmetrics-text;version=1.0.0,application/openmetrics-"
                                                "text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")))
    # ... beside prometheus-client writing the very same families, built beforehand, gzipped the same way.
    static = CollectorRegistry()
    static.register(Prebuilt(list(registry.collect())))
    ours, floor = [], []
    for _ in range(repeats):
        ours.append(timed(lambda: page(request).body)[0])
        floor.append(timed(lambda: gzip.compress(generate_latest(static), compresslevel=1))[0])
    return {"json_loads_1000_ms": statistics.median(loads) * 1000,
            "parse_diff_1000_ms": statistics.median(parse_diff) * 1000,
            "json_loads_unseen_1000_ms": statistics.median(loads_unseen) * 1000,
            "parse_diff_unseen_1000_ms": statistics.median(parse_diff_unseen) * 1000,
            "parse_1000_ms": statistics.median(parse_only) * 1000, "diff_1000_ms": statistics.median(diff_only) * 1000,
            "scrape_1000_ms": statistics.median(ours) * 1000, "scrape_floor_1000_ms": statistics.median(floor) * 1000}


def poll_anatomy(url: str, samples: int, gap: float) -> dict[str, float]:
    """Thread CPU (median, ms) of a whole poll and of its parts, each run after sleeping ``gap`` as the poll loop
    does between polls (caches are cold by then on a busy machine), and of a whole poll run back to back (warm).

    The parts, against the same IMDS double: the GET through ``ImdsClient`` (httpx request and response objects on
    the project's ``http.client`` transport), the same GET with ``http.client`` alone, the same GET as bytes on a bare
    socket, and the timed ``Event.wait`` that the loop sleeps in. Rounds interleave the parts.
    """
    settings = Settings(imds_url=url, poll_interval=1.0)
    imds = ImdsClient(KeepAliveTransport(), url, settings.api_version, settings.imds_timeout,
                      settings.first_call_timeout, settings.max_document_bytes)
    registry = CollectorRegistry()
    holder: list[Poller] = []
    metrics = Metrics(registry, lambda: holder[0].snapshot)
    poller = Poller(imds, metrics, FanOut([MetricsSink(metrics), LogSink()], on_error=lambda name: None), settings)
    holder.append(poller)
    poller.poll_once()  # the first document: parsed once, unchanged from here on
    host, port = url.removeprefix("http://").rsplit(":", 1)
    path = f"/metadata/scheduledevents?api-version={settings.api_version}"
    connection = http.client.HTTPConnection(host, int(port), timeout=2)
    bare = socket.create_connection((host, int(port)), timeout=2)
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nMetadata: true\r\n\r\n".encode()
    stop = threading.Event()

    def with_http_client() -> None:
        connection.request("GET", path, headers={"Metadata": "true"})
        connection.getresponse().read()

    def with_socket() -> None:
        bare.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += bare.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        while len(body) < length:
            body += bare.recv(65536)

    parts: dict[str, Callable[[], Any]] = {
        "poll_once": poller.poll_once, "get_imds_client": imds.scheduled_events, "get_http_client": with_http_client,
        "get_socket": with_socket}
    found: dict[str, list[int]] = {name: [] for name in [*parts, "wait", "poll_once_warm"]}
    for _ in range(samples):
        for name, call in parts.items():
            time.sleep(gap)
            started = time.thread_time_ns()
            call()
            found[name].append(time.thread_time_ns() - started)
        started = time.thread_time_ns()
        stop.wait(gap)  # what Poller.run sleeps in: the CPU of going to sleep and waking up
        found["wait"].append(time.thread_time_ns() - started)
    for _ in range(samples):
        started = time.thread_time_ns()
        poller.poll_once()
        found["poll_once_warm"].append(time.thread_time_ns() - started)
    connection.close()
    bare.close()
    figures = {f"{name}_ms": statistics.median(values) / 1e6 for name, values in found.items()}
    # Wall time, not CPU: saving open lifecycles (two fsyncs) comes before a changed document reaches /metrics.
    with tempfile.TemporaryDirectory() as folder:
        store = LifecycleStore(Path(folder), scope=url)
        saves = []
        for _ in range(samples):
            started = time.perf_counter()
            store.save(poller.snapshot.records)
            saves.append(time.perf_counter() - started)
    figures["lifecycle_save_wall_ms"] = statistics.median(saves) * 1000
    return figures


if __name__ == "__main__":
    if sys.argv[1] == "--poll-anatomy":
        print(json.dumps(poll_anatomy(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))
    else:
        print(json.dumps(core_figures(int(sys.argv[1]))))
