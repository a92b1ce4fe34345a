"""Forwarding without a network: envelope, sequencer, spool, file lines, configuration, client building."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError
from azure.eventhub import EventData
from azure.eventhub.exceptions import AuthenticationError, ConnectError, EventHubError, OperationTimeoutError

from se_exporter.cli import build_parser, main
from se_exporter.config import run_settings
from se_exporter.imds import VmIdentity
from se_exporter.lifecycle import diff
from se_exporter.model import parse_document
from se_exporter.sinks import DocumentChange
from se_exporter.sinks.envelope import Envelope, Sequencer, build
from se_exporter.sinks.eventhubs import classify, producer_factory
from se_exporter.sinks.forward import file_line
from se_exporter.sinks.spool import Spool
from tests.eventhubs_server import EventHubsTestServer, Store, self_signed_certificate

SCHEMA = json.loads((Path(__file__).parent.parent / "schemas" / "forwarded-document.schema.json").read_text())
RAW = b'{\r\n  "DocumentIncarnation": 3,\r\n  "Events": [ ]\r\n}'
IDENTITY = VmIdentity(name="WestNO_0", vm_id="02aab8a4-74ef-476e-8182-f6d2ba4166a6", vmss_name="",
                      location="norwayeast", resource_group="rg", subscription_id="sub")


def change(raw: bytes = RAW, identity: VmIdentity | None = IDENTITY,
           vm_name: str | None = "WestNO_0") -> DocumentChange:
    document = parse_document(raw)
    return DocumentChange(raw, document, (), diff({}, document, 0).records, 1_795_316_668.0245, vm_name, identity,
                          "2020-07-01")


def envelope(sequence: int, body: bytes = RAW, key: str = "vm") -> Envelope:
    return Envelope(sequence, f"id:{sequence}", key, {"sequence": sequence}, body, 1000.0 + sequence)


def test_envelope_properties_and_ids() -> None:
    """Properties name the VM and the moment; message id and partition key are stable and per VM."""
    env = build(change(), 7, "0f8fad5b-d9cb-469f-a165-70867728950e")
    assert env.body == RAW
    assert env.message_id == "0f8fad5b-d9cb-469f-a165-70867728950e:7"
    assert env.partition_key == IDENTITY.vm_id
    assert env.properties == {
        "vm_name": "WestNO_0", "vm_id": IDENTITY.vm_id, "vmss_name": "", "subscription_id": "sub",
        "resource_group": "rg", "location": "norwayeast", "document_incarnation": 3,
        "observed_at": "2026-11-22T03:04:28.024Z", "api_version": "2020-07-01", "exporter_version": "0.1.0",
        "sequence": 7}


def test_partition_key_falls_back_to_the_vm_name() -> None:
    """Before the identity is known, the VM name keeps documents together; without either, 'unknown'."""
    assert build(change(identity=None), 1, "i").partition_key == "WestNO_0"
    assert build(change(identity=None, vm_name=None), 1, "i").partition_key == "unknown"


def test_file_line_is_valid_and_carries_the_exact_body() -> None:
    """A --forward-file line validates against the published schema; its body is the raw text, CRLFs and all."""
    line = file_line(build(change(), 1, "0f8fad5b-d9cb-469f-a165-70867728950e"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    record = json.loads(line)
    jsonschema.validate(record, SCHEMA)
    assert record["body"].encode() == RAW


def test_sequence_survives_restarts(tmp_path: Path) -> None:
    """Numbers never repeat for an installation, across restarts, and the installation id is kept."""
    first = Sequencer(tmp_path)
    assert [first.next(), first.next()] == [1, 2]
    second = Sequencer(tmp_path)
    assert second.installation_id == first.installation_id
    assert second.next() == 3
    second.advance_past(41)
    assert Sequencer(tmp_path).next() == 42


def test_spool_keeps_order_across_reopen(tmp_path: Path) -> None:
    """What was appended is read back oldest first, also by a new Spool on the same folder (a restart)."""
    spool = Spool(tmp_path, 1 << 20)
    for sequence in (1, 2, 3):
        spool.append(envelope(sequence))
    reopened = Spool(tmp_path, 1 << 20)
    assert [e.sequence for e in reopened.peek(10)] == [1, 2, 3]
    assert reopened.peek(1)[0] == envelope(1)
    reopened.remove([1, 2])
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [3]
    assert reopened.last_sequence == 3


def test_spool_appends_are_on_disk_before_returning(tmp_path: Path) -> None:
    """append() leaves a complete, checksummed record in the segment, so a kill -9 right after loses nothing."""
    Spool(tmp_path, 1 << 20).append(envelope(5, b"{}"))
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000005.seg", "acked"]
    data = (tmp_path / "00000000000000000005.seg").read_bytes()
    length, crc = struct.unpack(">II", data[:8])
    assert len(data) == 8 + length and zlib.crc32(data[8:]) == crc
    assert data.endswith(b"\n{}")
    assert Spool(tmp_path, 1 << 20).peek(10) == [envelope(5, b"{}")]


def test_full_spool_drops_the_oldest_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Past the byte limit the oldest documents go, with a count and a log line; the newest always stays."""
    dropped: list[int] = []
    spool = Spool(tmp_path, 1500, on_drop=dropped.append)
    for sequence in range(1, 11):
        spool.append(envelope(sequence, b"x" * 200))
    kept = [e.sequence for e in spool.peek(100)]
    assert kept[-1] == 10 and kept == list(range(kept[0], 11))
    assert spool.size_bytes <= 1500
    assert sum(dropped) == 10 - len(kept)
    assert "dropped the" in caplog.text
    assert [e.sequence for e in Spool(tmp_path, 1500).peek(100)] == kept  # dropped stays dropped after a restart
    on_disk = sum(path.stat().st_size for path in tmp_path.glob("*.seg"))
    assert on_disk <= 1500 + 1500 // 16 + 400  # the limit, plus at most one partly dropped small segment


