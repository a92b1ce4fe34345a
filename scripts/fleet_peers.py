"""The peers of scripts/fleet_scale_bench.py, each in its own process so that each has its own interpreter:

    python scripts/fleet_peers.py hub VMS PARTITIONS    the Event Hubs test server and the fleet's sidecars
    python scripts/fleet_peers.py bare CONNECTION WAVE [GROUP PARTITIONS]
                                                        the bare SDK receiving what the fleet receives (every
                                                        partition, or those listed, comma-separated, in GROUP)
    python scripts/fleet_peers.py proxy PORT            a loopback proxy to Azurite that counts what is written

Each prints one line when it is up, then answers each command on stdin with one JSON line (``Child``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).parent.parent))

from azure.eventhub.aio import EventHubConsumerClient
from fleet_bench import BARE_RECEIVE, hub_message, rss_mb  # same folder: what both fleet benchmarks use

from se_exporter.sidecar.forwarding.envelope import Envelope, rfc3339_millis
from tests.support.eventhubs_server import EventHubsTestServer, Store
from tests.support.fleet_helpers import envelope_for, fleet_vm
from tests.support.helpers import free_port

WAVE_EVENT = b"WAVE-"  # event ids of the maintenance wave: what the bare receiver and the scrapes look for
STATE_PATH = b"/fleet-state/"  # state_blob_name(): <namespace>/<hub>/<group>/fleet-state/<partition>


# ---------------------------------------------------------------- the hub and producer, in its own process


class Producer:
    """Every VM's documents as its own sidecar would forward them (one installation per VM), appended to the
    hub's store: a backlog, heartbeats spread evenly over the heartbeat interval, a wave of new events."""

    def __init__(self, store: Store, vms: int) -> None:
        self.store = store
        installation = str(uuid.uuid4())
        self.envelopes: list[Envelope] = []
        self.partitions: list[str] = []
        for index in range(vms):
            identity, raw = fleet_vm(index)
            envelope = envelope_for(identity, raw, 1, f"{installation}-{index}", observed_at=time.time())
            self.envelopes.append(envelope)
            self.partitions.append(store.partition_for(envelope.partition_key))
        self.lock = threading.Lock()
        self.stats: dict[str, float] = {"messages": 0, "body_bytes": 0, "wave_first": 0, "wave_last": 0,
                                        "wave_sent": 0}
        self.stop = threading.Event()

    def _append(self, index: int, envelope: Envelope) -> None:
        with self.lock:
            self.store.append(self.partitions[index], hub_message(envelope), envelope.partition_key)
            self.stats["messages"] += 1
            self.stats["body_bytes"] += len(envelope.body)

    def backlog(self) -> None:
        for index, envelope in enumerate(self.envelopes):
            self._append(index, envelope)

    def _next(self, index: int, body: bytes | None = None, heartbeat: bool = False) -> Envelope:
        """VM ``index``'s next message: a heartbeat repeating its document, or a new document."""
        previous, now = self.envelopes[index], time.time()
        sequence = previous.sequence + 1
        installation = previous.message_id.rsplit(":", 1)[0]
        if body is not None:
            identity, _ = fleet_vm(index)
            envelope = envelope_for(identity, body, sequence, installation, observed_at=now)
        else:
            stamp = rfc3339_millis(now)
            envelope = replace(previous, sequence=sequence, message_id=f"{installation}:{sequence}", observed_at=now,
                               properties={**previous.properties, "sequence": sequence, "observed_at": stamp,
                                           "imds_last_success": stamp})
        self.envelopes[index] = replace(envelope, properties={k: v for k, v in envelope.properties.items()
                                                              if k != "heartbeat"})
        if heartbeat:
            envelope = replace(envelope, properties={**envelope.properties, "heartbeat": True})
        return envelope

    def heartbeats(self, interval: float) -> None:
        """Each VM once per ``interval``, evenly spread, until stopped: VM k at k/len of every interval."""
        count, started, sent = len(self.envelopes), time.monotonic(), 0
        while not self.stop.wait(0.05):
            due = int((time.monotonic() - started) * count / interval)
            for number in range(sent, due):
                self._append(number % count, self._next(number % count, heartbeat=True))
            sent = max(sent, due)

    def wave(self, size: int, seconds: float) -> None:
        """``size`` VMs spread over the fleet each get a new document listing a Freeze, within ``seconds``."""
        count = len(self.envelopes)
        chosen = [(3 + k * count // size) % count for k in range(size)]
        started = time.monotonic()
        self.stats["wave_first"] = time.time()
        for number, index in enumerate(chosen):
            delay = started + number * seconds / size - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the producer, not a wait for a condition
            document = json.loads(self.envelopes[index].body)
            name = str(self.envelopes[index].properties["vm_name"])
            document["DocumentIncarnation"] += 1
            document["Events"].append({
                "EventId": f"WAVE-{number // 1000}", "EventType": "Freeze", "ResourceType": "VirtualMachine",
                "Resources": [name], "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT",
                "EventSource": "Platform", "DurationInSeconds": 5})
            self.stats["wave_last"] = time.time()  # before the append: a receiver may have it at once
            self._append(index, self._next(index, json.dumps(document).encode()))
            self.stats["wave_sent"] += 1


def serve_hub(vms: int, partitions: int) -> None:
    """The hub and its producer; commands on stdin, one JSON line answered on stdout for each."""
    store = Store(partition_count=partitions)
    server = EventHubsTestServer(store, port=free_port()).start()
    producer = Producer(store, vms)
    print(server.connection_string(), flush=True)
    threads = []
    for line in sys.stdin:
        command = line.split()
        answer: dict[str, Any] = {"at": time.time()}
        if command[0] == "backlog":
            producer.backlog()
        elif command[0] == "heartbeats":
            threads.append(threading.Thread(target=producer.heartbeats, args=(float(command[1]),), daemon=True))
            threads[-1].start()
        elif command[0] == "wave":
            threads.append(threading.Thread(target=producer.wave, args=(int(command[1]), float(command[2])),
                                            daemon=True))
            threads[-1].start()
        elif command[0] == "stop":
            break
        with producer.lock:
            answer.update(producer.stats)
        answer["rss_mb"] = rss_mb(os.getpid())  # what one test-server process takes to hold the run
        print(json.dumps(answer), flush=True)
    producer.stop.set()
    server.stop()


class Child:
    """This script in another role, as a child process answering one JSON line per command."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(  # noqa: S603 - this script, by our own interpreter
            [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.first = self._stdout().readline().strip()

    def _stdout(self) -> IO[str]:
        assert self.process.stdout is not None
        return self.process.stdout

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self._stdout().readline())
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.process.stdin is not None
                self.process.stdin.write("stop\n")
                self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# ---------------------------------------------------------------- the bare SDK, in its own process


def bare_receive(connection_string: str, wave: int, group: str = "bare", only: str = "") -> None:
    """The stream as the SDK alone receives it, from the latest event on: 'ready' once every partition waited;
    'stats' answers what arrived, and when the ``wave``-th wave document did. With ``only`` (partition ids,
    comma-separated) just those partitions, one ``receive_batch`` each in one client: one of two processes
    sharing the stream in consumer group ``group`` as two replicas do, without a checkpoint store or balancing."""
    stats = {"messages": 0, "body_bytes": 0, "wave": 0, "wave_done_at": 0.0}

    async def run() -> None:
        client = EventHubConsumerClient.from_connection_string(connection_string, consumer_group=group)
        idle: set[str] = set()
        ids = only.split(",") if only else []
        partitions = len(ids) if ids else len(await client.get_partition_ids())

        async def on_batch(context: Any, events: list[Any]) -> None:
            if not events:
                if len(idle) < partitions:
                    idle.add(context.partition_id)
                    if len(idle) == partitions:
                        print("ready", flush=True)
                return
            for event in events:
                body = b"".join(event.body)
                stats["body_bytes"] += len(body)
                properties = event.properties or {}
                if WAVE_EVENT in body and not properties.get(b"heartbeat", properties.get("heartbeat")):
                    stats["wave"] += 1  # the wave's own documents, not the heartbeats that repeat them
                    if stats["wave"] == wave:
                        stats["wave_done_at"] = time.time()
            stats["messages"] += len(events)

        receives = [client.receive_batch(on_batch, **BARE_RECEIVE, starting_position="@latest", partition_id=one)
                    for one in ids] or [client.receive_batch(on_batch, **BARE_RECEIVE, starting_position="@latest")]
        task = asyncio.gather(*receives)
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()

        def commands() -> None:
            for line in sys.stdin:
                if line.strip() == "stop":
                    break
                print(json.dumps(stats), flush=True)
            loop.call_soon_threadsafe(stopped.set)

        threading.Thread(target=commands, daemon=True).start()
        await stopped.wait()
        await client.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # its receives' cancellation, not an error to print
            await task

    asyncio.run(run())


# ---------------------------------------------------------------- a proxy that counts writes to Azurite


class RequestCounter:
    """Reads the HTTP/1.1 requests of one connection as they pass: every byte, and the body bytes of each write
    (PUT) to a state blob. A chunked body stops the reading of that connection (its bytes are still counted)."""

    def __init__(self, totals: dict[str, int]) -> None:
        self.totals = totals
        self.head = b""
        self.body_left = 0
        self.state_body = False
        self.lost = False

    def feed(self, data: bytes) -> None:
        self.totals["sent"] += len(data)
        while data and not self.lost:
            if self.body_left:
                taken = min(self.body_left, len(data))
                self.body_left -= taken
                if self.state_body:
                    self.totals["state_body"] += taken
                data = data[taken:]
                continue
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data, self.head = self.head[:end], self.head[end + 4:], b""
            request_line, *headers = head.split(b"\r\n")
            fields = dict(line.split(b":", 1) for line in headers if b":" in line)
            fields = {name.strip().lower(): value.strip() for name, value in fields.items()}
            self.totals["requests"] += 1
            if b"chunked" in fields.get(b"transfer-encoding", b""):
                self.lost = True
                self.totals["unparsed_connections"] += 1
                return
            self.body_left = int(fields.get(b"content-length", b"0"))
            self.state_body = request_line.startswith(b"PUT ") and STATE_PATH in request_line
            if self.state_body:
                self.totals["state_writes"] += 1


def serve_proxy(upstream: int) -> None:
    """A loopback TCP proxy to Azurite; prints its port, then answers 'stats' with its counts."""
    totals = {"sent": 0, "state_body": 0, "requests": 0, "state_writes": 0, "unparsed_connections": 0}

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: RequestCounter | None) -> None:
        try:
            while data := await reader.read(65536):
                if count is not None:
                    count.feed(data)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer, RequestCounter(totals)), pipe(up_reader, writer, None))

    async def run() -> None:
        server = await asyncio.start_server(connect, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        loop = asyncio.get_running_loop()
        while (line := await loop.run_in_executor(None, sys.stdin.readline)) and line.strip() != "stop":
            print(json.dumps(totals), flush=True)
        server.close()

    asyncio.run(run())


def main() -> int:
    role, *args = sys.argv[1:]
    if role == "hub":
        serve_hub(int(args[0]), int(args[1]))
    elif role == "bare":
        bare_receive(args[0], int(args[1]), *args[2:4])
    elif role == "proxy":
        serve_proxy(int(args[0]))
    else:
        raise SystemExit(f"unknown role {role}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
