"""An Event Hubs-compatible AMQP 1.0 test server, built on python-qpid-proton, for the real SDK.

What it does (what the official azure-eventhub SDK needs, found by running it against this):

* SASL ANONYMOUS, no TLS; the SDK connects with ``UseDevelopmentEmulator=true`` in the string;
  or TLS (``tls=(cert, key)``), as Event Hubs on 5671, for clients that reach it as a custom endpoint;
* CBS: ``put-token`` on ``$cbs`` answered 200 on the server's link whose source is ``$cbs``; with a
  ``token_key``, only JWTs signed with it (the IMDS simulator's managed identity tokens) for an Event Hubs
  audience and not expired are accepted (401 otherwise), and a transfer on a connection whose token for
  the hub is missing or expired is rejected with ``amqp:unauthorized-access``, as Event Hubs does;
* ``$management``: ``READ`` of ``com.microsoft:eventhub`` and ``com.microsoft:partition``;
* sender links to ``<hub>`` or ``<hub>/Partitions/<id>``: single messages and SDK batches (Data
  sections holding whole encoded messages), routed to a partition by partition key;
* receiver links from ``<hub>/ConsumerGroups/<group>/Partitions/<id>`` with a selector filter on
  offset, sequence number or enqueued time (``@latest`` too), each delivered message annotated with
  ``x-opt-sequence-number``, ``x-opt-offset`` (a string), ``x-opt-enqueued-time`` and
  ``x-opt-partition-key``, and carrying the partition's last enqueued event in its delivery annotations
  (what ``track_last_enqueued_event_properties`` reads);
* exclusive receivers, as Event Hubs has them: a receiver attached with an owner level
  (``com.microsoft:epoch``, which the SDK sets to 0 whenever a checkpoint store is used) closes every
  receiver of the same consumer group and partition with an equal or lower level (or none) with
  ``amqp:link:stolen``; a receiver with a lower level than one already attached is refused the same way;
* appends and reads that cost the same however full a partition is (offsets from a running total,
  reads of only the slice a receiver has credit for, selectors by binary search).

The SDK's AMQP layer reads performative fields by position and breaks on frames whose trailing
null fields were omitted, which proton always does; so proton's Transport is driven from our own
socket loop and every outgoing performative list is padded to its full length (``pad_frames``).

Chaos switches for tests: ``settle=False`` never settles a transfer; ``stop()``/``start()`` on the
same ``Store`` is an outage and a recovery; ``SilentPeer`` accepts TCP and never answers.
"""

from __future__ import annotations

import bisect
import contextlib
import re
import selectors
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proton import (
    Collector,
    Condition,
    Connection,
    Data,
    Delivery,
    Endpoint,
    Event,
    Link,
    Message,
    Transport,
    symbol,
    timestamp,
)
from proton import ulong as amqp_ulong

from tests.support.helpers import verify

# Full field counts of every performative (AMQP 1.0 part 2.7 and 5.3), by descriptor code.
FIELD_COUNTS = {0x10: 10, 0x11: 8, 0x12: 14, 0x13: 11, 0x14: 11, 0x15: 6, 0x16: 3, 0x17: 1, 0x18: 1,
                0x40: 1, 0x41: 3, 0x42: 1, 0x43: 1, 0x44: 2}
PROTOCOL_HEADER = b"AMQP"
EVENTHUBS_AUDIENCES = ("https://eventhubs.azure.net", "https://eventhubs.azure.net/")


@dataclass(frozen=True)
class CbsToken:
    """A put-token the server was sent: its type, the entity it is for, the JWT's claims, the verdict."""

    token_type: str
    name: str
    claims: dict[str, Any] | None
    accepted: bool
    description: str
    received_at: float


@dataclass
class StoredEvent:
    partition_id: str
    sequence_number: int
    offset: str
    enqueued_time_ms: int
    partition_key: str | None
    message_id: str | None
    content_type: str | None
    properties: dict[str, Any]
    body: bytes


