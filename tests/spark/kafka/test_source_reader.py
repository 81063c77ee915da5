"""The source's executor-side reader without Spark: one cached consumer reading ranges of several topics.

Correctness only; the stalls these paths avoid are measured by benchmarks/pipeline.py, not asserted here."""

from __future__ import annotations

import gc
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark import TaskContext

from sparkeos.ports import free_port
from sparkeos.spark import gc_pause
from sparkeos.spark.gc_pause import cyclic_gc_paused
from sparkeos.spark.kafka.cluster import learn_topic
from sparkeos.spark.kafka.options import parse_source_options
from sparkeos.spark.kafka.source import range_reader
from sparkeos.spark.kafka.source.offsets import DataLossError
from sparkeos.spark.kafka.source.planner import KafkaRange
from sparkeos.spark.kafka.source.range_reader import read_range


@pytest.fixture
def reader_cache():
    yield range_reader._consumers
    range_reader._consumers.clear()  # before the broker stops


def _topic_with_records(bootstrap: str, name: str, count: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the result: its destruction fails the future
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(name, value=f"{name}-{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0


def _read(options, topic: str, partition: int, start: int, end: int) -> list[tuple[int, bytes]]:
    rows = []
    for batch in read_range(options, KafkaRange(topic, partition, start, end)):
        rows += zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
    return rows


def test_one_cached_consumer_reads_ranges_of_topics_it_has_not_seen(broker, reader_cache):
    options = parse_source_options({"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": "x"},
                                   streaming=True)
    for name in ("reader-a", "reader-b", "reader-c"):
        _topic_with_records(broker.bootstrap_servers, name, 40)
    for name in ("reader-a", "reader-b", "reader-c"):
        # Partition 1 holds records 1, 3, ..., 39 at offsets 0-19; the range ends mid-partition.
        assert _read(options, name, 1, 2, 12) == [(o, f"{name}-{2 * o + 1}".encode()) for o in range(2, 12)]
        assert _read(options, name, 0, 0, 20) == [(o, f"{name}-{2 * o}".encode()) for o in range(20)]
    assert len(reader_cache) == 1  # every range went through the same consumer


def test_learning_a_topic_from_an_unreachable_cluster_gives_up_quietly():
    port = free_port()
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "unreachable", "log_level": 0})
    try:
        # Raises nothing: only the read itself reports an unreachable cluster (after kafkaConsumer.pollTimeoutMs).
        learn_topic(consumer, "anything", 0.5)
    finally:
        consumer.close()


def test_ranges_ending_at_the_end_of_a_transactional_partition_hold_only_committed_records(broker, reader_cache):
    bootstrap = broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("reader-txn", 1, 1)])["reader-txn"].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "reader-txn"})
    producer.init_transactions(30)
    committed = []
    for txn in range(6):  # each transaction: 3 records and a marker; every other one aborted
        producer.begin_transaction()
        for i in range(3):
            producer.produce("reader-txn", value=b"%d-%d" % (txn, i), partition=0)
        if txn % 2:
            assert producer.flush(30) == 0  # in the log before the abort, not purged from the client's queue
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed += [b"%d-%d" % (txn, i) for i in range(3)]
    options = parse_source_options({"kafka.bootstrap.servers": bootstrap, "subscribe": "x"}, streaming=True)
    end = 6 * 4  # 3 records and a marker per transaction
    watermarks = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-txn-check"})
    try:
        assert watermarks.get_watermark_offsets(TopicPartition("reader-txn", 0), timeout=30) == (0, end)
    finally:
        watermarks.close()
    assert [value for _, value in _read(options, "reader-txn", 0, 0, end)] == committed
    assert [value for _, value in _read(options, "reader-txn", 0, 9, end)] == committed[4:]  # from "2-1"
    assert _read(options, "reader-txn", 0, 22, end) == []  # aborted records and markers only


def test_offsets_gone_from_kafka_fail_the_read_or_are_skipped_within_the_range(broker, reader_cache):
    """failOnDataLoss=false reads what is left of the range: never records below it, and a log that now ends
    below the range (a topic deleted and made again) ends the read at once rather than after a poll timeout."""
    bootstrap = broker.bootstrap_servers
    _topic_with_records(bootstrap, "gone", 40)  # 20 records per partition
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition("gone", 0, 15)])[TopicPartition("gone", 0, 15)].result(30)
    strict = parse_source_options({"kafka.bootstrap.servers": bootstrap, "subscribe": "x"}, streaming=True)
    lenient = parse_source_options({"kafka.bootstrap.servers": bootstrap, "subscribe": "x", "failOnDataLoss": "false",
                                    "kafkaConsumer.pollTimeoutMs": "20000"}, streaming=True)
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        _read(strict, "gone", 0, 10, 18)
    assert _read(lenient, "gone", 0, 10, 18) == [(o, f"gone-{2 * o}".encode()) for o in range(15, 18)]
    started = time.monotonic()
    assert _read(lenient, "gone", 1, 30, 35) == []
    assert time.monotonic() - started < 5
    assert _read(lenient, "gone", 1, 5, 8) == [(o, f"gone-{2 * o + 1}".encode()) for o in range(5, 8)]


def test_the_cyclic_gc_is_paused_while_a_range_is_read_and_restored_however_the_read_ends(broker, reader_cache):
    options = parse_source_options({"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": "x"},
                                   streaming=True)
    _topic_with_records(broker.bootstrap_servers, "reader-gc", 40)
    assert gc.isenabled()
    whole = read_range(options, KafkaRange("reader-gc", 0, 0, 20))
    first = next(whole)
    assert not gc.isenabled()  # between batches too: Spark serializes a batch while the reader waits at yield
    assert [first, *whole] and gc.isenabled()
    abandoned = read_range(options, KafkaRange("reader-gc", 1, 0, 20))
    next(abandoned)
    abandoned.close()  # a task that stops reading early
    assert gc.isenabled()
    gc.disable()
    try:
        assert _read(options, "reader-gc", 0, 0, 20)
        assert not gc.isenabled()  # paused by someone else before: left paused
    finally:
        gc.enable()


def test_nested_and_overlapping_pauses_restore_the_collector_after_the_last_one():
    assert gc.isenabled()
    outer, inner = cyclic_gc_paused(), cyclic_gc_paused()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the first one to end is not the last
    assert not gc.isenabled()
    inner.__exit__(None, None, None)
    assert gc.isenabled()
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        raise RuntimeError("a failing task")
    assert gc.isenabled()


def test_a_task_freezes_what_its_worker_held_before_it_and_the_driver_never_does(monkeypatch):
    monkeypatch.setattr(gc_pause, "_worker_frozen", False)
    gc.unfreeze()
    try:
        with cyclic_gc_paused():  # no TaskContext: the driver, or a test
            pass
        assert gc.get_freeze_count() == 0
        TaskContext._getOrCreate()
        loaded = len(gc.get_objects())
        with cyclic_gc_paused():
            frozen = gc.get_freeze_count()
        assert frozen >= loaded * 0.9 and len(gc.get_objects()) < loaded * 0.1
        later = [[] for _ in range(1000)]  # a later task's objects
        with cyclic_gc_paused():  # once per worker: later tasks' objects stay collectable
            assert gc.get_freeze_count() <= frozen and len(gc.get_objects()) >= len(later)
    finally:
        TaskContext._setTaskContext(None)
        gc.unfreeze()
