"""A long-polling Fetch is woken by appends to the partitions it reads, and only by those."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchResponse

from sparkeos.broker import EmbeddedBroker
from support.long_poll import FETCH_VERSION, MAX_WAIT_MS, parked_fetch, wait_until, waiters_on
from support.wire import WireClient, build_batch


def test_append_wakes_only_the_fetches_of_its_partition(broker: EmbeddedBroker, topic_name: str) -> None:
    quiet, busy = f"{topic_name}-quiet", f"{topic_name}-busy"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for future in admin.create_topics([NewTopic(quiet, 1, 1), NewTopic(busy, 1, 1)]).values():
        future.result(10)
    with WireClient(broker.bootstrap_servers) as consumer, WireClient(broker.bootstrap_servers) as producer:
        started = time.monotonic()
        correlation_id = parked_fetch(consumer, quiet)
        wait_until(lambda: len(waiters_on(broker, quiet)) == 1)
        parked = waiters_on(broker, quiet)
        for _ in range(5):
            assert producer.produce(busy, 0, build_batch([b"elsewhere"])).error_code == 0
        time.sleep(0.05)
        # Appends elsewhere left the parked fetch alone: still the same waiter, never woken.
        assert waiters_on(broker, quiet) == parked
        assert not any(future.done() for future in parked)
        assert producer.produce(quiet, 0, build_batch([b"here"])).error_code == 0
        answer = consumer.receive(FetchResponse, FETCH_VERSION, correlation_id).responses[0].partitions[0]
        elapsed = time.monotonic() - started
    assert answer.error_code == 0
    assert b"here" in bytes(answer.records)
    assert elapsed < MAX_WAIT_MS / 1000 / 2, f"the append did not wake the fetch ({elapsed:.2f}s)"
    assert not waiters_on(broker, quiet)
    assert not broker.broker._append_waiters
