"""Clients cached per Python worker, so tasks do not pay a client's set-up (connections, a transactional
producer's init_transactions) again and again.

Like Spark's own Kafka connector, a cached client that sits idle longer than its timeout is closed by a
background evictor: a worker that served a finished query (or a cluster that is gone) does not keep
connections, threads and reconnect attempts alive for the rest of its life. Python workers cannot read
SparkConf, so a cache reads its timeout from an environment variable of the executors, which a connector
names (for Kafka, `sparkeos.spark.kafka.options`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from .options import duration_ms

Client = TypeVar("Client")
Result = TypeVar("Result")

# The longest wait between two evictions: Spark's Kafka connector's spark.kafka.*.cache.evictorThreadRunInterval.
EVICTOR_MAX_INTERVAL_S = 60.0


def idle_timeout_s(variable: str, default: str) -> float:
    """The idle timeout in `variable` (a Spark duration such as 30s or 10m), else `default`."""
    text = os.environ.get(variable) or default
    milliseconds = duration_ms(text)
    if not milliseconds:
        raise ValueError(f"environment variable {variable} must be a positive duration such as 30s or 10m, "
                         f"got {text!r}")
    return milliseconds / 1000


class ClientCallStuck(TimeoutError):
    """A client call that its own timeout did not end: the client may never return from it."""


def call_with_deadline(call: Callable[[], Result], deadline_s: float, what: str) -> Result:
    """`call()`, waited for at most `deadline_s`: for a client call whose own timeout is not kept (librdkafka's).

    The call runs in a daemon thread. If it is still running at the deadline, ClientCallStuck is raised
    and the thread is left blocked; the caller must then abandon the client, never close it (closing
    would wait for the blocked call)."""
    outcome: list[tuple[bool, object]] = []
    finished = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome.append((False, exc))
        finally:
            finished.set()

    threading.Thread(target=run, name="sparkeos-client-call", daemon=True).start()
    if not finished.wait(deadline_s):
        raise ClientCallStuck(f"{what} did not return within {deadline_s:.0f} s")
    returned, value = outcome[0]
    if returned:
        return value  # type: ignore[return-value]
    raise value  # type: ignore[misc]


@dataclass
class _Entry(Generic[Client]):
    client: Client
    last_used: float
    leases: int = 0


class ClientCache(Generic[Client]):
    """A small LRU with idle eviction. Clients are leased: one held by a running task is never closed."""

    def __init__(self, capacity: int, close: Callable[[Client], None], timeout_variable: str, default_timeout: str):
        self.capacity = capacity
        self.close = close
        self.timeout_variable = timeout_variable
        self.default_timeout = default_timeout
        self.entries: OrderedDict[Hashable, _Entry[Client]] = OrderedDict()
        self.lock = threading.Lock()
        self.evictor_pid: int | None = None
        self._timeout_s: float | None = None

    @contextmanager
    def lease(self, key: Hashable, create: Callable[[], Client]) -> Iterator[Client]:
        """The cached client for `key` (created if missing), held until the block ends."""
        client = self.acquire(key, create)
        try:
            yield client
        finally:
            self.release(client)

    def acquire(self, key: Hashable, create: Callable[[], Client]) -> Client:
        self._start_evictor()
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None:
                entry.leases += 1
                entry.last_used = time.monotonic()
                self.entries.move_to_end(key)
                return entry.client
        # Created outside the lock, so the evictor never waits on a slow set-up (a transactional producer's
        # init_transactions); a Python worker runs one task at a time, so no other task races for `key`.
        client = create()
        with self.lock:
            self.entries[key] = _Entry(client, time.monotonic(), leases=1)
            evicted = self._over_capacity()
        self._close_all(evicted)
        return client

    def release(self, client: Client) -> None:
        with self.lock:
            for entry in self.entries.values():
                if entry.client is client:
                    entry.leases = max(entry.leases - 1, 0)
                    entry.last_used = time.monotonic()

    def forget(self, client: Client) -> None:
        """Drop and close a broken or fenced client, leased or not; one forgotten before is left alone."""
        with self.lock:
            keys = [key for key, entry in self.entries.items() if entry.client is client]
            for key in keys:
                del self.entries[key]
        if keys:
            self._close_all([client])

    def evict_idle(self, now: float | None = None) -> int:
        """Close every client that no task holds and that has been idle longer than the timeout."""
        now = time.monotonic() if now is None else now
        timeout = self.timeout_s()
        with self.lock:
            idle = [key for key, entry in self.entries.items() if not entry.leases and now - entry.last_used > timeout]
            evicted = [self.entries.pop(key).client for key in idle]
        self._close_all(evicted)
        return len(evicted)

    def clear(self) -> None:
        """Close every client, leased or not."""
        with self.lock:
            clients = [entry.client for entry in self.entries.values()]
            self.entries.clear()
        self._close_all(clients)

    def __len__(self) -> int:
        return len(self.entries)

    def timeout_s(self) -> float:
        """Read once: a worker's environment does not change while it runs."""
        if self._timeout_s is None:
            self._timeout_s = idle_timeout_s(self.timeout_variable, self.default_timeout)
        return self._timeout_s

    def _over_capacity(self) -> list[Client]:
        evicted = []
        for key in list(self.entries):
            if len(self.entries) <= self.capacity:
                break
            if not self.entries[key].leases:
                evicted.append(self.entries.pop(key).client)
        return evicted

    def _close_all(self, clients: list[Client]) -> None:
        for client in clients:
            try:
                self.close(client)
            except Exception:  # noqa: BLE001 - a client being dropped may be broken in any way
                pass

    def _start_evictor(self) -> None:
        # Per process: a worker forked from one that had started the thread must start its own.
        if self.evictor_pid == os.getpid():
            return
        interval = min(max(self.timeout_s() / 2, 0.5), EVICTOR_MAX_INTERVAL_S)
        self.evictor_pid = os.getpid()
        threading.Thread(target=self._evict_forever, args=(interval,), name="sparkeos-client-evictor",
                         daemon=True).start()

    def _evict_forever(self, interval: float) -> None:
        while True:
            time.sleep(interval)
            self.evict_idle()
