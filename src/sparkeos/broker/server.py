"""The TCP front end: frames in, API handlers, frames out, in request order per connection.

Requests on one connection are handled concurrently (a long-polling Fetch does not hold up a
Heartbeat behind it in our code) but started in arrival order and answered in arrival order,
as Kafka clients expect. A frame that cannot be understood closes only its own connection.

Frames are received straight into buffers of their own: small ones through a fixed staging
buffer, a large one (a Produce of a big batch) into a buffer of its exact size that the socket
fills directly. A frame's bytes are then never copied again on their way to the log: the
Produce decoder hands out views of them, the log stamps offsets into them in place and writes
them from there.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque

from . import apis  # noqa: F401  (registers every API module)
from .apis.api_versions import unsupported_version_response
from .core import Broker
from .dispatch import APIS, RequestContext
from .fetch_encoding import FetchResult
from .protocol import MalformedRequest, decode_generic, parse_request_header, response_header

log = logging.getLogger("sparkeos.broker.server")

API_VERSIONS_KEY = 18
MAX_IN_FLIGHT_PER_CONNECTION = 64
STAGING_BYTES = 64 * 1024
_SIZE = struct.Struct(">i")


def _request_is_flexible(api_key: int, version: int) -> bool:
    entry = APIS.get(api_key)
    if entry is None:
        return False
    if api_key == API_VERSIONS_KEY and not entry.supports(version):
        return False  # unknown future version: answered in v0 form below
    return entry.supports(version) and entry.request_is_flexible(version)


class Connection(asyncio.BufferedProtocol):
    def __init__(self, broker: Broker, server: BrokerServer) -> None:
        self.broker = broker
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._stage = bytearray(STAGING_BYTES)
        self._staged = 0
        self._frame: bytearray | None = None  # a frame larger than the stage, being received into
        self._filled = 0
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
        if self._frame is not None:
            return memoryview(self._frame)[self._filled :]
        return memoryview(self._stage)[self._staged :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._filled += nbytes
            if self._filled < len(self._frame):
                return
            frame, self._frame = self._frame, None
            self._receive(self._dispatch, frame)
        else:
            self._staged += nbytes
            self._receive(self._take_staged_frames)
        if len(self._responses) >= MAX_IN_FLIGHT_PER_CONNECTION:
            self._pause_reading()

    def eof_received(self) -> bool | None:
        # Frames received before the EOF are answered, even those the in-flight limit held back.
        self._receive(self._take_staged_frames, False)
        self._stop_reading()
        return True  # keep the transport open until the responses before the EOF are written

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
        """Dispatch the whole frames in the stage, up to the in-flight limit; keep the rest for later."""
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
            if end <= self._staged:
                self._dispatch(bytearray(memoryview(stage)[start:end]))
                pos, room = end, room - 1
                continue
            if _SIZE.size + size > len(stage):
                # Too big for the stage: the rest of it goes straight from the socket into its own buffer.
                frame = bytearray(size)
                frame[: self._staged - start] = memoryview(stage)[start : self._staged]
                self._frame, self._filled = frame, self._staged - start
                pos = self._staged
            break
        rest = self._staged - pos
        if pos and rest:
            stage[:rest] = memoryview(stage)[pos : self._staged]
        self._staged = rest

    def _dispatch(self, frame: bytearray) -> None:
        self._responses.append(self._start(memoryview(frame)))
        self._response_queued.set()

    def _start(self, frame: memoryview) -> asyncio.Task:
        header = parse_request_header(frame, _request_is_flexible)
        entry = APIS.get(header.api_key)
        if entry is None:
            raise MalformedRequest(f"unknown API key {header.api_key}")
        context = RequestContext(header.api_key, header.api_version, header.correlation_id, header.client_id,
                                 self.peer)
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
        self._responses.append(None)
        self._response_queued.set()

    def _resume_reading(self) -> None:
        """Below the in-flight limit again: frames held in the stage first, then the socket."""
        assert self.transport is not None
        if not self._reading_paused or self._reading_done:
            return
        self._receive(self._take_staged_frames)
        if len(self._responses) < MAX_IN_FLIGHT_PER_CONNECTION and not self._reading_done:
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
        self.server: asyncio.Server | None = None
        self.connections: set[Connection] = set()
        self.stopping = False

    async def start(self) -> int:
        config = self.broker.config
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Connection(self.broker, self),
                                               config.host, config.port)
        port = self.server.sockets[0].getsockname()[1]
        config.port = port
        self.broker.start_background()
        return port

    async def stop(self) -> None:
        self.stopping = True
        if self.server is not None:
            self.server.close()
        tasks = [task for connection in list(self.connections) for task in connection.abort()]
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.broker.close()
