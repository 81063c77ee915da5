"""The TCP front end: frames in, API handlers, frames out, in request order per connection.

Requests on one connection are handled concurrently (a long-polling Fetch does not hold up a
Heartbeat behind it in our code) but started in arrival order and answered in arrival order,
as Kafka clients expect. A frame that cannot be understood closes only its own connection.

Frames are received straight into buffers of their own: small ones through a fixed staging
buffer, a large one (a Produce of a big batch) into a buffer of its own that the socket fills
directly, grown (doubling) as its bytes arrive up to the size the frame announced, so a peer
that announces a large request and sends little of it costs little. A frame's bytes are then
not copied again on their way to the log: the Produce decoder hands out views of them, the log
stamps offsets into them in place and writes them from there.

Memory for requests is bounded across connections as Kafka bounds it (`queued.max.request.bytes`,
`RequestMemory`): a frame holds its announced size from the moment it is let in until its handler
has finished, and while the bound is reached no connection starts reading another large frame.
A frame larger than `socket.request.max.bytes` closes its connection as soon as its size is read.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections import deque

from . import apis  # noqa: F401  (registers every API module)
from .apis.api_versions import unsupported_version_response
from .core import Broker
from .dispatch import APIS, RequestContext
from .fetch_encoding import FetchResult
from .listeners import Listener
from .protocol import MalformedRequest, decode_generic, parse_request_header, response_header
from .sasl import ConnectionAuth

log = logging.getLogger("sparkeos.broker.server")

API_VERSIONS_KEY = 18
MAX_IN_FLIGHT_PER_CONNECTION = 64
STAGING_BYTES = 64 * 1024
_SIZE = struct.Struct(">i")


class RequestMemory:
    """The bytes of requests being read or handled, over every connection (Kafka's queued.max.request.bytes).

    As Kafka's memory pool does in its default, non-strict mode, a frame is let in while the total is
    below the limit, even if it takes the total past it: so a request of socket.request.max.bytes is
    always let in once the requests before it are done. A limit of 0 or less is no limit. Frames that
    fit in a connection's staging buffer are always let in (counted all the same): their bytes are
    already in memory, each connection holds few of them, and so small requests such as heartbeats
    keep flowing while large ones wait.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: dict[Connection, None] = {}  # in arrival order

    def take(self, size: int, connection: Connection, force: bool = False) -> bool:
        """Count `size` bytes for a frame; False (and `connection` told when memory is back) if it must wait."""
        if force or size <= STAGING_BYTES or self.limit <= 0 or self.used < self.limit:
            self.used += size
            return True
        self._waiting[connection] = None
        return False

    def give_back(self, size: int) -> None:
        self.used -= size
        if self._waiting and self.used < self.limit:
            waiting, self._waiting = self._waiting, {}
            for connection in waiting:
                connection.memory_available()

    def forget(self, connection: Connection) -> None:
        self._waiting.pop(connection, None)


def _request_is_flexible(api_key: int, version: int) -> bool:
    entry = APIS.get(api_key)
    if entry is None:
        return False
    if api_key == API_VERSIONS_KEY and not entry.supports(version):
        return False  # unknown future version: answered in v0 form below
    return entry.supports(version) and entry.request_is_flexible(version)


class Connection(asyncio.BufferedProtocol):
    def __init__(self, broker: Broker, server: BrokerServer, listener: Listener) -> None:
        self.broker = broker
        self.server = server
        self.listener = listener
        self.auth = ConnectionAuth(listener.sasl, enabled=broker.config.sasl_enabled_mechanisms)
        self.memory = server.memory
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._stage = bytearray(STAGING_BYTES)
        self._staged = 0
        self._frame: bytearray | None = None  # a frame larger than the stage, being received into
        self._frame_size = 0  # its announced size; len(self._frame) grows towards it
        self._filled = 0
        self._waiting_for_memory = False
        # Handler tasks in request order; None ends the connection once the ones before it are answered.
        self._responses: deque[asyncio.Task | None] = deque()
        self._response_queued = asyncio.Event()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._reading_paused = False
        self._reading_done = False
        self._writer: asyncio.Task | None = None
        self._answering: asyncio.Task | None = None  # the handler task the writer awaits

    # -- asyncio.BufferedProtocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self.server.stopping:
            # Accepted just before the listener closed: shutdown has already collected the connections it ends.
            transport.abort()
            return
        self.server.connections.add(self)
        self._writer = asyncio.get_running_loop().create_task(self._write_responses())

    def get_buffer(self, sizehint: int) -> memoryview:
        frame = self._frame
        if frame is not None:
            if self._filled == len(frame):
                self._grow_frame(frame)
            return memoryview(self._frame)[self._filled :]
        return memoryview(self._stage)[self._staged :]

    def _grow_frame(self, frame: bytearray) -> None:
        """Room for more of the frame: twice what it has, up to its announced size."""
        more = min(self._frame_size, max(2 * len(frame), 2 * STAGING_BYTES)) - len(frame)
        try:
            frame += bytes(more)  # in place: no view of it is held between reads
        except BufferError:
            self._frame = frame + bytes(more)

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._filled += nbytes
            if self._filled < self._frame_size:
                return
            frame, self._frame = self._frame, None
            self._receive(self._dispatch, frame, self._frame_size)
        else:
            self._staged += nbytes
            self._receive(self._take_staged_frames)
        if len(self._responses) >= MAX_IN_FLIGHT_PER_CONNECTION:
            self._pause_reading()

    def eof_received(self) -> bool | None:
        # Frames received before the EOF are answered, even those the in-flight limit held back.
        self._receive(self._take_staged_frames, False)
        self._stop_reading()
        # Keep the transport open until the responses before the EOF are written. TLS has no half-close: asyncio
        # closes its transport whatever this returns, and warns when it is True.
        return self.transport is None or self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_reading()
        self._can_write.set()  # a writer waiting for the peer to drain gives up instead

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # -- reading -----------------------------------------------------------------------------

    def _receive(self, step, *args) -> None:
        """Run one reading step; a frame that cannot be understood ends reading on this connection."""
        if self._reading_done:
            return
        try:
            step(*args)
        except MalformedRequest as exc:
            log.info("closing connection from %s: %s", self.peer, exc)
            self._stop_reading()

    def _take_staged_frames(self, limited: bool = True) -> None:
        """Dispatch the whole frames in the stage, up to the in-flight limit and as request memory allows;
        keep the rest for later."""
        stage = self._stage
        max_bytes = self.broker.config.max_request_bytes
        # Unlimited: no frame is shorter than its 4-byte size, so the stage holds fewer than len(stage) of them.
        room = MAX_IN_FLIGHT_PER_CONNECTION - len(self._responses) if limited else len(stage)
        pos = 0
        while self._staged - pos >= _SIZE.size and room > 0:
            (size,) = _SIZE.unpack_from(stage, pos)
            if size < 0 or size > max_bytes:
                raise MalformedRequest(f"request of {size} bytes exceeds socket.request.max.bytes ({max_bytes})")
            start, end = pos + _SIZE.size, pos + _SIZE.size + size
            whole = end <= self._staged
            if not whole and _SIZE.size + size <= len(stage):
                break  # the rest of a small frame is still to come
            if not self.memory.take(size, self, force=not limited):
                self._wait_for_memory()
                break
            if whole:
                self._dispatch(bytearray(memoryview(stage)[start:end]), size)
                pos, room = end, room - 1
                continue
            # Too big for the stage: the rest of it goes straight from the socket into its own buffer.
            self._frame = bytearray(memoryview(stage)[start : self._staged])
            self._frame_size, self._filled = size, self._staged - start
            pos = self._staged
            break
        rest = self._staged - pos
        if pos and rest:
            stage[:rest] = memoryview(stage)[pos : self._staged]
        self._staged = rest

    def _dispatch(self, frame: bytearray, size: int) -> None:
        """Start handling a received frame, which holds `size` bytes of request memory until its handler ends."""
        try:
            task = self._start(memoryview(frame))
        except BaseException:
            self.memory.give_back(size)
            raise
        task.add_done_callback(lambda _: self.memory.give_back(size))
        self._responses.append(task)
        self._response_queued.set()

    def _start(self, frame: memoryview) -> asyncio.Task:
        header = parse_request_header(frame, _request_is_flexible)
        entry = APIS.get(header.api_key)
        if entry is None:
            raise MalformedRequest(f"unknown API key {header.api_key}")
        if not self.auth.allows(header.api_key):
            raise MalformedRequest(f"unexpected request of API {header.api_key} during SASL authentication")
        context = RequestContext(header.api_key, header.api_version, header.correlation_id, header.client_id,
                                 self.peer, self.listener, self.auth)
        if not entry.supports(header.api_version):
            if header.api_key == API_VERSIONS_KEY:
                return asyncio.create_task(_ready(unsupported_version_response(header.correlation_id)))
            raise MalformedRequest(f"unsupported version {header.api_version} of API {header.api_key}")
        body = frame[header.body_offset :]
        if entry.decode is not None:
            request = entry.decode(body, header.api_version)
        else:
            request = decode_generic(entry.request, body, header.api_version, entry.key)
        return asyncio.create_task(self._handle(entry, context, request))

    def _pause_reading(self) -> None:
        assert self.transport is not None
        if not self._reading_paused and not self.transport.is_closing():
            self.transport.pause_reading()
        self._reading_paused = True

    def _stop_reading(self) -> None:
        if self._reading_done:
            return
        self._reading_done = True
        self._pause_reading()
        self.memory.forget(self)
        self._waiting_for_memory = False
        if self._frame is not None:  # a frame that will never be whole
            self._frame = None
            self.memory.give_back(self._frame_size)
        self._responses.append(None)
        self._response_queued.set()

    def _wait_for_memory(self) -> None:
        self._waiting_for_memory = True
        self._pause_reading()

    def memory_available(self) -> None:
        """Called by RequestMemory when a frame this connection could not start may be let in now."""
        self._waiting_for_memory = False
        if self.transport is None or self.transport.is_closing():
            return  # aborted (broker shutdown) and not yet told: nothing more is started on it
        self._resume_reading()

    def _resume_reading(self) -> None:
        """Below the in-flight limit again, or memory is back: frames held in the stage first, then the socket."""
        assert self.transport is not None
        if not self._reading_paused or self._reading_done or self._waiting_for_memory:
            return
        self._receive(self._take_staged_frames)
        if (len(self._responses) < MAX_IN_FLIGHT_PER_CONNECTION and not self._reading_done
                and not self._waiting_for_memory):
            self._reading_paused = False
            self.transport.resume_reading()

    # -- answering ---------------------------------------------------------------------------

    async def _handle(self, entry, context: RequestContext, request) -> list[bytes | memoryview] | None:
        response = await entry.handler(self.broker, context, request)
        if response is None:
            return None  # acks=0 produce: Kafka sends nothing back
        flexible_header = entry.response_is_flexible(context.version) and context.api_key != API_VERSIONS_KEY
        if isinstance(response, FetchResult):
            # Record bytes stay in the buffers they were read into, never joined into one frame.
            parts = response.encode_buffers(context.version)
        else:
            parts = [response.encode(version=context.version)]
        head = response_header(context.correlation_id, flexible_header)
        size = len(head) + sum(len(part) for part in parts)
        parts[0] = struct.pack(">i", size) + head + parts[0]
        return parts

    async def _write_responses(self) -> None:
        transport = self.transport
        assert transport is not None
        try:
            while True:
                while not self._responses:
                    self._response_queued.clear()
                    await self._response_queued.wait()
                task = self._responses.popleft()
                if task is None:
                    return
                self._resume_reading()
                self._answering = task
                try:
                    payload = await task
                except Exception:
                    log.exception("request from %s failed; closing the connection", self.peer)
                    return
                finally:
                    self._answering = None
                if payload is None or transport.is_closing():
                    continue
                for part in payload:
                    transport.write(part)
                await self._can_write.wait()
                if self.auth.failed:
                    log.info("closing connection from %s: SASL authentication failed", self.peer)
                    return
        finally:
            self._cancel_pending()
            transport.close()
            # Tracked until here, not just until the socket closes: shutdown must find its handlers.
            self.server.connections.discard(self)

    def _cancel_pending(self) -> None:
        while self._responses:
            task = self._responses.popleft()
            if task is not None:
                task.cancel()

    def abort(self) -> list[asyncio.Task]:
        """Broker shutdown: drop the connection now (the client reconnects elsewhere); returns the
        tasks to wait for, all cancelled."""
        if self.transport is not None:
            self.transport.abort()
        tasks = [t for t in (self._writer, self._answering, *self._responses) if t is not None]
        for task in tasks:
            task.cancel()
        return tasks


async def _ready(payload: bytes) -> list[bytes | memoryview]:
    return [payload]


class BrokerServer:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.servers: list[asyncio.Server] = []
        self.connections: set[Connection] = set()
        self.memory = RequestMemory(broker.config.queued_max_request_bytes)
        self.stopping = False

    async def start(self) -> int:
        """Bind every listener (each port 0 becomes the one bound); returns the first listener's port."""
        config = self.broker.config
        loop = asyncio.get_running_loop()
        tls = None
        if any(listener.tls for listener in self.broker.listeners):
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
        try:
            for listener in self.broker.listeners:
                server = await loop.create_server(
                    lambda listener=listener: Connection(self.broker, self, listener), listener.host, listener.port,
                    ssl=tls if listener.tls else None)
                self.servers.append(server)
                listener.port = server.sockets[0].getsockname()[1]
        except OSError as error:
            for server in self.servers:
                server.close()
            error.listener = listener  # type: ignore[attr-defined]  # named by `sparkeos broker`'s message
            raise
        first = self.broker.listeners[0]
        config.host, config.port = first.host, first.port
        self.broker.start_background()
        return first.port

    async def stop(self) -> None:
        self.stopping = True
        for server in self.servers:
            server.close()
        tasks = [task for connection in list(self.connections) for task in connection.abort()]
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.broker.close()
