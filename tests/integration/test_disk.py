"""Hostile disks, for real: a 64 KiB tmpfs that fills up under the spool and the forward file, a full state directory,
two sidecars on one state directory, kill -9 while the disk is full (tests/sidecar/test_disk.py injects every
offset)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from se_exporter.simulator.faults import Fault
from se_exporter.simulator.server import Simulator
from tests.conftest import Reliability, SimulatorFactory
from tests.integration.test_eventhubs import FAST, first_copies
from tests.support.eventhubs_server import EventHubsTestServer, StoredEvent
from tests.support.helpers import Sidecar, wait_until

pytestmark = pytest.mark.integration
SmallDisk = Callable[..., Path]
MOUNT, UMOUNT = shutil.which("mount"), shutil.which("umount")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A real tmpfs of the given size, mounted under tmp_path (root only) and unmounted at teardown."""
    mounts: list[Path] = []

    def make(size: str = "64k") -> Path:
        if os.geteuid() != 0 or not (MOUNT and UMOUNT):
            pytest.skip("mounting a tmpfs needs root and mount(8); tests/sidecar/test_disk.py injects a full disk "
                        "at every offset instead")
        point = tmp_path / f"tmpfs{len(mounts)}"
        point.mkdir()
        mounted = subprocess.run([MOUNT, "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)],
                                 capture_output=True, text=True, check=False)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
        mounts.append(point)
        return point

    yield make
    for point in mounts:
        subprocess.run([str(UMOUNT), "--lazy", str(point)], check=False)


def grow(point: Path, size: str) -> None:
    """Space comes back: the filesystem is made larger under the running sidecar."""
    subprocess.run([str(MOUNT), "-o", f"remount,size={size}", str(point)], check=True)


def fill(point: Path) -> None:
    """Take every byte left on the filesystem."""
    with (point / "filler").open("wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass


def serve(sim: Simulator, incarnation: int, padding: int = 1500) -> bytes:
    """Make the simulator answer one exact document from now on; returns its bytes."""
    body = json.dumps({"DocumentIncarnation": incarnation, "Events": [], "Padding": "x" * padding}).encode()
    sim.clear_faults()
    sim.inject(Fault(kind="body", count=0, text=body.decode()))
    return body


def read_until(process: Sidecar, incarnation: int) -> None:
    wait_until(lambda: process.value("azure_scheduled_events_document_incarnation") == incarnation,
               what=f"incarnation {incarnation}")


def refusals(process: Sidecar, sink: str) -> float:
    return process.value("azure_scheduled_events_forward_errors_total", sink=sink, reason="disk_full") or 0


def fill_with_documents(sim: Simulator, process: Sidecar, sinks: tuple[str, ...], served: list[bytes]) -> list[bytes]:
    """Serve distinct documents after ``served`` until every sink was refused by the full disk, then three more."""
    read_until(process, len(served))  # the sidecar has read what it was started with
    extra = 3
    for incarnation in range(len(served) + 1, 80):
        served.append(serve(sim, incarnation))
        read_until(process, incarnation)
        if all(refusals(process, sink) for sink in sinks):
            extra -= 1
            if not extra:
                return served
    raise AssertionError(f"the disk never filled: {process.log()[-2000:]}")


def delivered(hub: EventHubsTestServer) -> list[StoredEvent]:
    """First copies at Event Hubs in sequence order (the first document may carry another partition key: it can be
    read before the VM's identity)."""
    return sorted(first_copies(hub.store.all()), key=lambda event: int(event.properties["sequence"]))


def file_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def forwarding(sidecar: Callable[..., Sidecar], imds_url: str, state: Path, out: Path, hub: EventHubsTestServer,
               ) -> Sidecar:
    return sidecar("--imds-url", imds_url, *FAST, "--state-dir", str(state), "--forward-file", str(out),
                   "--eventhub-send-timeout", "1", "--eventhub-retry-max", "0.3",
                   env={"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": hub.connection_string()})


def test_a_full_tmpfs_loses_no_document(simulator: SimulatorFactory, small_disk: SmallDisk,
                                        sidecar: Callable[..., Sidecar], hubs: Callable[..., EventHubsTestServer],
                                        reliability: Reliability) -> None:
    """Spool and forward file on a 64 KiB tmpfs, Event Hubs down: the disk fills mid-record; refused documents are
    counted and kept; once space comes back every distinct document reaches the file and Event Hubs, whole and in
    order, with no record damaged, nothing dropped, and the last document written without IMDS changing it."""
    disk = small_disk("64k")
    sim, server = simulator("live-migration")
    hub = hubs(start=False)
    out = disk / "documents.jsonl"
    first = serve(sim, 1)  # before the sidecar starts: the scenario's own document is never served
    process = forwarding(sidecar, server.url, disk / "state", out, hub)
    served = fill_with_documents(sim, process, ("eventhubs", "file"), [first])
    assert process.value("azure_scheduled_events_forward_pending_documents", sink="file")
    assert process.value("azure_scheduled_events_forward_pending_documents", sink="eventhubs")
    grow(disk, "4m")  # the last document stays what IMDS serves: nothing new arrives to carry the refused ones
    wait_until(lambda: len(out.read_bytes().splitlines()) == len(served), timeout=20, what="the file complete")
    hub.start()
    wait_until(lambda: len(delivered(hub)) == len(served)
               and process.value("azure_scheduled_events_spool_documents") == 0, timeout=30, what="all delivered")
    lines = file_lines(out)
    assert [str(line["body"]).encode() for line in lines] == served
    assert [line["sequence"] for line in lines] == list(range(1, len(served) + 1))
    assert [event.body for event in delivered(hub)] == served
    assert [event.message_id for event in delivered(hub)] == [line["message_id"] for line in lines]
    log = process.log()
    assert not re.search(r"unreadable|damaged|checksum|Traceback", log), log
    assert process.value("azure_scheduled_events_spool_dropped_documents_total") == 0
    assert process.value("azure_scheduled_events_forward_dropped_documents_total", sink="file") == 0
    wait_until(lambda: process.value("azure_scheduled_events_forwarded_documents_total", sink="eventhubs")
               == len(served), what="deliveries counted")
    assert process.value("azure_scheduled_events_forwarded_documents_total", sink="file") == len(served)
    for sink in ("file", "eventhubs"):
        assert len(re.findall(rf"{sink} refused document", log)) == 1
        assert f"{sink} accepts documents again" in log
    reliability("Forwarding", "spool and --forward-file on a real 64 KiB tmpfs filled by documents during an "
                "Event Hubs outage, then space given back",
                "refusals counted (`reason=\"disk_full\"`), one log line each way; every document in the file and "
                "at Event Hubs, whole, in order, once; nothing damaged or dropped; the last one written without a "
                "new document")


def test_kill_9_on_a_full_disk_delivers_every_accepted_document(simulator: SimulatorFactory, small_disk: SmallDisk,
                                                                sidecar: Callable[..., Sidecar],
                                                                hubs: Callable[..., EventHubsTestServer],
                                                                reliability: Reliability) -> None:
    """kill -9 while the disk is full and documents wait in memory: after a restart with space, everything that was
    accepted is delivered undamaged, the document IMDS still serves is forwarded, and no message id is reused."""
    disk = small_disk("64k")
    sim, server = simulator("live-migration")
    hub = hubs(start=False)
    out = disk / "documents.jsonl"
    first = serve(sim, 1)  # before the sidecar starts: the scenario's own document is never served
    process = forwarding(sidecar, server.url, disk / "state", out, hub)
    served = fill_with_documents(sim, process, ("eventhubs", "file"), [first])
    accepted_lines = file_lines(out)
    accepted_spool = int(process.value("azure_scheduled_events_spool_documents") or 0)
    process.process.send_signal(signal.SIGKILL)
    process.process.wait()
    grow(disk, "4m")
    hub.start()
    restarted = forwarding(sidecar, server.url, disk / "state", out, hub)
    wait_until(lambda: restarted.value("azure_scheduled_events_spool_documents") == 0
               and delivered(hub) and delivered(hub)[-1].body == served[-1],
               timeout=30, what="the spool drained and the current document delivered")
    events = delivered(hub)
    assert [event.body for event in events][:-1] == served[:len(events) - 1]
    assert len(events) - 1 >= accepted_spool
    lines = file_lines(out)
    assert lines[:len(accepted_lines)] == accepted_lines and str(lines[-1]["body"]).encode() == served[-1]
    by_id: dict[str, bytes] = {}  # a message id stands for one document, wherever it was sent
    for message_id, body in [(str(e.message_id), e.body) for e in events] + [
            (str(line["message_id"]), str(line["body"]).encode()) for line in lines]:
        assert by_id.setdefault(message_id, body) == body, message_id
    assert not re.search(r"unreadable|damaged|checksum|Traceback", restarted.log())
    assert restarted.value("azure_scheduled_events_spool_dropped_documents_total") == 0
    reliability("Forwarding", "kill -9 while the tmpfs was full and refused documents waited in memory, then restarted "
                "with space", "every accepted document delivered undamaged; the document IMDS still served forwarded; "
                "no message id reused for another document")


def test_a_full_state_directory_does_not_stop_the_forward_file(simulator: SimulatorFactory, small_disk: SmallDisk,
                                                               sidecar: Callable[..., Sidecar], tmp_path: Path,
                                                               reliability: Reliability) -> None:
    """State directory on a full tmpfs, --forward-file elsewhere: every document reaches the file, nothing is
    counted as an error of the file, no traceback, one warning; a restart numbers above the file's last line."""
    disk = small_disk("64k")
    state = disk / "state"
    state.mkdir()
    fill(disk)
    sim, server = simulator("live-migration")
    out = tmp_path / "documents.jsonl"
    served = [serve(sim, 1, padding=10)]
    process = sidecar("--imds-url", server.url, *FAST, "--state-dir", str(state), "--forward-file", str(out))
    read_until(process, 1)
    for incarnation in range(2, 9):
        served.append(serve(sim, incarnation, padding=10))
        read_until(process, incarnation)
    wait_until(lambda: len(out.read_bytes().splitlines()) == 8, what="eight lines")
    assert [str(line["body"]).encode() for line in file_lines(out)] == served
    # Counted just after the line is synced: the eighth count may trail the eighth line by a moment.
    wait_until(lambda: process.value("azure_scheduled_events_forwarded_documents_total", sink="file") == 8,
               what="eight documents counted")
    assert not process.value("azure_scheduled_events_sink_errors_total", sink="forward")
    log = process.log()
    assert "Traceback" not in log and log.count("cannot save") == 1
    assert process.stop() == 0
    (disk / "filler").unlink()
    restarted = sidecar("--imds-url", server.url, *FAST, "--state-dir", str(state), "--forward-file", str(out))
    read_until(restarted, 8)  # forwarded again: the first document after a start always is
    serve(sim, 9, padding=10)
    read_until(restarted, 9)
    wait_until(lambda: len(out.read_bytes().splitlines()) == 10, what="the current document again, and the next")
    sequences = [line["sequence"] for line in file_lines(out)]
    assert sequences == list(range(1, 11)), sequences  # the stale forwarding.json said 2
    reliability("State", "--state-dir on a full tmpfs, --forward-file elsewhere, 8 documents",
                "all 8 in the file and counted as forwarded; one warning, no traceback; after a restart the "
                "sequence went on above the file's last")


def test_two_sidecars_on_one_state_directory(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                             tmp_path: Path, reliability: Reliability) -> None:
    """A second sidecar on the same --state-dir exits 2 with one line naming the directory and the first one's pid;
    once the first is killed (-9, no cleanup), the lock is gone with it and a new sidecar starts."""
    _, server = simulator("live-migration")
    state = tmp_path / "state"
    first = sidecar("--imds-url", server.url, *FAST, "--state-dir", str(state))
    second = subprocess.run([sys.executable, "-m", "se_exporter", "run", "--listen", "127.0.0.1:0", "--imds-url",
                             server.url, "--state-dir", str(state)], capture_output=True, text=True, timeout=30,
                            check=False)
    assert second.returncode == 2
    assert second.stderr.count("\n") == 1, second.stderr
    assert f"--state-dir {state}: already used by another se-exporter (pid {first.process.pid})" in second.stderr
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    third = sidecar("--imds-url", server.url, *FAST, "--state-dir", str(state))
    wait_until(lambda: third.value("azure_scheduled_events_up") == 1, what="the new sidecar polling")
    reliability("State", "two sidecars started on one --state-dir; then the first killed with -9",
                "the second exited 2 with one line naming the directory and the first one's pid; after the kill a "
                "new one started (the kernel released the lock)")


def test_damaged_state_files_do_not_stop_a_real_start(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                                      tmp_path: Path, reliability: Reliability) -> None:
    """A sidecar whose lifecycle.json is null, forwarding.json a string and spans.json a list starts, polls, forwards
    and traces, with one warning per file and no traceback (before: exit 1 or a traceback at every export)."""
    sim, server = simulator("live-migration")
    state = tmp_path / "state"
    state.mkdir()
    (state / "lifecycle.json").write_text("null")
    (state / "forwarding.json").write_text('"str"')
    (state / "spans.json").write_text("[1, 2]")
    out = tmp_path / "documents.jsonl"
    first = serve(sim, 1, padding=10)
    process = sidecar("--imds-url", server.url, *FAST, "--state-dir", str(state), "--forward-file", str(out),
                      "--otel-traces-exporter", "console")
    read_until(process, 1)
    second = serve(sim, 2, padding=10)
    read_until(process, 2)
    wait_until(lambda: len(out.read_bytes().splitlines()) == 2, what="two documents forwarded")
    assert [str(line["body"]).encode() for line in file_lines(out)] == [first, second]
    log = process.log()
    for name in ("lifecycle", "damaged forwarding", "span"):
        assert log.count(f"ignoring the {name} state file") == 1, log
    assert "Traceback" not in log and process.value("azure_scheduled_events_up") == 1
    reliability("State", "a real start with lifecycle.json null, forwarding.json a string, spans.json a list",
                "started, polled, forwarded and traced; one warning per file, no traceback")
