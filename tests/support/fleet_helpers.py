"""For the fleet tests: Azurite (the Azure Storage emulator, from npm) on loopback, ``se-exporter fleet`` as a
process, and forwarded documents produced through the project's own envelope."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from azure.eventhub import EventData
from azure.eventhub.aio import EventHubProducerClient

from se_exporter.core.lifecycle import diff
from se_exporter.core.model import VmIdentity, parse_document
from se_exporter.sidecar.forwarding.envelope import Envelope, build
from se_exporter.sidecar.forwarding.eventhubs import event_data as unkeyed_event_data
from se_exporter.sidecar.sinks import DocumentChange
from tests.support.child_logs import attach
from tests.support.eventhubs_server import EventHubsTestServer, Store
from tests.support.helpers import Samples, free_port, http_get, parse_samples, stop_process, wait_until

AZURITE = Path(__file__).parents[1] / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's well-known development account, from its README ("Default Storage Account"): public, not a secret.
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Azurite:
    """azurite-blob on 127.0.0.1:<free port>, its data in ``data_dir``, telemetry off.

    With ``tls`` (a certificate and its key) it serves HTTPS and takes OAuth bearer tokens besides the account key
    (``--oauth basic``: it checks a token's issuer, audience and lifetime, not its signature); ``ca_file`` is then
    the file a client must trust."""

    def __init__(self, data_dir: Path, tls: tuple[Path, Path] | None = None) -> None:
        if not AZURITE.exists():
            raise AssertionError("tests/azurite/node_modules is missing: `make test` runs npm ci there")
        self.port = free_port()
        self.ca_file = tls[0] if tls else None
        data_dir.mkdir(parents=True, exist_ok=True)
        self._log = (data_dir / "azurite.log").open("wb")
        secure = ["--cert", str(tls[0]), "--key", str(tls[1]), "--oauth", "basic"] if tls else []
        # Its own session keeps a Ctrl-C from stopping it before the tests that use it; so that a test run killed
        # outright (a timeout, kill -9) leaves no emulator behind either, it gets SIGTERM when its parent dies.
        orphan_guard = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []
        self.process = subprocess.Popen(
            [*orphan_guard, str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
             "--location", str(data_dir), "--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent",
             *secure],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        attach(f"Azurite (pid {self.process.pid})", data_dir / "azurite.log", lambda: self.process.poll() is None)
        try:
            wait_until(lambda: self.process.poll() is not None or _listening(self.port), timeout=30,
                       what="Azurite to listen")
        except BaseException:  # never leave an emulator behind
            self.stop()
            raise
        if self.process.poll() is not None:
            self._log.close()
            raise AssertionError(f"Azurite exited: {(data_dir / 'azurite.log').read_text()}")

    @property
    def account_url(self) -> str:
        """The blob endpoint, path-style as for every emulator: ``<scheme>://127.0.0.1:<port>/<account>``."""
        return f"{'https' if self.ca_file else 'http'}://127.0.0.1:{self.port}/{DEV_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol={'https' if self.ca_file else 'http'};AccountName={DEV_ACCOUNT};"
                f"AccountKey={DEV_KEY};BlobEndpoint={self.account_url};")

    def stop(self) -> None:
        stop_process(self.process)  # type: ignore[arg-type]
        self._log.close()


