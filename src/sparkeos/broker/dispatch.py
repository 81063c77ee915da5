"""The table of Kafka APIs the broker implements, which the server dispatches requests by.

Each module of `apis/` registers its handler here with `@api`; importing `sparkeos.broker.apis` registers them all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import Broker
    from .listeners import Listener
    from .sasl import ConnectionAuth


@dataclass(slots=True)
class RequestContext:
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    peer: str
    listener: Listener  # the one the request came in through: its address is what clients are told
    auth: ConnectionAuth  # the connection's: who it is, or where it is in authenticating

    @property
    def host(self) -> str:
        """The client's IP address, as ACLs name hosts."""
        host = self.peer.rpartition(":")[0].strip("[]")
        return host.removeprefix("::ffff:")  # an IPv4 client of a dual-stack socket, as Java names it


Handler = Callable[["Broker", RequestContext, Any], Awaitable[Any]]
# A dedicated request decoder: (body, version) -> request; raises MalformedRequest on bad input.
Decoder = Callable[[memoryview, int], Any]


@dataclass(slots=True)
class Api:
    key: int
    request: type
    response: type
    min_version: int
    max_version: int
    handler: Handler
    decode: Decoder | None = None  # None: kafka-python's generic decoder of `request`

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def request_is_flexible(self, version: int) -> bool:
        return self.request.flexible_version_q(version)

    def response_is_flexible(self, version: int) -> bool:
        return self.response.flexible_version_q(version)


APIS: dict[int, Api] = {}


def api(request: type, response: type, min_version: int, max_version: int, decode: Decoder | None = None):
    """Register a handler; the versions are exactly what ApiVersions advertises."""

    def register(handler: Handler) -> Handler:
        if request.API_KEY in APIS:
            raise RuntimeError(f"API key {request.API_KEY} registered twice")
        APIS[request.API_KEY] = Api(request.API_KEY, request, response, min_version, max_version, handler, decode)
        return handler

    return register