@dataclass
class Store:
    """Events by partition; survives a server stop/start so outages can be simulated."""

    hub: str = "telemetry"
    partition_count: int = 2
    events: dict[str, list[StoredEvent]] = field(default_factory=dict)
    lock: threading.Condition = field(default_factory=threading.Condition)
    created_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    _next_offset: dict[str, int] = field(default_factory=dict)  # running total: an append never rescans

    @property
    def partition_ids(self) -> list[str]:
        return [str(i) for i in range(self.partition_count)]

    def partition_for(self, key: str | None) -> str:
        if key is None:
            return "0"
        return str(zlib.crc32(key.encode()) % self.partition_count)

    def append(self, partition_id: str | None, message: Message, partition_key: str | None) -> StoredEvent:
        with self.lock:
            pid = partition_id or self.partition_for(partition_key)
            events = self.events.setdefault(pid, [])
            sequence = len(events)
            offset = self._next_offset.get(pid, 0)
            properties = {str(k): v for k, v in (message.properties or {}).items()}
            body = _body_bytes(message.body)
            # Never earlier than the previous event: selectors on enqueued time rely on the order.
            enqueued = max(int(time.time() * 1000), events[-1].enqueued_time_ms if events else 0)
            stored = StoredEvent(pid, sequence, str(offset), enqueued, partition_key,
                                 None if message.id is None else str(message.id),
                                 None if message.content_type is None else str(message.content_type),
                                 properties, body)
            events.append(stored)
            self._next_offset[pid] = offset + len(body) + 1
            self.lock.notify_all()
            return stored

    def all(self) -> list[StoredEvent]:
        with self.lock:
            return [event for pid in sorted(self.events) for event in self.events[pid]]

    def last(self, partition_id: str) -> StoredEvent | None:
        with self.lock:
            events = self.events.get(partition_id)
            return events[-1] if events else None

    def slice(self, partition_id: str, start: int, count: int) -> list[StoredEvent]:
        with self.lock:
            return self.events.get(partition_id, [])[start:start + count]


def _body_bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)  # proton's binaries are views into its buffer: copy now
    if isinstance(body, list):
        return b"".join(_body_bytes(part) for part in body)
    return str(body).encode()


# ---------------------------------------------------------------- frame padding


def pad_performative(body: bytes) -> bytes:
    """Append nulls to a described performative list until it has all its fields."""
    if len(body) < 3 or body[0] != 0x00:
        return body
    if body[1] == 0x53:
        code, pos = body[2], 3
    elif body[1] == 0x80:
        code, pos = int.from_bytes(body[2:10], "big"), 10
    else:
        return body
    wanted = FIELD_COUNTS.get(code)
    if wanted is None:
        return body
    constructor = body[pos]
    if constructor == 0x45:
        count, items_at, list_end = 0, pos + 1, pos + 1
    elif constructor == 0xC0:
        size, count = body[pos + 1], body[pos + 2]
        items_at, list_end = pos + 3, pos + 2 + size
    elif constructor == 0xD0:
        size, count = int.from_bytes(body[pos + 1:pos + 5], "big"), int.from_bytes(body[pos + 5:pos + 9], "big")
        items_at, list_end = pos + 9, pos + 5 + size
    else:
        return body
    if count >= wanted:
        return body
    items = body[items_at:list_end] + b"\x40" * (wanted - count)
    if len(items) + 1 <= 255:
        encoded = bytes([0xC0, len(items) + 1, wanted]) + items
    else:
        encoded = b"\xd0" + (len(items) + 4).to_bytes(4, "big") + wanted.to_bytes(4, "big") + items
    return body[:pos] + encoded + body[list_end:]


def pad_frames(buffer: bytearray) -> bytes:
    """Take every complete frame (or protocol header) off ``buffer`` and return them padded."""
    out = bytearray()
    while True:
        if buffer[:4] == PROTOCOL_HEADER:
            if len(buffer) < 8:
                break
            out += buffer[:8]
            del buffer[:8]
            continue
        if len(buffer) < 8:
            break
        size = int.from_bytes(buffer[:4], "big")
        if len(buffer) < size:
            break
        frame = bytes(buffer[:size])
        del buffer[:size]
        header_size = frame[4] * 4
        header, body = frame[:header_size], frame[header_size:]
        if body:
            body = pad_performative(body)
        out += (len(header) + len(body)).to_bytes(4, "big") + header[4:] + body
    return bytes(out)


# ---------------------------------------------------------------- the server