def test_acknowledged_segments_are_removed_and_numbering_never_goes_back(tmp_path: Path) -> None:
    """Segments go once every record in them is acknowledged; an empty spool still knows the last sequence."""
    spool = Spool(tmp_path, 1 << 20, segment_bytes=300)
    for sequence in range(1, 11):
        spool.append(envelope(sequence, b"x" * 200))
    assert len(list(tmp_path.glob("*.seg"))) == 10  # each record fills a 300-byte segment
    spool.remove(range(1, 6))
    assert sorted(int(path.stem) for path in tmp_path.glob("*.seg")) == [6, 7, 8, 9, 10]
    spool.remove(range(6, 11))
    assert spool.count == 0 and spool.size_bytes == 0
    # The segment being appended to stays until it is full: no file is created and deleted per document.
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000010.seg", "acked"]
    spool.append(envelope(11, b"x" * 200))  # segment 10 is full: rotated, and deleted as all of it is acknowledged
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000011.seg", "acked"]
    spool.remove([11])
    reopened = Spool(tmp_path, 1 << 20)
    assert reopened.count == 0 and reopened.last_sequence == 11
    assert os.listdir(tmp_path) == ["acked"]  # a fully acknowledged segment found at start is removed


def test_records_at_or_below_the_cursor_are_not_sent_again(tmp_path: Path) -> None:
    """The cursor survives a restart even while the segment holding acknowledged records is still there."""
    spool = Spool(tmp_path, 1 << 20)
    for sequence in (1, 2, 3):
        spool.append(envelope(sequence))
    spool.remove([1, 2])
    assert len(list(tmp_path.glob("*.seg"))) == 1  # record 3 keeps the segment
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [3]


def test_a_torn_cursor_write_falls_back_to_the_older_cursor(tmp_path: Path) -> None:
    """A damaged cursor slot means a few documents are resent (same message ids), never that any is lost."""
    spool = Spool(tmp_path, 1 << 20)
    for sequence in (1, 2, 3, 4):
        spool.append(envelope(sequence))
    spool.remove([1])
    spool.remove([2])  # written to the other slot
    acked = bytearray((tmp_path / "acked").read_bytes())
    newest = 0 if struct.unpack(">Q", acked[:8])[0] == 2 else 16
    acked[newest + 9] ^= 0xFF  # its checksum no longer matches
    (tmp_path / "acked").write_bytes(bytes(acked))
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [2, 3, 4]


