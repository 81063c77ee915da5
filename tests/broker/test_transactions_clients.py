"""Transactions through the pure-Python clients: kafka-python 3.0 and aiokafka 0.14.

Both drive the full transactional protocol themselves (InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn) and filter aborted records on the
client side from the aborted-transaction lists the broker returns under read_committed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.structs import OffsetAndMetadata as AioOffsetAndMetadata
from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition

from sparkeos.broker import EmbeddedBroker

# -- kafka-python --------------------------------------------------------------------------------


def kp_transactional(broker: EmbeddedBroker, transactional_id: str) -> KafkaProducer:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, transactional_id=transactional_id,
                             linger_ms=5, max_block_ms=15000)
    producer.init_transactions()
    return producer


def kp_drain(broker: EmbeddedBroker, topic: str, isolation_level: str, settle_s: float = 1.0,
             limit_s: float = 15.0) -> list[bytes]:
    """Everything visible under `isolation_level`, read until nothing new arrives for `settle_s`."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=None, enable_auto_commit=False,
                             isolation_level=isolation_level)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        values: list[bytes] = []
        quiet_since = time.monotonic()
        deadline = time.monotonic() + limit_s
        while time.monotonic() - quiet_since < settle_s and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                if records:
                    values.extend(record.value for record in records)
                    quiet_since = time.monotonic()
        return values
    finally:
        consumer.close()


def kp_committed(broker: EmbeddedBroker, group: str, tp: TopicPartition) -> int | None:
    checker = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=group, enable_auto_commit=False)
    try:
        committed = checker.committed(tp)
        return committed.offset if isinstance(committed, OffsetAndMetadata) else committed
    finally:
        checker.close()


def test_kafka_python_commit_and_abort(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = kp_transactional(broker, f"kp-tx-{uuid.uuid4().hex[:8]}")
    try:
        producer.begin_transaction()
        for i in range(5):
            producer.send(topic_name, b"committed-%d" % i)
        producer.commit_transaction()

        producer.begin_transaction()
        for i in range(3):
            producer.send(topic_name, b"aborted-%d" % i)
        producer.flush(timeout=15)
        producer.abort_transaction()

        producer.begin_transaction()
        producer.send(topic_name, b"after-abort")
        producer.commit_transaction()
    finally:
        producer.close(timeout=5)

    committed = [*(b"committed-%d" % i for i in range(5)), b"after-abort"]
    assert kp_drain(broker, topic_name, "read_committed") == committed
    uncommitted = kp_drain(broker, topic_name, "read_uncommitted")
    # The aborted records stay in the log; only read_committed filters them out.
    assert uncommitted == [*committed[:5], *(b"aborted-%d" % i for i in range(3)), b"after-abort"]


@pytest.mark.parametrize("group_argument", ["metadata", "group_id"])
def test_kafka_python_consume_transform_produce(broker: EmbeddedBroker, topic_name: str,
                                                group_argument: str) -> None:
    source, sink, group = topic_name, f"{topic_name}-out", f"kp-etl-{uuid.uuid4().hex[:8]}"
    plain = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for i in range(6):
        plain.send(source, b"in-%d" % i)
    plain.flush(timeout=15)
    plain.close(timeout=5)

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level="read_committed")
    producer = kp_transactional(broker, f"kp-etl-{uuid.uuid4().hex[:8]}")
    try:
        consumer.subscribe([source])
        batch: list[Any] = []
        deadline = time.monotonic() + 20
        while len(batch) < 6 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300).values():
                batch.extend(records)
        assert [record.value for record in batch] == [b"in-%d" % i for i in range(6)]
        tp = TopicPartition(source, 0)
        group_ref: Any = consumer.group_metadata() if group_argument == "metadata" else group

        def process(records: list[Any], prefix: bytes, end: int) -> None:
            producer.begin_transaction()
            for record in records:
                producer.send(sink, record.value.replace(b"in", prefix))
            producer.send_offsets_to_transaction({tp: OffsetAndMetadata(end, "", -1)}, group_ref)

        process(batch[:3], b"out", 3)
        producer.commit_transaction()
        assert kp_committed(broker, group, tp) == 3

        process(batch[3:], b"aborted", 6)
        # Without require_stable the last published offset is returned while the new one is pending.
        assert kp_committed(broker, group, tp) == 3
        producer.abort_transaction()
        assert kp_committed(broker, group, tp) == 3, "an aborted transaction must not publish its offsets"

        process(batch[3:], b"out", 6)
        producer.commit_transaction()
        assert kp_committed(broker, group, tp) == 6
    finally:
        producer.close(timeout=5)
        consumer.close()
    assert kp_drain(broker, sink, "read_committed") == [b"out-%d" % i for i in range(6)]