class _Conn:
    def __init__(self, sock: socket.socket, tls: ssl.SSLContext | None = None) -> None:
        self.sock = sock
        self.transport = Transport(Transport.SERVER)
        # TLS around proton rather than proton's own: the frames are padded (pad_frames) in plain text.
        self.tls: ssl.SSLObject | None = None
        self.tls_in, self.tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        if tls is not None:
            self.tls = tls.wrap_bio(self.tls_in, self.tls_out, server_side=True)
        self.handshaken = False
        self.plain_out = b""
        sasl = self.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.raw_out = bytearray()
        self.pending_out = b""
        self.reply_links: dict[str, Link] = {}
        self.consumers: list[_Consumer] = []
        self.closed = False
        self.token_expiry: dict[str, float] = {}  # CBS audience (entity URI) -> expiry of its accepted token


@dataclass
class _Consumer:
    link: Link
    partition_id: str
    next_index: int
    conn: _Conn
    group: str = "$default"
    owner_level: int | None = None


class EventHubsTestServer:
    def __init__(self, store: Store | None = None, port: int = 0, settle: bool = True,
                 token_key: bytes | None = None, tls: tuple[Path, Path] | None = None,
                 audiences: tuple[str, ...] = EVENTHUBS_AUDIENCES) -> None:
        self.store = store or Store()
        self.settle = settle
        self.token_key = token_key
        self.audiences = audiences
        self.cbs_tokens: list[CbsToken] = []
        self.rejected_transfers = 0
        self._tls: ssl.SSLContext | None = None
        if tls is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(tls[0], tls[1])
        self._port = port
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self.transfers_received = 0
        # Open receivers by (consumer group, partition): what exclusive (owner level) receivers are checked against.
        self._receivers: dict[tuple[str, str], list[_Consumer]] = {}
        self.links_stolen = 0
        self.stolen_at: dict[str, float] = {}  # time.monotonic() of the latest link stolen, per partition id

    @property
    def port(self) -> int:
        """The listening port; before start(), the port it was told to use (0 until then: pick one first)."""
        if self._listener is not None and self._listener.fileno() >= 0:
            return int(self._listener.getsockname()[1])
        return self._port

    def connection_string(self, hub: str | None = None) -> str:
        return (f"Endpoint=sb://127.0.0.1:{self.port};SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0a2V5;"
                f"UseDevelopmentEmulator=true;EntityPath={hub or self.store.hub}")

    def start(self) -> EventHubsTestServer:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self._port))
        listener.listen()
        listener.setblocking(False)
        self._listener = listener
        self._port = self.port
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="eventhubs-test-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._thread = None

    def _loop(self) -> None:
        assert self._listener is not None
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, None)
        conns: dict[socket.socket, _Conn] = {}
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(0.02):
                    if key.data is None:
                        sock, _ = self._listener.accept()
                        sock.setblocking(False)
                        conns[sock] = _Conn(sock, self._tls)
                        selector.register(sock, selectors.EVENT_READ, conns[sock])
                    else:
                        self._read(key.data)
                for conn in list(conns.values()):
                    self._pump(conn)
                    if conn.closed:
                        selector.unregister(conn.sock)
                        conn.sock.close()
                        del conns[conn.sock]
        finally:
            for conn in conns.values():
                conn.sock.close()
            self._listener.close()
            selector.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            conn.transport.close_tail()
            conn.closed = True
            return
        if conn.tls is not None:
            conn.tls_in.write(data)
            try:
                data = self._decrypt(conn, conn.tls)
            except ssl.SSLError:
                conn.closed = True
                return
        while data:
            capacity = conn.transport.capacity()
            if capacity <= 0:
                break
            conn.transport.push(data[:capacity])
            data = data[capacity:]

    @staticmethod
    def _decrypt(conn: _Conn, tls: ssl.SSLObject) -> bytes:
        if not conn.handshaken:
            try:
                tls.do_handshake()
                conn.handshaken = True
            except ssl.SSLWantReadError:
                return b""  # the handshake's answer leaves with the next _pump
        plain = bytearray()
        while True:
            try:
                chunk = tls.read(65536)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            plain += chunk
        return bytes(plain)

    def _pump(self, conn: _Conn) -> None:
        conn.transport.tick(time.monotonic())
        while True:
            event = conn.collector.peek()
            if event is None:
                break
            self._handle(conn, event)
            conn.collector.pop()
        for consumer in conn.consumers:
            self._feed(consumer)
        pending = conn.transport.pending()
        if pending > 0:
            conn.raw_out += conn.transport.peek(pending) or b""
            conn.transport.pop(pending)
            if conn.tls is None:
                conn.pending_out += pad_frames(conn.raw_out)
            else:
                conn.plain_out += pad_frames(conn.raw_out)
        if conn.tls is not None:
            if conn.handshaken and conn.plain_out:
                conn.tls.write(conn.plain_out)
                conn.plain_out = b""
            conn.pending_out += conn.tls_out.read()
        if conn.pending_out:
            try:
                sent = conn.sock.send(conn.pending_out)
                conn.pending_out = conn.pending_out[sent:]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                conn.closed = True
        if pending < 0 and not conn.pending_out:
            conn.closed = True

    def _handle(self, conn: _Conn, event: Event) -> None:
        kind = event.type
        if kind == Event.CONNECTION_REMOTE_OPEN:
            event.connection.container = "eventhubs-test-server"
            event.connection.open()
        elif kind == Event.SESSION_REMOTE_OPEN:
            event.session.open()
        elif kind == Event.LINK_REMOTE_OPEN:
            self._attach(conn, event.link)
        elif kind == Event.DELIVERY:
            self._delivery(conn, event.link, event.delivery)
        elif kind == Event.LINK_REMOTE_CLOSE:
            self._forget(conn, event.link)
            event.link.close()
        elif kind == Event.SESSION_REMOTE_CLOSE:
            event.session.close()
        elif kind == Event.CONNECTION_REMOTE_CLOSE:
            event.connection.close()

    def _attach(self, conn: _Conn, link: Link) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if link.is_receiver:
            link.max_message_size = 1024 * 1024
            link.open()
            link.flow(500)
            return
        link.max_message_size = 1024 * 1024
        address = link.remote_source.address or ""
        link.open()
        if address in ("$cbs", "$management"):
            conn.reply_links[address] = link
            return
        match = re.search(r"/Partitions/([^/]+)$", address)
        partition_id = match.group(1) if match else "0"
        group_match = re.search(r"/ConsumerGroups/([^/]+)/", address)
        group = (group_match.group(1) if group_match else "$Default").lower()
        level = (link.remote_properties or {}).get(symbol("com.microsoft:epoch"))
        consumer = _Consumer(link, partition_id, self._start_index(partition_id, link), conn, group,
                             None if level is None else int(level))
        if self._admit(consumer):
            conn.consumers.append(consumer)

    def _admit(self, new: _Consumer) -> bool:
        """Event Hubs' exclusive receivers: the highest owner level wins; a newer one of an equal level wins."""
        key = (new.group, new.partition_id)
        current = [c for c in self._receivers.get(key, []) if not c.link.state & Endpoint.LOCAL_CLOSED]
        if any(_outranks(old.owner_level, new.owner_level) for old in current):
            _steal(new.link, "a receiver with a higher owner level is already open on this partition")
            return False
        if new.owner_level is not None:
            for old in current:
                _steal(old.link, f"a receiver with owner level {new.owner_level} took this partition over")
                old.conn.consumers = [c for c in old.conn.consumers if c is not old]
                self.links_stolen += 1
                self.stolen_at[new.partition_id] = time.monotonic()
            current = []
        self._receivers[key] = [*current, new]
        return True

    def _forget(self, conn: _Conn, link: Link) -> None:
        conn.consumers = [c for c in conn.consumers if c.link is not link]
        for key, consumers in list(self._receivers.items()):
            self._receivers[key] = [c for c in consumers if c.link is not link]

    def _start_index(self, partition_id: str, link: Link) -> int:
        with self.store.lock:
            return start_index(self.store.events.get(partition_id, []), str(_filter_text(link.remote_source.filter)))

    def open_receivers(self, group: str, partition_id: str) -> int:
        """Receivers open right now on a consumer group's partition."""
        return len([c for c in self._receivers.get((group.lower(), partition_id), [])
                    if not c.link.state & Endpoint.LOCAL_CLOSED])

    def _feed(self, consumer: _Consumer) -> None:
        link = consumer.link
        if link.state & Endpoint.LOCAL_CLOSED:
            return
        if link.credit <= 0:
            return
        batch = self.store.slice(consumer.partition_id, consumer.next_index, link.credit)  # only what fits
        last = self.store.last(consumer.partition_id)
        for stored in batch:
            consumer.next_index += 1
            message = Message(body=stored.body, inferred=True, id=stored.message_id,
                              content_type=stored.content_type, properties=stored.properties or None)
            message.annotations = {
                symbol("x-opt-sequence-number"): int(stored.sequence_number),
                symbol("x-opt-offset"): stored.offset,
                symbol("x-opt-enqueued-time"): timestamp(stored.enqueued_time_ms),
                symbol("x-opt-partition-key"): stored.partition_key,
            }
            if last is not None:  # what the SDK's track_last_enqueued_event_properties reads
                message.instructions = {
                    symbol("last_enqueued_sequence_number"): int(last.sequence_number),
                    symbol("last_enqueued_offset"): last.offset.encode(),
                    symbol("last_enqueued_time_utc"): timestamp(last.enqueued_time_ms),
                    symbol("runtime_info_retrieval_time_utc"): timestamp(int(time.time() * 1000)),
                }
            delivery = link.delivery(f"d{consumer.partition_id}-{stored.sequence_number}")
            link.send(message.encode())
            link.advance()
            delivery.settle()

    def _delivery(self, conn: _Conn, link: Link, delivery: Delivery) -> None:
        if not delivery.readable or delivery.partial:
            return
        payload = bytes(link.recv(delivery.pending) or b"")
        link.advance()
        address = link.remote_target.address or ""
        request = Message()
        request.decode(payload)
        if address in ("$cbs", "$management"):
            self._reply(conn, address, request)
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
        elif not self._authorized(conn, address):
            self.rejected_transfers += 1
            # With info set, proton writes all three fields of the error (the SDK reads them by position).
            delivery.local.condition = Condition("amqp:unauthorized-access", "no valid token for this entity",
                                                 {symbol("entity"): address})
            delivery.update(Delivery.REJECTED)
            delivery.settle()
        else:
            self.transfers_received += 1
            match = re.search(r"/Partitions/([^/]+)$", address)
            self._store(payload, request, match.group(1) if match else None)
            if self.settle:
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
        link.flow(1)

    def _store(self, payload: bytes, outer: Message, partition_id: str | None) -> None:
        inner_messages = _batch_parts(payload)
        outer_key = _partition_key(outer)
        if not inner_messages:
            self.store.append(partition_id, outer, outer_key)
            return
        for inner in inner_messages:
            self.store.append(partition_id, inner, _partition_key(inner) or outer_key)

    def _reply(self, conn: _Conn, address: str, request: Message) -> None:
        link = conn.reply_links.get(address)
        if link is None:
            return
        properties = {str(k): v for k, v in (request.properties or {}).items()}
        body: Any = None
        status, description = 200, "OK"
        if address == "$management" and properties.get("operation") == "READ":
            body = self._read_entity(properties)
        if address == "$cbs" and properties.get("operation") == "put-token":
            status, description = self._put_token(conn, properties, request.body)
        reply = Message(body=body, correlation_id=request.id,
                        properties={"status-code": status, "status-description": description})
        link.delivery(f"reply-{time.monotonic_ns()}")
        link.send(reply.encode())
        link.advance()

    def _put_token(self, conn: _Conn, properties: dict[str, Any], token: Any) -> tuple[int, str]:
        """Check a CBS token as Event Hubs would (when this server was given a key to check with)."""
        token_type, name = str(properties.get("type", "")), str(properties.get("name", ""))
        claims: dict[str, Any] | None = None
        status, description = 200, "OK"
        if self.token_key is not None:
            try:
                if token_type != "jwt":  # noqa: S105 - a token type's name, not a password
                    raise ValueError(f"token type {token_type} is not accepted here: jwt only")
                claims = verify(str(token), self.token_key)
                if claims.get("aud") not in self.audiences:
                    raise ValueError(f"InvalidAudience: the token's audience {claims.get('aud')} is not valid")
                if float(claims.get("exp", 0)) <= time.time():
                    raise ValueError("ExpiredToken: the token has expired")
                conn.token_expiry[name] = float(claims["exp"])
            except ValueError as error:
                status, description = 401, f"Unauthorized: {error}"
        self.cbs_tokens.append(CbsToken(token_type, name, claims, status == 200, description, time.time()))
        return status, description

    def _authorized(self, conn: _Conn, address: str) -> bool:
        if self.token_key is None:
            return True
        path = address.split("://", 1)[1].split("/", 1)[1] if "://" in address else address  # amqps://ns/hub/...
        hub = path.split("/", maxsplit=1)[0]
        return any(name.rstrip("/").endswith("/" + hub) and expiry > time.time()
                   for name, expiry in conn.token_expiry.items())

    def _read_entity(self, properties: dict[str, Any]) -> dict[str, Any]:
        store = self.store
        if properties.get("type") == "com.microsoft:partition":
            pid = str(properties.get("partition"))
            last = store.last(pid)
            return {"name": store.hub, "partition": pid, "begin_sequence_number": 0,
                    "last_enqueued_sequence_number": last.sequence_number if last else -1,
                    "last_enqueued_offset": last.offset if last else "-1",
                    "last_enqueued_time_utc": timestamp(last.enqueued_time_ms if last else 0),
                    "is_partition_empty": last is None}
        return {"name": store.hub, "created_at": timestamp(store.created_at_ms), "partition_ids": store.partition_ids}


