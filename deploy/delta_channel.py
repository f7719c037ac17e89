"""Delta channels: one connection per (ingress replica, engine replica) carrying the tokens of
every request the ingress has on that replica, in place of a Ray streaming item per request
per message.

    ingress ──Serve call (request)──────────────────────▶ engine replica
            ◀──Started(replica, channel address, token)──      (admission, routing, failures)
            ══ connect(address): hello(token, channel id) ══▶  one TCP connection per pair
            ◀══ frame: [(stream key, RequestDelta | GenerateError), ...] ══  (all due in one
                                                               pass of the replica's loop)
            ◀──the Serve call ends with the request─────────    (Serve's ongoing count holds)

Why: a 256-stream burst sends a few thousand messages back; through Ray each costs an
executor hop and an RPC on the replica (43% of its samples, session 24) and as much on the
ingress, and the burst's last tokens queue behind them. Here a replica writes one frame per
pass of its event loop and ingress, whatever the number of streams.

The per-request Serve call stays what routing, admission, the retry of a refused or failed
request, Serve's autoscaling metric and health see: it yields `Started` and stays open until
the request ends (or is cancelled, which aborts it). Only the tokens (and an engine error
after `Started`) take the channel, in order with each other.

`ChannelServer` is the replica's end (an asyncio server on the replica's loop; a connection
must first send the server's random token). `ChannelClient` is the ingress's (a connection
per replica address, opened at the first `Started` that names it; its reader hands each item
to the queue registered under its stream key; a lost connection fails every stream on it
with `ChannelLost`, which the ingress treats as a failed replica). Frames are a 4-byte
big-endian length and a pickle; both ends are this package within one Ray cluster, whose own
traffic is pickles too.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import pickle
import secrets
import struct
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 30  # a frame holds one loop pass's items: far below this
UNCONNECTED_DROP_S = 30.0  # items for an ingress not connected for this long are dropped (it is gone)
HELLO_TIMEOUT_S = 10.0  # a connection must say who it is within this long
CONNECT_TIMEOUT_S = 5.0  # an ingress's connection to a replica's channel server (a dropped SYN: no minutes)


def encode_frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's object; `asyncio.IncompleteReadError` at the end of the stream."""
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"delta channel frame of {size} bytes is over {MAX_FRAME_BYTES}")
    return pickle.loads(await reader.readexactly(size))


@dataclass(frozen=True)
class ChannelAddress:
    """Where an ingress reaches a replica's channel server, and the token it must present."""

    host: str
    port: int
    token: str


class ChannelLost(Exception):
    """The connection to a replica's channel server broke (the replica died or is unreachable)."""


class ChannelUnreachable(ChannelLost):
    """A replica's channel server could not be connected to (`ChannelClient.ever_connected`
    tells a replica gone from a network that lets no channel through)."""


# ----- the replica's end -----------------------------------------------------------------------


@dataclass
class _Outbox:
    """One ingress's items on this replica: its connection's writer (None until it connects,
    or after it went away) and the items not written yet."""

    writer: asyncio.StreamWriter | None = None
    items: list[tuple[int, Any]] = field(default_factory=list)
    unconnected_since: float | None = None  # holding items without a writer since (monotonic s)
    flush_scheduled: bool = False


