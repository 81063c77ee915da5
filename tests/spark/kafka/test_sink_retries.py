"""A sink task run again in the same Python worker after its first attempt failed with an ambiguous write.

PySpark usually ends a Python worker after a failed task, but a worker may survive one (a task failed by its
input, not by Python, or a worker reused by a future Spark); the sink must not count on either. These tests
call the task function itself twice in one process, as such a worker would, against a broker behind a fault
proxy, and read what was stored below any consumer.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException
from pyspark import TaskContext

from sparkeos.broker.embedded import EmbeddedBroker
from sparkeos.chaos.proxy import TcpProxy
from sparkeos.spark.kafka.options import parse_sink_options
from sparkeos.spark.kafka.sink import protocol, without_transactions
from sparkeos.spark.kafka.sink.startup_checks import prepare_exactly_once
from sparkeos.verify import assert_exactly_once, read_values
from support.spark import create_topic
from support.wire import WireClient

PRODUCE = 0
UNREACHABLE_S = 4.0


class InputFailed(RuntimeError):
    """The task's input failed after its first records went out."""


@pytest.fixture
def task_context() -> Iterator[TaskContext]:
    context = TaskContext._getOrCreate()
    context._partitionId = 0
    context._localProperties = {}
    try:
        yield context
    finally:
        TaskContext._setTaskContext(None)


@pytest.fixture
def proxy(tmp_path) -> Iterator[TcpProxy]:
    """A fault proxy in front of a broker that advertises the proxy, so that every client connection runs
    through it; the broker is `proxy.broker`."""
    with TcpProxy() as running, EmbeddedBroker(tmp_path / "proxied-broker", advertised_host="127.0.0.1",
                                               advertised_port=running.port) as broker:
        running.target = ("127.0.0.1", broker.config.port)
        running.broker = broker
        yield running


def rows(values: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary())})


def input_failing_after_a_lost_produce_answer(proxy: TcpProxy, values: list[bytes],
                                              failed_writers: list) -> Iterator[pa.RecordBatch]:
    """The task's input: its records, then a failure as soon as the broker has stored their Produce request and its
    answer was lost, while the producer, cut off from the broker for a while, still holds them for a retry.
    Empty batches keep the task going until then (it reads ahead while its producer is set up, and produces
    only after)."""
    proxy.drop_answers(PRODUCE, 1)
    yield rows(values)
    deadline = time.monotonic() + 30
    while not proxy.answers_dropped(PRODUCE):
        assert time.monotonic() < deadline, "the producer sent no Produce request"
        time.sleep(0.001)
        yield rows([])
    proxy.refuse_for(UNREACHABLE_S)
    failed_writers.extend(entry.client for entry in protocol._writers.entries.values())
    raise InputFailed("the task's input failed")


def test_a_task_retried_in_the_same_worker_after_a_lost_produce_answer_writes_on_a_new_epoch(proxy, task_context):
    topic = create_topic(proxy.address, "retried-task-output")
    options = parse_sink_options({"kafka.bootstrap.servers": proxy.address, "topic": topic,
                                  "transactionalIdPrefix": "retried-task", "kafka.linger.ms": "0"})
    marker_partitions = prepare_exactly_once(options)
    values = [f"record-{n}".encode() for n in range(10)]
    failed: list = []  # the first attempt's writer
    try:
        with pytest.raises(InputFailed):
            protocol.write_exactly_once(options, "retried-task-0", 0, "query", marker_partitions,
                                        input_failing_after_a_lost_produce_answer(proxy, values, failed))
        assert proxy.answers_dropped(PRODUCE) == 1
        assert len(failed) == 1 and len(protocol._writers) == 0, "the failed attempt's producer is still cached"
        # The retry, in the same process: Spark replays the same input.
        commit = protocol.write_exactly_once(options, "retried-task-0", 0, "query", marker_partitions,
                                             iter([rows(values)]))
        assert (commit.records, commit.skipped) == (10, False)
        assert [entry.client for entry in protocol._writers.entries.values()] != failed
    finally:
        protocol._writers.clear()

    assert_exactly_once(values, read_values(proxy.address, topic))
    with WireClient(proxy.address) as wire:
        logged = [batch for batch in wire.log_batches(topic) if not batch.control]
    # The first attempt's batch reached the log (its answer was what got lost) and was aborted; the retry's
    # records are in a batch of their own, under a newer epoch of the same producer id.
    assert [batch.values for batch in logged] == [values, values]
    first, retry = logged
    assert first.producer_id == retry.producer_id
    assert retry.producer_epoch > first.producer_epoch