def connections(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` to port ``port`` (Linux: its socket inodes in /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    count = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        count += state == "01" and inode in inodes and int(remote.rsplit(":", 1)[1], 16) == port  # 01: ESTABLISHED
    return count


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


class FleetProcess:
    """``se-exporter fleet`` as a child process; secrets by environment, as the README advises (none at all with a
    managed identity: then the arguments name the namespace and the account URL). ``cwd``: the source tree whose
    package runs (``-m`` finds it first; default this one)."""

    def __init__(self, hub_connection: str | None, storage_connection: str | None, log_dir: Path, *args: str,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SE_EXPORTER_")
                 and k.upper() not in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")}  # loopback only
        if hub_connection:
            clean["SE_EXPORTER_EVENTHUB_CONNECTION_STRING"] = hub_connection
        if storage_connection:
            clean["SE_EXPORTER_CHECKPOINT_CONNECTION_STRING"] = storage_connection
        clean.update(env or {})
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = log_dir / "fleet.stderr"
        self._stderr = self.stderr_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "se_exporter", "fleet", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.DEVNULL, stderr=self._stderr, env=clean, cwd=cwd or Path(__file__).parents[2])
        attach(f"{log_dir.name} (se-exporter fleet, pid {self.process.pid})", self.stderr_path,
               lambda: self.process.poll() is None)
        match = wait_until(lambda: self.process.poll() is not None
                           or re.search(r"metrics at (http://\S+/metrics)", self.log()),
                           timeout=30, what="fleet to report its metrics URL")
        if match is True:
            raise AssertionError(f"fleet exited with {self.process.returncode}: {self.log()}")
        self.metrics_url = match.group(1)
        self.base_url = self.metrics_url[: -len("/metrics")]

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def samples(self) -> Samples:
        status, body = http_get(self.metrics_url, timeout=20)
        assert status == 200, body
        return parse_samples(body)

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples().get((name, frozenset(labels.items())))

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        code = stop_process(self.process)
        self._stderr.close()
        return code


def vm_identity(index: int, vmss: str = "") -> VmIdentity:
    name = f"{vmss}_{index}" if vmss else f"vm-{index}"
    return VmIdentity(name=name, vm_id=str(uuid.UUID(int=index + 1)), vmss_name=vmss, location="westeurope",
                      resource_group="rg", subscription_id="00000000-0000-0000-0000-000000000001")


def envelope_for(identity: VmIdentity, raw: bytes, sequence: int, installation: str,
                 observed_at: float = 1_795_316_668.0) -> Envelope:
    """The project's own envelope of one document, as the sidecar builds it."""
    document = parse_document(raw)
    change = DocumentChange(raw, document, (), diff({}, document, observed_at).records, observed_at, identity.name,
                            identity, "2020-07-01")
    return build(change, sequence, installation)


def event_data(envelope: Envelope) -> EventData:
    """The sidecar's message of one envelope, with its partition key, as the sidecar's keyed batches carry it (the
    fleet accepts a document only under its own key); sent in one batch with other VMs' documents."""
    event: EventData = unkeyed_event_data(envelope)
    event.raw_amqp_message.annotations[b"x-opt-partition-key"] = envelope.partition_key
    return event


def send(connection_string: str, events: Iterable[EventData], partition_id: str | None = None) -> None:
    """Send with the official producer, in as few batches as fit (one round trip per ~1 MB)."""
    send_partitions(connection_string, {partition_id: list(events)})


def send_partitions(connection_string: str, events: Mapping[str | None, Iterable[EventData]]) -> None:
    """Each partition's events (None: let the hub choose), through one producer client."""
    async def run() -> None:
        async with EventHubProducerClient.from_connection_string(connection_string) as producer:
            for partition_id, batch_events in events.items():
                batch = await producer.create_batch(partition_id=partition_id)
                for event in batch_events:
                    try:
                        batch.add(event)
                    except ValueError:
                        await producer.send_batch(batch)
                        batch = await producer.create_batch(partition_id=partition_id)
                        batch.add(event)
                if len(batch):
                    await producer.send_batch(batch)

    asyncio.run(run())


EMPTY = b'{"DocumentIncarnation": 1, "Events": []}'


def reboot(index: int, vmss: str) -> bytes:
    return (b'{"DocumentIncarnation": 2, "Events": [{"EventId": "REBOOT-' + vmss.encode() + b'", "EventType": '
            b'"Reboot", "ResourceType": "VirtualMachine", "Resources": ["' + f"{vmss}_{index}".encode() + b'"], '
            b'"EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT", "EventSource": "Platform", '
            b'"DurationInSeconds": -1}]}')


def fleet_vm(index: int, vmss_every: int = 10) -> tuple[VmIdentity, bytes]:
    """VM ``index`` of a synthetic fleet: every ``vmss_every``-th is in one of 7 scale sets, with a Reboot
    scheduled for it; the others have no events."""
    vmss = f"ss{index % 7}" if index % vmss_every == 0 else ""
    return vm_identity(index, vmss), reboot(index, vmss) if vmss else EMPTY


def produce(connection_string: str, partition_count: int, count: int, share: int, shares: int,
            installation: str) -> None:
    """Send this producer's share of a ``count``-VM fleet: the VMs whose partition falls to ``share``."""
    store = Store(partition_count=partition_count)
    by_partition: dict[str | None, list[EventData]] = {}
    for index in range(count):
        identity, raw = fleet_vm(index)
        envelope = envelope_for(identity, raw, index + 1, f"{installation}-{index}")  # one sidecar per VM
        partition_id = store.partition_for(envelope.partition_key)
        if int(partition_id) % shares == share:
            by_partition.setdefault(partition_id, []).append(event_data(envelope))
    send_partitions(connection_string, by_partition)


def start_producers(hub: EventHubsTestServer, count: int, shares: int = 2) -> list[subprocess.Popen[bytes]]:
    """Producers in their own processes: the SDK's pure-Python AMQP encoder costs ~0.6 ms a message, so 10,000
    documents are sent from two cores at once, while the test process serves them."""
    installation = str(uuid.uuid4())
    return [subprocess.Popen([sys.executable, "-m", "tests.support.fleet_helpers", hub.connection_string(),
                              str(hub.store.partition_count), str(count), str(share), str(shares), installation],
                             cwd=Path(__file__).parents[2])
            for share in range(shares)]


if __name__ == "__main__":
    produce(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
