"""The TCP front end: frames in, API handlers, frames out, in request order per connection.

Requests on one connection are handled concurrently (a long-polling Fetch does not hold up a
Heartbeat behind it in our code) but started in arrival order and answered in arrival order,
as Kafka clients expect. A frame that cannot be understood closes only its own connection.
"""

from __future__ import annotations

import asyncio
import logging
import struct

from . import apis  # noqa: F401  (registers every API module)
from .apis.fetch_response import FetchResult
from .apis.registry import APIS, RequestContext
from .core import Broker
from .protocol import MalformedRequest, parse_request_header, response_header, unexpected_null

log = logging.getLogger("sparkeos.broker.server")

API_VERSIONS_KEY = 18
MAX_IN_FLIGHT_PER_CONNECTION = 64


def _request_is_flexible(api_key: int, version: int) -> bool:
    entry = APIS.get(api_key)
    if entry is None:
        return False
    if api_key == API_VERSIONS_KEY and not entry.supports(version):
        return False  # unknown future version: answered in v0 form below
    return entry.supports(version) and entry.request_is_flexible(version)


class Connection:
    def __init__(self, broker: Broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.broker = broker
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.responses: asyncio.Queue[asyncio.Task | None] = asyncio.Queue(MAX_IN_FLIGHT_PER_CONNECTION)

    async def serve(self) -> None:
        writer_task = asyncio.create_task(self._write_responses())
        try:
            await self._read_requests()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except MalformedRequest as exc:
            log.info("closing connection from %s: %s", self.peer, exc)
        finally:
            await self.responses.put(None)
            try:
                await writer_task
            except Exception:
                pass
            self.writer.close()

    async def _read_requests(self) -> None:
        max_bytes = self.broker.config.max_request_bytes
        while True:
            (size,) = struct.unpack(">i", await self.reader.readexactly(4))
            if size < 0 or size > max_bytes:
                raise MalformedRequest(f"request of {size} bytes exceeds socket.request.max.bytes ({max_bytes})")
            frame = await self.reader.readexactly(size)
            task = self._dispatch(memoryview(frame))
            await self.responses.put(task)

    def _dispatch(self, frame: memoryview) -> asyncio.Task:
        header = parse_request_header(frame, _request_is_flexible)
        entry = APIS.get(header.api_key)
        if entry is None:
            raise MalformedRequest(f"unknown API key {header.api_key}")
        context = RequestContext(header.api_key, header.api_version, header.correlation_id, header.client_id,
                                 self.peer)
        if not entry.supports(header.api_version):
            if header.api_key == API_VERSIONS_KEY:
                from .apis.api_versions import unsupported_version_response

                return asyncio.create_task(_ready(unsupported_version_response(header.correlation_id)))
            raise MalformedRequest(f"unsupported version {header.api_version} of API {header.api_key}")
        try:
            request = entry.request.decode(frame[header.body_offset :], version=header.api_version)
        except Exception as exc:
            raise MalformedRequest(f"cannot decode API {header.api_key} v{header.api_version}: {exc}") from None
        null_field = unexpected_null(request, entry.request._struct.fields, header.api_version)
        if null_field is not None:
            raise MalformedRequest(f"API {header.api_key} v{header.api_version}: non-nullable {null_field} is null")
        return asyncio.create_task(self._handle(entry, context, request))

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
        while True:
            task = await self.responses.get()
            if task is None:
                return
            try:
                payload = await task
            except Exception:
                log.exception("request from %s failed; closing the connection", self.peer)
                self.writer.close()
                self._drain_queue()
                return
            if payload is not None:
                for part in payload:
                    self.writer.write(part)
                await self.writer.drain()

    def _drain_queue(self) -> None:
        while not self.responses.empty():
            task = self.responses.get_nowait()
            if task is not None:
                task.cancel()


async def _ready(payload: bytes) -> list[bytes | memoryview]:
    return [payload]


class BrokerServer:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task] = set()

    async def start(self) -> int:
        config = self.broker.config
        self.server = await asyncio.start_server(self._accept, config.host, config.port, limit=1 << 20)
        port = self.server.sockets[0].getsockname()[1]
        config.port = port
        self.broker.start_background()
        return port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            await Connection(self.broker, reader, writer).serve()
        except asyncio.CancelledError:
            writer.close()  # broker shutdown: end quietly, the client reconnects elsewhere
        finally:
            self.connections.discard(task)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        await self.broker.close()