def start_index(events: list[StoredEvent], selector: str) -> int:
    """Where a receiver with this selector starts. Every field grows with the position: search, never scan."""
    if "@latest" in selector:
        return len(events)
    match = re.search(r"x-opt-(offset|sequence-number|enqueued-time)\s*(>=|>)\s*'?(-?\d+)'?", selector)
    if not match:
        return 0
    field_name, op, value = match.group(1), match.group(2), int(match.group(3))
    key = {"offset": lambda e: int(e.offset), "sequence-number": lambda e: e.sequence_number,
           "enqueued-time": lambda e: e.enqueued_time_ms}[field_name]
    find = bisect.bisect_left if op == ">=" else bisect.bisect_right
    return find(events, value, key=key)


def _outranks(old: int | None, new: int | None) -> bool:
    """Whether an open receiver of owner level ``old`` keeps a new one of level ``new`` out."""
    if old is None:
        return False
    return new is None or old > new


def _steal(link: Link, why: str) -> None:
    link.condition = Condition("amqp:link:stolen", why)
    link.close()


def _filter_text(filter_data: Data | None) -> Any:
    if filter_data is None:
        return ""
    try:
        filter_data.rewind()
        return filter_data.get_object() if filter_data.next() else ""
    except Exception:  # the selector is best effort: default to the beginning
        return ""