# -- aiokafka ------------------------------------------------------------------------------------


async def aio_drain(broker: EmbeddedBroker, topic: str, isolation_level: str, group: str | None,
                    settle_s: float = 1.0, limit_s: float = 15.0) -> list[bytes]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap_servers, group_id=group,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                isolation_level=isolation_level)
    await consumer.start()
    try:
        values: list[bytes] = []
        quiet_since = time.monotonic()
        deadline = time.monotonic() + limit_s
        while time.monotonic() - quiet_since < settle_s and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                if records:
                    values.extend(record.value for record in records)
                    quiet_since = time.monotonic()
        return values
    finally:
        await consumer.stop()


def test_aiokafka_transaction_context(broker: EmbeddedBroker, topic_name: str) -> None:
    class Rollback(Exception):
        pass

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers,
                                    transactional_id=f"aio-tx-{uuid.uuid4().hex[:8]}")
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(4):
                    await producer.send(topic_name, b"committed-%d" % i)
            with pytest.raises(Rollback):
                async with producer.transaction():
                    for i in range(3):
                        await producer.send_and_wait(topic_name, b"aborted-%d" % i)
                    raise Rollback
            async with producer.transaction():
                await producer.send(topic_name, b"after-abort")
        finally:
            await producer.stop()

        group = f"aio-reader-{uuid.uuid4().hex[:8]}"
        committed = [*(b"committed-%d" % i for i in range(4)), b"after-abort"]
        assert await aio_drain(broker, topic_name, "read_committed", group) == committed
        uncommitted = await aio_drain(broker, topic_name, "read_uncommitted", None)
        assert uncommitted == [*committed[:4], *(b"aborted-%d" % i for i in range(3)), b"after-abort"]

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_aiokafka_send_offsets_to_transaction(broker: EmbeddedBroker, topic_name: str) -> None:
    source, sink, group = topic_name, f"{topic_name}-out", f"aio-etl-{uuid.uuid4().hex[:8]}"

    async def committed_offset(tp: AioTopicPartition) -> int | None:
        checker = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=group,
                                   enable_auto_commit=False)
        await checker.start()
        try:
            return await checker.committed(tp)
        finally:
            await checker.stop()

    async def scenario() -> None:
        plain = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
        await plain.start()
        try:
            for i in range(5):
                await plain.send(source, b"in-%d" % i)
            await plain.flush()
        finally:
            await plain.stop()

        consumer = AIOKafkaConsumer(source, bootstrap_servers=broker.bootstrap_servers, group_id=group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    isolation_level="read_committed")
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers,
                                    transactional_id=f"aio-etl-{uuid.uuid4().hex[:8]}")
        await consumer.start()
        await producer.start()
        try:
            batch: list[Any] = []
            deadline = time.monotonic() + 20
            while len(batch) < 5 and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=300)).values():
                    batch.extend(records)
            assert [record.value for record in batch] == [b"in-%d" % i for i in range(5)]
            tp = AioTopicPartition(source, 0)

            async with producer.transaction():
                for record in batch[:2]:
                    await producer.send(sink, record.value.replace(b"in", b"out"))
                await producer.send_offsets_to_transaction({tp: AioOffsetAndMetadata(2, "")}, group)
            assert await committed_offset(tp) == 2

            await producer.begin_transaction()
            for record in batch[2:]:
                await producer.send(sink, record.value.replace(b"in", b"aborted"))
            await producer.send_offsets_to_transaction({tp: AioOffsetAndMetadata(5, "")}, group)
            await producer.abort_transaction()
            assert await committed_offset(tp) == 2, "an aborted transaction must not publish its offsets"

            async with producer.transaction():
                for record in batch[2:]:
                    await producer.send(sink, record.value.replace(b"in", b"out"))
                await producer.send_offsets_to_transaction({tp: AioOffsetAndMetadata(5, "")}, group)
            assert await committed_offset(tp) == 5
        finally:
            await producer.stop()
            await consumer.stop()
        assert await aio_drain(broker, sink, "read_committed", None) == [b"out-%d" % i for i in range(5)]

    asyncio.run(asyncio.wait_for(scenario(), 60))
