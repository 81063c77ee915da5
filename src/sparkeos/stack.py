"""The local stack: the embedded broker and, when asked, the schema registry beside it.

`sparkeos broker`, `sparkeos demo` and the tests start it from here, in one of three forms:

- `LocalStack`: both in this process, the broker on a background thread;
- `StackProcess`: `sparkeos broker` as a child process that can be killed and restarted on the
  same ports, the registry (when asked) served from that process;
- `serve`: both in the foreground until SIGTERM or SIGINT, which is what `sparkeos broker` runs.

The registry is a Kafka client of the broker that keeps its schemas in the `_schemas` topic, so
the broker knows nothing of it: this module is the one place where the two meet.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from .broker.core import Broker, BrokerConfig
from .broker.embedded import READY_PREFIX, BrokerProcess, EmbeddedBroker
from .broker.server import BrokerServer

if TYPE_CHECKING:
    from .registry import SchemaRegistryServer

# `sparkeos broker --schema-registry` prints this line, then the broker's READY_PREFIX line.
REGISTRY_READY_PREFIX = "sparkeos schema registry ready url="


class LocalStack:
    """The broker on its own thread in this process, and the schema registry when asked.

    >>> with LocalStack("/tmp/data", schema_registry=True) as stack:
    ...     producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    ...     schemas = SchemaRegistryClient({"url": stack.schema_registry_url})

    Port 0 picks a free port. `broker_options` are `BrokerConfig` fields (`num_partitions=4`,
    `topic_defaults={...}`, ...).
    """

    def __init__(self, data_dir: str | os.PathLike, *, host: str = "127.0.0.1", port: int = 0,
                 schema_registry: bool = False, schema_registry_port: int = 0, **broker_options: Any) -> None:
        self.broker = EmbeddedBroker(data_dir, port=port, host=host, **broker_options)
        self.host = host
        self.schema_registry = schema_registry
        self.schema_registry_port = schema_registry_port
        self.registry: SchemaRegistryServer | None = None

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def schema_registry_url(self) -> str:
        if self.registry is None:
            raise RuntimeError("no schema registry: pass schema_registry=True and start the stack")
        return self.registry.url

    def start(self) -> LocalStack:
        self.broker.start()
        if self.schema_registry:
            registry = _registry_server()(self.bootstrap_servers, self.host, self.schema_registry_port)
            try:
                registry.start()
            except BaseException:
                self.broker.stop()
                raise
            self.registry = registry
        return self

    def stop(self) -> None:
        if self.registry is not None:
            self.registry.stop()
            self.registry = None
        self.broker.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class StackProcess:
    """`sparkeos broker` as a child process, with `--schema-registry` when asked.

    For tests that `kill -9` the stack and restart it (both keep their ports across restarts, so
    clients reconnect to the same addresses), and for programs that keep the broker off their own
    interpreter. `extra_args` are more `sparkeos broker` options.
    """

    def __init__(self, data_dir: str | os.PathLike, *, host: str = "127.0.0.1", port: int = 0,
                 schema_registry: bool = False, schema_registry_port: int = 0,
                 extra_args: list[str] | None = None, startup_timeout: float = 60.0) -> None:
        self.broker = BrokerProcess(data_dir, port=port, host=host, startup_timeout=startup_timeout)
        self.host = host
        self.extra_args = list(extra_args or [])
        self.schema_registry = schema_registry
        self.schema_registry_port = schema_registry_port
        self._schema_registry_url = ""

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def schema_registry_url(self) -> str:
        if not self._schema_registry_url:
            raise RuntimeError("no schema registry: pass schema_registry=True and start the stack")
        return self._schema_registry_url

    def start(self) -> StackProcess:
        self.broker.extra_args = list(self.extra_args)
        if self.schema_registry:
            self.broker.extra_args += ["--schema-registry", f"{self.host}:{self.schema_registry_port}"]
        self.broker.start()
        if self.schema_registry:
            urls = [line[len(REGISTRY_READY_PREFIX):].strip() for line in self.broker.announcements
                    if line.startswith(REGISTRY_READY_PREFIX)]
            if not urls:
                self.broker.kill()
                raise RuntimeError(f"the schema registry did not start: {self.broker.announcements!r}")
            self._schema_registry_url = urls[0]
            self.schema_registry_port = int(urls[0].rsplit(":", 1)[1])
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        self.broker.kill()

    crash = kill  # as PostgresServer.crash: what `sparkeos chaos` calls to crash either

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait: a clean shutdown."""
        return self.broker.stop(timeout)

    def restart(self) -> StackProcess:
        self.kill()
        return self.start()

    def __enter__(self) -> StackProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


async def serve(config: BrokerConfig, schema_registry: tuple[str, int] | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then shut down cleanly; `schema_registry` is its (host, port).

    Prints the ready lines `StackProcess` and `BrokerProcess` wait for: the registry's first, then
    the broker's, once each accepts connections.
    """
    broker = Broker(config)
    server = BrokerServer(broker)
    try:
        await server.start()
    except OSError as error:  # the port taken, or the address not this host's: said in a line, not a traceback
        why = os.strerror(error.errno) if error.errno else str(error)
        failed = getattr(error, "listener", None)
        where = f"{failed.host}:{failed.port}" if failed is not None else f"{config.host}:{config.port}"
        print(f"sparkeos broker: cannot listen on {where}: {why}", file=sys.stderr, flush=True)
        await broker.close()
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host = config.advertised_host or config.host
    port = config.advertised_port or config.port
    registry = None
    if schema_registry is not None:
        # The registry is a Kafka client of this broker; it starts off the event loop, which must keep serving it.
        registry = _registry_server()(f"{host}:{port}", *schema_registry)
        await loop.run_in_executor(None, registry.start)
        print(f"{REGISTRY_READY_PREFIX}{registry.url}", flush=True)
    # The bootstrap address, then (with --listeners) every listener as NAME=HOST:PORT.
    named = [f"{listener.name}={listener.address[0]}:{listener.address[1]}" for listener in broker.listeners]
    print(f"{READY_PREFIX}{host}:{port}" + (" " + " ".join(named) if config.listeners else ""), flush=True)
    await stop.wait()
    if registry is not None:
        await loop.run_in_executor(None, registry.stop)
    await server.stop()
    return 0


def _registry_server() -> type[SchemaRegistryServer]:
    # Imported only when a registry is asked for: it brings in confluent-kafka and fastavro, which a
    # broker alone does not need and a `sparkeos broker` start should not wait for.
    from .registry import SchemaRegistryServer

    return SchemaRegistryServer