def test_damaged_record_is_dropped_visibly(tmp_path: Path) -> None:
    """A damaged record does not block the queue: it is dropped and counted, the rest flows."""
    dropped: list[int] = []
    spool = Spool(tmp_path, 1 << 20, on_drop=dropped.append)
    spool.append(envelope(1))
    spool.append(envelope(2))
    segment = tmp_path / "00000000000000000001.seg"
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF  # inside record 1's header
    segment.write_bytes(bytes(data))
    assert [e.sequence for e in spool.peek(10)] == [2]
    assert dropped == [1]
    reopened: list[int] = []
    assert [e.sequence for e in Spool(tmp_path, 1 << 20, on_drop=reopened.append).peek(10)] == [2]


def test_an_incomplete_write_is_cut_off_and_later_appends_survive(tmp_path: Path) -> None:
    """A record cut short by a crash was never accepted: it is removed at start, and what follows is readable."""
    spool = Spool(tmp_path, 1 << 20)
    spool.append(envelope(1))
    spool.append(envelope(2))
    segment = tmp_path / "00000000000000000001.seg"
    whole = segment.stat().st_size
    with segment.open("ab") as handle:
        handle.write(struct.pack(">II", 500, 0) + b'{"sequence":3')
    reopened = Spool(tmp_path, 1 << 20)
    assert reopened.count == 2 and segment.stat().st_size == whole
    reopened.append(envelope(3))
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [1, 2, 3]


def test_a_failed_write_leaves_no_half_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """append() that fails (disk full, I/O error) raises and leaves the segment as it was for the next append."""
    spool = Spool(tmp_path, 1 << 20)
    spool.append(envelope(1))
    real = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        spool.append(envelope(2))
    monkeypatch.setattr(os, "fdatasync", real)
    spool.append(envelope(3))
    assert [e.sequence for e in Spool(tmp_path, 1 << 20).peek(10)] == [1, 3]


def test_a_spool_of_the_one_file_per_document_layout_is_imported(tmp_path: Path) -> None:
    """Upgrading from 0.1 loses nothing: its <sequence>.env files are moved into a segment, in order."""
    for sequence in (7, 8):
        header = json.dumps(envelope(sequence).header()).encode()
        (tmp_path / f"{sequence:020d}.env").write_bytes(header + b"\n" + RAW)
    (tmp_path / ".00000000000000000009.env.abc123").write_bytes(b"partial")  # a write 0.1 never finished
    spool = Spool(tmp_path, 1 << 20)
    assert spool.peek(10) == [envelope(7), envelope(8)]
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000007.seg", "acked"]