class ChannelServer:
    """A replica's channel server. `post(channel_id, stream_key, item)` from the replica's
    event loop; the items posted in one pass of the loop go out as one frame per ingress."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self.outboxes: dict[str, _Outbox] = {}
        self.address: ChannelAddress | None = None
        self.num_frames = 0  # written, all channels (for tests and diagnostics)
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self, host: str, port: int = 0) -> ChannelAddress:
        """Listen on `host` (the replica's node address; 127.0.0.1 in tests), on a free port."""
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._on_connect, host, port)
        bound = self._server.sockets[0].getsockname()
        self.address = ChannelAddress(host, bound[1], self.token)
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for box in self.outboxes.values():
            if box.writer is not None:
                box.writer.close()
        self.outboxes.clear()

    def post(self, channel_id: str, stream_key: int, item: Any) -> None:
        """Queue `item` for the stream `stream_key` of the ingress `channel_id`."""
        box = self.outboxes.get(channel_id)
        if box is None:
            box = self.outboxes[channel_id] = _Outbox()
        if box.writer is None and box.unconnected_since is None:
            box.unconnected_since = time.monotonic()
        box.items.append((stream_key, item))
        if not box.flush_scheduled:
            box.flush_scheduled = True
            self._loop.call_soon(self._flush, channel_id)

    def _flush(self, channel_id: str) -> None:
        box = self.outboxes.get(channel_id)
        if box is None:
            return
        box.flush_scheduled = False
        if not box.items:
            return
        if box.writer is None:  # not connected (yet, or any more): hold, unless it has been too long
            if time.monotonic() - box.unconnected_since > UNCONNECTED_DROP_S:
                logger.warning("delta channel %s: no connection for %.0f s; dropping %d items",
                               channel_id, UNCONNECTED_DROP_S, len(box.items))
                box.items.clear()
                box.unconnected_since = None
            return
        items, box.items = box.items, []
        box.writer.write(encode_frame(items))
        self.num_frames += 1

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            token, channel_id = await asyncio.wait_for(read_frame(reader), HELLO_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - not a channel client
            writer.close()
            return
        if not (isinstance(token, str) and hmac.compare_digest(token.encode(), self.token.encode())
                and isinstance(channel_id, str)):
            logger.warning("delta channel: a connection from %s with a wrong token; closed",
                           writer.get_extra_info("peername"))
            writer.close()
            return
        box = self.outboxes.get(channel_id)
        if box is None:
            box = self.outboxes[channel_id] = _Outbox()
        if box.writer is not None:  # the ingress reconnected: its old connection is dead to it
            box.writer.close()
        box.writer, box.unconnected_since = writer, None
        if box.items and not box.flush_scheduled:
            box.flush_scheduled = True
            self._loop.call_soon(self._flush, channel_id)
        try:
            await reader.read()  # the ingress sends nothing more: returns when it goes away
        except Exception:  # noqa: BLE001 - a reset connection ends it the same
            pass
        finally:
            if box.writer is writer:
                box.writer = None
                if box.items:
                    box.unconnected_since = time.monotonic()
            writer.close()


# ----- the ingress's end -----------------------------------------------------------------------


class _Connection:
    def __init__(self, address: ChannelAddress) -> None:
        self.address = address
        self.keys: set[int] = set()  # the streams whose items come on this connection
        self.lost: ChannelLost | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task | None = None


class ChannelClient:
    """An ingress's channels to the replicas. `register()` a stream before its Serve call (its
    first items may come before `Started` is read), `attach(key, address)` once `Started`
    names the replica, `unregister(key)` at its end."""

    def __init__(self, channel_id: str) -> None:
        self.channel_id = channel_id
        self.queues: dict[int, asyncio.Queue] = {}
        self.connections: dict[ChannelAddress, _Connection] = {}
        self._connecting: dict[ChannelAddress, asyncio.Task] = {}
        self._next_key = 0
        self.ever_connected = False  # a connection has been opened (so the network lets channels through)

    def register(self) -> tuple[int, asyncio.Queue]:
        """A new stream key (unique in this client: a retried request gets a new one, so a late
        item from the replica it left cannot reach its next attempt) and its queue."""
        self._next_key += 1
        queue: asyncio.Queue = asyncio.Queue()
        self.queues[self._next_key] = queue
        return self._next_key, queue

    def unregister(self, key: int) -> None:
        self.queues.pop(key, None)
        for conn in self.connections.values():
            conn.keys.discard(key)

    async def attach(self, key: int, address: ChannelAddress) -> None:
        """Route the stream's items from `address`'s connection (opened if needed); if that
        connection is or becomes lost, `ChannelLost` is put on the stream's queue."""
        conn = await self._connection(address)
        if conn.lost is not None:
            raise conn.lost
        if key in self.queues:
            conn.keys.add(key)

    async def _connection(self, address: ChannelAddress) -> _Connection:
        conn = self.connections.get(address)
        if conn is not None and conn.lost is None:
            return conn
        task = self._connecting.get(address)
        if task is None:
            task = self._connecting[address] = asyncio.get_running_loop().create_task(self._open(address))
            task.add_done_callback(lambda _t: self._connecting.pop(address, None))
        return await asyncio.shield(task)

    async def _open(self, address: ChannelAddress) -> _Connection:
        conn = _Connection(address)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(address.host, address.port),
                                                    CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            conn.lost = ChannelUnreachable(f"cannot reach the replica's delta channel at "
                                           f"{address.host}:{address.port}: {exc or type(exc).__name__}")
            return conn
        self.ever_connected = True
        writer.write(encode_frame((address.token, self.channel_id)))
        conn.writer = writer
        conn.reader_task = asyncio.get_running_loop().create_task(self._read(conn, reader))
        self.connections[address] = conn
        return conn

    async def _read(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                for key, item in await read_frame(reader):
                    queue = self.queues.get(key)
                    if queue is not None:  # else: a stream that has ended (or an attempt left)
                        queue.put_nowait(item)
        except asyncio.CancelledError:
            conn.lost = ChannelLost("the ingress closed the channel")
            raise
        except Exception as exc:  # noqa: BLE001 - the end of the connection, whatever its cause
            conn.lost = ChannelLost(f"the delta channel to {conn.address.host}:{conn.address.port} "
                                    f"broke ({type(exc).__name__})")
        finally:
            if self.connections.get(conn.address) is conn:
                del self.connections[conn.address]
            if conn.writer is not None:
                conn.writer.close()
            for key in conn.keys:
                queue = self.queues.get(key)
                if queue is not None:
                    queue.put_nowait(conn.lost)
            conn.keys.clear()

    async def close(self) -> None:
        for conn in list(self.connections.values()):
            if conn.reader_task is not None:
                conn.reader_task.cancel()
        for conn in list(self.connections.values()):
            if conn.reader_task is not None:
                await asyncio.gather(conn.reader_task, return_exceptions=True)
