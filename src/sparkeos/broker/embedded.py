"""Running the broker from Python: in a background thread, or as a separate killable process.

With the schema registry beside it, the same is `sparkeos.stack`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from .core import Broker, BrokerConfig
from .server import BrokerServer

# The line `sparkeos broker` prints once it accepts connections.
READY_PREFIX = "sparkeos broker ready bootstrap="


class EmbeddedBroker:
    """A broker on its own event loop thread in this process.

    >>> with EmbeddedBroker("/tmp/data") as broker:
    ...     producer = Producer({"bootstrap.servers": broker.bootstrap_servers})

    Port 0 picks a free port; `options` are `BrokerConfig` fields.
    """

    def __init__(self, data_dir: str | os.PathLike, port: int = 0, host: str = "127.0.0.1", **options: Any) -> None:
        self.config = BrokerConfig(data_dir=Path(data_dir), host=host, port=port, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: BrokerServer | None = None
        self.broker: Broker | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.config.advertised_host or self.config.host}:{self.config.advertised_port or self.config.port}"

    def start(self) -> EmbeddedBroker:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self.broker = Broker(self.config)
                self._server = BrokerServer(self.broker)
                loop.run_until_complete(self._server.start())
            except BaseException as exc:  # surfaced to the caller of start()
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._server.stop())
            loop.close()

        self._thread = threading.Thread(target=run, name="sparkeos-broker", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class BrokerProcess:
    """`sparkeos broker` as a child process, for tests that `kill -9` it and restart it.

    `extra_args` are more `sparkeos broker` options. The lines the command prints before its
    ready line (the schema registry's, see `sparkeos.stack`) are kept in `announcements`.
    """

    def __init__(self, data_dir: str | os.PathLike, port: int = 0, host: str = "127.0.0.1",
                 extra_args: list[str] | None = None, startup_timeout: float = 60.0) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.extra_args = list(extra_args or [])
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[str] | None = None
        self.bootstrap_servers = ""
        self.listeners: dict[str, str] = {}
        self.announcements: list[str] = []

    def start(self) -> BrokerProcess:
        listen = [] if "--listeners" in self.extra_args else ["--listen", f"{self.host}:{self.port}"]
        command = [sys.executable, "-m", "sparkeos", "broker", "--data-dir", str(self.data_dir), *listen,
                   *self.extra_args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.announcements = []
        line = _read_line_with_timeout(self.process, self.startup_timeout)
        while line and not line.startswith(READY_PREFIX):
            self.announcements.append(line.rstrip("\n"))
            line = _read_line_with_timeout(self.process, self.startup_timeout)
        if not line.startswith(READY_PREFIX):
            try:  # at the end of its output: it exited, or is about to
                code = self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            self.kill()
            if code is not None:
                raise RuntimeError(f"broker did not start: it exited with {code} (its error is on stderr)")
            raise RuntimeError(f"broker did not start within {self.startup_timeout:.0f} s: "
                               f"{[*self.announcements, line]!r}")
        bootstrap, *named = line[len(READY_PREFIX):].split()
        self.bootstrap_servers = bootstrap
        # Each listener's address by name, when the broker was given --listeners.
        self.listeners = dict(item.split("=", 1) for item in named)
        # Keep the port across restarts so clients can reconnect to the same address. A port given stays: the ready
        # line names the advertised address, which may be another's (a proxy's).
        if not self.port:
            self.port = int(self.bootstrap_servers.rsplit(":", 1)[1])
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait: a clean shutdown."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def restart(self) -> BrokerProcess:
        self.kill()
        return self.start()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _read_line_with_timeout(process: subprocess.Popen[str], timeout: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline() if process.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0] if result else ""