CONN = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=TOPSECRETKEY="


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--eventhub-connection-string", "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=TOPSECRETKEY="],
     "--eventhub-name is required: the connection string has no EntityPath"),
    (["--eventhub-connection-string", "TOPSECRETKEY="], "has no Endpoint=sb://"),
    (["--eventhub-connection-string", "Endpoint=sb://ns/;SharedAccessKey=TOPSECRETKEY="], "needs SharedAccessKeyName"),
    (["--eventhub-connection-string", CONN + ";EntityPath=h", "--eventhub-namespace", "ns.servicebus.windows.net"],
     "exclude each other"),
    (["--eventhub-namespace", "ns.servicebus.windows.net"], "--eventhub-name is required with --eventhub-namespace"),
    (["--eventhub-namespace", "not a host", "--eventhub-name", "h"], "is not a namespace host name"),
    (["--eventhub-client-id", "abc"], "--eventhub-client-id needs --eventhub-namespace"),
    (["--spool-max-bytes", "tiny"], "--spool-max-bytes"),
])
def test_bad_forwarding_configuration(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each mistake is one line naming the setting, and never repeats the key."""
    assert main(["run", *argv], env={}) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
    assert "TOPSECRETKEY" not in err


def test_connection_string_is_not_in_the_settings_repr() -> None:
    """A settings object printed in a traceback does not show the key."""
    settings = run_settings(build_parser().parse_args(["run"]), {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING":
                                                                 CONN + ";EntityPath=h"})
    assert settings.eventhubs_enabled
    assert "TOPSECRETKEY" not in repr(settings)


class FakeCredential:
    """A credential that hands out a fixed token and notes the scopes it was asked for."""

    def __init__(self, client_id: str | None) -> None:
        self.client_id = client_id
        self.scopes: list[tuple[str, ...]] = []

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken("a-token", int(time.time()) + 3600)

    async def close(self) -> None:
        return None


def send_one(make_producer: Callable[[], Any]) -> None:
    """One event through a producer the factory builds, as the forwarder sends: a batch."""
    async def send() -> None:
        async with make_producer() as producer:
            batch = await producer.create_batch()
            batch.add(EventData(b"{}"))
            await producer.send_batch(batch)

    asyncio.run(send())


def test_managed_identity_builds_the_right_client(tmp_path: Path) -> None:
    """Namespace + name + client id give a producer that sends to that hub with a token from that identity's
    credential (asked for an Event Hubs token) put on the CBS for sb://<namespace>/<hub>, through a custom
    endpoint over TLS."""
    made: list[FakeCredential] = []

    def credential(client_id: str | None) -> FakeCredential:
        made.append(FakeCredential(client_id))
        return made[-1]

    cert, key = self_signed_certificate(tmp_path)
    hub = EventHubsTestServer(Store(hub="maintenance"), tls=(cert, key)).start()
    try:
        send_one(producer_factory(None, "maintenance", "ns.servicebus.windows.net", "c0ffee", credential,
                                  endpoint=f"sb://localhost:{hub.port}", ca_file=str(cert)))
    finally:
        hub.stop()
    assert [event.body for events in hub.store.events.values() for event in events] == [b"{}"]
    assert [token.name for token in hub.cbs_tokens] == ["sb://ns.servicebus.windows.net/maintenance"]
    assert [c.client_id for c in made] == ["c0ffee"]
    assert made[0].scopes and all(len(scopes) == 1 and scopes[0].startswith("https://eventhubs.azure.net/")
                                  for scopes in made[0].scopes), made[0].scopes


def test_the_real_credential_chain_builds_without_contacting_anyone() -> None:
    """Without an injected credential, the client gets azure-identity's chain (managed or workload identity), fully
    constructible here: its async transport is installed, and nothing is fetched until a token is needed."""
    client = producer_factory(None, "maintenance", "ns.servicebus.windows.net", "c0ffee")()
    chain = [type(credential).__name__ for credential in client._credential.credentials]
    assert "ManagedIdentityCredential" in chain
    assert not {"AzureCliCredential", "AzurePowerShellCredential", "VisualStudioCodeCredential"} & set(chain)


def test_connection_string_builds_the_right_client(hubs: Callable[..., EventHubsTestServer]) -> None:
    """A connection string with EntityPath gives a producer that sends to that namespace and hub."""
    hub = hubs(Store(hub="maintenance"))
    send_one(producer_factory(hub.connection_string(), None, None, None))
    assert [event.body for events in hub.store.events.values() for event in events] == [b"{}"]
    assert [token.name for token in hub.cbs_tokens] == [f"sb://127.0.0.1:{hub.port}/maintenance"]


@pytest.mark.parametrize(("error", "reason"), [
    (TimeoutError(), "timeout"),
    (ConnectionRefusedError(), "connection"),
    (RuntimeError("?"), "other"),
])
def test_error_reasons(error: Exception, reason: str) -> None:
    """Forwarding errors are grouped into a few reasons for the metric label."""
    assert classify(error) == reason


def test_sdk_error_reasons() -> None:
    """The SDK's own exceptions map to timeout, auth, connection and service."""
    assert classify(OperationTimeoutError("send timed out")) == "timeout"
    assert classify(AuthenticationError("no")) == "auth"
    assert classify(ConnectError("no")) == "connection"
    assert classify(EventHubError("no")) == "service"


def test_a_credential_failure_wrapped_by_the_sdk_is_auth() -> None:
    """A token that could not be had reaches the forwarder as an EventHubError caused by azure-identity's
    ClientAuthenticationError (as the SDK raises it from create_batch): counted as auth, not service."""
    try:
        try:
            raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")
        except ClientAuthenticationError as cause:
            raise EventHubError("DefaultAzureCredential failed to retrieve a token") from cause
    except EventHubError as wrapped:
        assert classify(wrapped) == "auth"
