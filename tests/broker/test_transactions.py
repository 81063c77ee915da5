"""Transactions and read_committed with librdkafka (confluent-kafka) against the real broker."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sparkeos.broker import EmbeddedBroker
from sparkeos.verify import read_values


def _producer(bootstrap: str, transactional_id: str, **extra: object) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **extra})
    producer.init_transactions(15)
    return producer


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(15)


def test_commit_abort_and_commit_after_abort(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = _producer(broker.bootstrap_servers, "tx-basic")
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic_name, b"committed-%d" % i)
    producer.commit_transaction(15)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic_name, b"aborted-%d" % i)
    producer.flush(15)
    producer.abort_transaction(15)
    producer.begin_transaction()
    producer.produce(topic_name, b"after-abort")
    producer.commit_transaction(15)

    assert read_values(broker.bootstrap_servers, topic_name) == [
        *(b"committed-%d" % i for i in range(5)),
        b"after-abort",
    ]
    # read_uncommitted sees the aborted records too: they are in the log, only filtered.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "ru",
                         "isolation.level": "read_uncommitted"})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    seen = []
    deadline = time.monotonic() + 10
    while len(seen) < 11 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            seen.append(message.value())
    consumer.close()
    assert len(seen) == 11 and b"aborted-0" in seen


def test_atomic_across_partitions_and_topics(broker: EmbeddedBroker) -> None:
    first, second = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    _create(broker.bootstrap_servers, first, 3)
    _create(broker.bootstrap_servers, second, 2)
    producer = _producer(broker.bootstrap_servers, "tx-multi")
    for round_number, commit in enumerate([True, False, True, False]):
        producer.begin_transaction()
        for p in range(3):
            producer.produce(first, b"%d-%d" % (round_number, p), partition=p)
        for p in range(2):
            producer.produce(second, b"%d-%d" % (round_number, p), partition=p)
        producer.flush(15)
        if commit:
            producer.commit_transaction(15)
        else:
            producer.abort_transaction(15)
    assert sorted(read_values(broker.bootstrap_servers, first)) == sorted(
        b"%d-%d" % (r, p) for r in (0, 2) for p in range(3)
    )
    assert sorted(read_values(broker.bootstrap_servers, second)) == sorted(
        b"%d-%d" % (r, p) for r in (0, 2) for p in range(2)
    )


def test_open_transaction_holds_back_lso(broker: EmbeddedBroker, topic_name: str) -> None:
    plain = Producer({"bootstrap.servers": broker.bootstrap_servers})
    plain.produce(topic_name, b"before")
    plain.flush(15)
    producer = _producer(broker.bootstrap_servers, "tx-lso")
    producer.begin_transaction()
    producer.produce(topic_name, b"pending")
    producer.flush(15)
    plain.produce(topic_name, b"after-open")
    plain.flush(15)

    # Only what precedes the open transaction is stable.
    assert read_values(broker.bootstrap_servers, topic_name) == [b"before"]
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "lso",
                         "isolation.level": "read_committed"})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10, cached=False)
    assert (low, high) == (0, 1), "under read_committed the end offset is the last stable offset"
    consumer.close()

    producer.commit_transaction(15)
    assert read_values(broker.bootstrap_servers, topic_name) == [b"before", b"pending", b"after-open"]


def test_second_producer_fences_the_first(broker: EmbeddedBroker, topic_name: str) -> None:
    zombie = _producer(broker.bootstrap_servers, "tx-fence")
    zombie.begin_transaction()
    zombie.produce(topic_name, b"zombie-before-fence")
    zombie.flush(15)

    successor = _producer(broker.bootstrap_servers, "tx-fence")  # aborts the zombie's transaction
    successor.begin_transaction()
    successor.produce(topic_name, b"successor")
    successor.commit_transaction(15)

    with pytest.raises(KafkaException) as failure:
        zombie.produce(topic_name, b"zombie-after-fence")
        zombie.flush(15)
        zombie.commit_transaction(15)
    assert failure.value.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                             KafkaError.INVALID_PRODUCER_EPOCH)
    assert read_values(broker.bootstrap_servers, topic_name) == [b"successor"]


def test_broker_aborts_a_transaction_that_outlives_its_timeout(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = _producer(broker.bootstrap_servers, "tx-timeout", **{"transaction.timeout.ms": 2000})
    producer.begin_transaction()
    producer.produce(topic_name, b"too-slow")
    producer.flush(15)
    deadline = time.monotonic() + 15
    txn = broker.broker.transactions.transactions["tx-timeout"]
    while txn.state != "CompleteAbort" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert txn.state == "CompleteAbort"
    with pytest.raises(KafkaException):
        producer.commit_transaction(15)
    assert read_values(broker.bootstrap_servers, topic_name) == []
    plain = Producer({"bootstrap.servers": broker.bootstrap_servers})
    plain.produce(topic_name, b"later")
    plain.flush(15)
    assert read_values(broker.bootstrap_servers, topic_name) == [b"later"]


def test_timeout_above_broker_maximum_fails_init(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "b", transaction_max_timeout_ms=5000) as small:
        producer = Producer({"bootstrap.servers": small.bootstrap_servers, "transactional.id": "tx-too-long",
                             "transaction.timeout.ms": 10000})
        with pytest.raises(KafkaException) as failure:
            producer.init_transactions(15)
        assert failure.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_send_offsets_to_transaction_published_only_on_commit(broker: EmbeddedBroker, topic_name: str) -> None:
    source, sink, group = topic_name, f"{topic_name}-out", f"etl-{uuid.uuid4().hex[:8]}"
    plain = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(10):
        plain.produce(source, b"in-%d" % i)
    plain.flush(15)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    consumer.subscribe([source])
    batch = []
    deadline = time.monotonic() + 20
    while len(batch) < 10 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            batch.append(message)
    assert len(batch) == 10
    producer = _producer(broker.bootstrap_servers, "tx-etl")
    next_offsets = [TopicPartition(source, 0, batch[-1].offset() + 1)]

    # read_uncommitted asks without require_stable, so it sees the last published offset even
    # while a transaction has one pending.
    checker = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
                        "isolation.level": "read_uncommitted"})

    def committed() -> int:
        return checker.committed([TopicPartition(source, 0)], timeout=10)[0].offset

    producer.begin_transaction()
    for message in batch:
        producer.produce(sink, message.value().replace(b"in", b"out"))
    producer.send_offsets_to_transaction(next_offsets, consumer.consumer_group_metadata(), 15)
    assert committed() < 0
    producer.abort_transaction(15)
    assert committed() < 0, "an aborted transaction must not publish its offsets"

    producer.begin_transaction()
    for message in batch:
        producer.produce(sink, message.value().replace(b"in", b"out"))
    producer.send_offsets_to_transaction(next_offsets, consumer.consumer_group_metadata(), 15)
    producer.commit_transaction(15)
    assert committed() == 10
    checker.close()
    consumer.close()
    assert read_values(broker.bootstrap_servers, sink) == [b"out-%d" % i for i in range(10)]


def test_offset_fetch_require_stable_waits_for_pending_offsets(broker: EmbeddedBroker, topic_name: str) -> None:
    plain = Producer({"bootstrap.servers": broker.bootstrap_servers})
    plain.produce(topic_name, b"x")
    plain.flush(15)
    group = f"stable-{uuid.uuid4().hex[:8]}"
    metadata_consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    producer = _producer(broker.bootstrap_servers, "tx-stable")
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(topic_name, 0, 1)],
                                         metadata_consumer.consumer_group_metadata(), 15)
    coordinator = broker.broker.groups
    pending = coordinator.fetch_offsets(group, [(topic_name, 0)], require_stable=True)
    assert pending[0].error == 88, "UNSTABLE_OFFSET_COMMIT while the transaction is open"
    # librdkafka's read_committed consumers ask with require_stable and keep retrying.
    reader = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
                       "isolation.level": "read_committed"})
    with pytest.raises(KafkaException):
        reader.committed([TopicPartition(topic_name, 0)], timeout=3)
    producer.commit_transaction(15)
    stable = coordinator.fetch_offsets(group, [(topic_name, 0)], require_stable=True)
    assert stable[0].error == 0 and stable[0].offset == 1
    assert reader.committed([TopicPartition(topic_name, 0)], timeout=10)[0].offset == 1
    reader.close()
    metadata_consumer.close()
