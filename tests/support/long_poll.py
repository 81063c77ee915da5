"""Fetches that park on the broker until data arrives, for tests of long polling."""

from __future__ import annotations

import time

from kafka.protocol.consumer import FetchRequest

from sparkeos.broker import EmbeddedBroker
from support.wire import WireClient

FETCH_VERSION = 11
MAX_WAIT_MS = 8000


def parked_fetch(wire: WireClient, topic: str) -> int:
    """Send a Fetch of `topic` partition 0 from offset 0 that waits for data; returns its correlation id."""
    FetchTopic = FetchRequest.FetchTopic
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=MAX_WAIT_MS,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[
            FetchTopic(
                topic=topic,
                partitions=[FetchTopic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)],
            )
        ],
    )
    return wire.send(request, FETCH_VERSION)


def waiters_on(broker: EmbeddedBroker, topic: str) -> set:
    """The futures of the fetches parked on `topic` partition 0 (a woken fetch parks with a new one)."""
    partition_log = broker.broker.partition(topic, 0)
    return set(broker.broker._append_waiters.get(partition_log, ()))


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)