def _partition_key(message: Message) -> str | None:
    annotations = message.annotations or {}
    value = annotations.get(symbol("x-opt-partition-key"), annotations.get("x-opt-partition-key"))
    return None if value is None else str(value)


def _batch_parts(payload: bytes) -> list[Message]:
    """The messages inside an SDK batch: Data sections whose bytes are whole encoded messages."""
    data = Data()
    parts: list[Message] = []
    offset = 0
    while offset < len(payload):
        data.clear()
        consumed = data.decode(payload[offset:])
        if consumed <= 0:
            break
        offset += consumed
        data.rewind()
        data.next()
        value = data.get_object()
        descriptor = getattr(value, "descriptor", None)
        if descriptor == amqp_ulong(0x75):
            section = bytes(value.value)
            if section[:1] == b"\x00":
                inner = Message()
                inner.decode(section)
                parts.append(inner)
    return parts


class SilentPeer:
    """Accepts TCP connections and never says a word: the peer the sync SDK would hang on."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen()
        self.port = int(self._listener.getsockname()[1])

    def connection_string(self, hub: str = "telemetry") -> str:
        return (f"Endpoint=sb://127.0.0.1:{self.port};SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0a2V5;"
                f"UseDevelopmentEmulator=true;EntityPath={hub}")

    def close(self) -> None:
        self._listener.close()


class ClosingPeer(SilentPeer):
    """A hub that is down behind its address: every connection is accepted and closed at once, its (monotonic)
    time kept in ``connected``, so that a test sees when each client tried."""

    def __init__(self) -> None:
        super().__init__()
        self.connected: list[float] = []
        self._thread = threading.Thread(target=self._serve, name="closing-peer", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            self.connected.append(time.monotonic())
            connection.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        super().close()
        self._thread.join(5)
