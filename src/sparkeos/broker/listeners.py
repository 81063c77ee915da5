"""The broker's listeners, in Kafka's `listeners` format: `PROTOCOL://HOST:PORT`, comma-separated.

A listener's name is its security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL): Kafka's
`listener.security.protocol.map`, which lets names differ from protocols, is left out. The first listener is
the one the broker's ready line and `bootstrap_servers` name. Port 0 picks a free port when the listener
binds. Clients are told, in Metadata and FindCoordinator answers, the address of the listener they came in
through, as Kafka does.
"""

from __future__ import annotations

from dataclasses import dataclass

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class ListenerError(ValueError):
    """A `listeners` value Kafka would refuse; the message names the problem."""


@dataclass(slots=True)
class Listener:
    security_protocol: str
    host: str
    port: int  # 0 until bound: then the port bound
    advertised_host: str | None = None
    advertised_port: int | None = None

    @property
    def name(self) -> str:
        return self.security_protocol

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def address(self) -> tuple[str, int]:
        """Where clients are told to connect."""
        return self.advertised_host or self.host, self.advertised_port or self.port

    def __str__(self) -> str:
        return f"{self.security_protocol}://{self.host}:{self.port}"


def parse_listeners(text: str) -> list[Listener]:
    """`SASL_SSL://127.0.0.1:9093,PLAINTEXT://127.0.0.1:9092` as listeners, in order."""
    listeners: list[Listener] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            raise ListenerError(f"listeners {text!r} has an empty entry")
        protocol, separator, address = entry.partition("://")
        if not separator:
            raise ListenerError(f"listener {entry!r} is not PROTOCOL://HOST:PORT")
        if protocol not in SECURITY_PROTOCOLS:
            raise ListenerError(f"listener {entry!r}: unknown security protocol {protocol!r}; one of "
                                f"{', '.join(SECURITY_PROTOCOLS)}")
        host, colon, port = address.rpartition(":")
        host = host.strip("[]")
        if not colon or not host:
            raise ListenerError(f"listener {entry!r} needs a HOST:PORT")
        if not port.isdigit() or int(port) > 65535:
            raise ListenerError(f"listener {entry!r}: port {port!r} is not a number from 0 to 65535")
        if any(existing.name == protocol for existing in listeners):
            raise ListenerError(f"listeners {text!r} name {protocol} twice")
        listeners.append(Listener(protocol, host, int(port)))
    return listeners