def test_an_at_least_once_producer_that_failed_a_delivery_is_not_used_again(broker, task_context):
    topic = create_topic(broker.bootstrap_servers, "at-least-once-output")
    values = [f"record-{n}".encode() for n in range(10)]
    try:
        reachable = parse_sink_options({"kafka.bootstrap.servers": broker.bootstrap_servers, "topic": topic,
                                        "deliveryGuarantee": "at_least_once"})
        without_transactions.write_without_transactions(reachable, 0, iter([rows(values)]))
        assert len(without_transactions._plain_producers) == 1  # a producer that delivered everything is kept
        # Nothing listens there: every record times out undelivered.
        unreachable = parse_sink_options({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": topic,
                                          "deliveryGuarantee": "at_least_once", "kafka.message.timeout.ms": "1000"})
        with pytest.raises(KafkaException):
            without_transactions.write_without_transactions(unreachable, 0, iter([rows(values)]))
        assert len(without_transactions._plain_producers) == 1  # only the first one
    finally:
        without_transactions._plain_producers.clear()
    assert_exactly_once(values, read_values(broker.bootstrap_servers, topic))


@pytest.mark.apache_kafka
def test_a_cached_producer_whose_id_another_worker_left_mid_transaction_is_replaced_at_once(broker, task_context):
    """A worker's cached producer of T, and another worker that took T since and died in the middle of its
    transaction (`sparkeos chaos`'s python-worker-kill): its marker offset is pending, so reading T's marker with
    require_stable waits until that transaction ends, which nothing but Kafka's transaction timeout would do. The
    cached producer, fenced by the other's init_transactions, must be replaced at once: the new producer's
    init_transactions aborts the dead worker's transaction, and the task goes on long before the timeout."""
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, "dead-worker-output")
    timeout_ms = 60_000
    options = parse_sink_options({"kafka.bootstrap.servers": bootstrap, "topic": topic,
                                  "transactionalIdPrefix": "dead-worker", "kafka.linger.ms": "0",
                                  "kafka.transaction.timeout.ms": str(timeout_ms)})
    marker_partitions = prepare_exactly_once(options)
    first, second = [b"batch-0"], [b"batch-1"]
    dead = None
    try:
        protocol.write_exactly_once(options, "dead-worker-0", 0, "query", marker_partitions, iter([rows(first)]))
        cached = [entry.client for entry in protocol._writers.entries.values()]
        # The other worker: a producer of T of its own, its transaction begun (the marker offset sent) and its
        # records produced, then nothing more: a worker killed at the sink's task step.
        dead = protocol._TransactionalWriter(options, "dead-worker-0", "query", marker_partitions)
        dead.begin(1, "query")
        dead.producer.produce(topic, b"never-visible")
        dead.producer.flush(10)
        started = time.monotonic()
        commit = protocol.write_exactly_once(options, "dead-worker-0", 1, "query", marker_partitions,
                                             iter([rows(second)]))
        took_s = time.monotonic() - started
        assert (commit.records, commit.skipped) == (1, False)
        assert [entry.client for entry in protocol._writers.entries.values()] != cached
        assert took_s < timeout_ms / 1000 / 2, f"the task waited {took_s:.1f} s for the dead worker's transaction"
    finally:
        protocol._writers.clear()
        if dead is not None:
            with contextlib.suppress(KafkaException):  # fenced, as it should be
                dead.close()
            # Its producer's close raised: freed with its last reference, before the broker stops.
            dead = None
            gc.collect()
    assert_exactly_once(first + second, read_values(bootstrap, topic))
