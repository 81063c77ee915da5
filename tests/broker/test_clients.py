"""Produce and fetch through the pure-Python clients: kafka-python 3.0 and aiokafka 0.14.

kafka-python negotiates every API version from ApiVersions and infers the broker's release from
it; aiokafka only ever sends ApiVersions v0. Both must get working, Kafka-compatible answers.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import MessageSizeTooLargeError
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from sparkeos.broker import EmbeddedBroker
from support.wire import WireClient

CODECS = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
# A whole hour, an hour ago: records this old are inside retention.ms (7 days by default). A fixed date
# long past let the broker's retention delete a test's records between two of its checks.
BASE_TS = (int(time.time()) // 3600 - 1) * 3600 * 1000
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")


def stored_batches(broker: EmbeddedBroker, topic: str, partition: int = 0) -> list[dict[str, int]]:
    directory = Path(broker.config.data_dir) / "topics" / f"{topic}-{partition}"
    batches = []
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        pos = 0
        while pos < len(data):
            fields = _BATCH_HEADER.unpack_from(data, pos)
            batches.append({"base_offset": fields[0], "last_offset": fields[0] + fields[6], "codec": fields[5] & 7,
                            "producer_id": fields[9], "base_sequence": fields[11], "records": fields[12]})
            pos += 12 + fields[1]
    return batches


def compressible(i: int) -> bytes:
    return (f"value-{i}-" + "lorem ipsum " * 20).encode()


# -- kafka-python --------------------------------------------------------------------------------


def kp_producer(broker: EmbeddedBroker, **overrides: Any) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=10, **overrides)


def kp_consumer(broker: EmbeddedBroker, **overrides: Any) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=None, enable_auto_commit=False,
                         **overrides)


def kp_poll(consumer: KafkaConsumer, count: int, timeout: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=300).values():
            got.extend(records)
    assert len(got) == count, f"polled {len(got)} of {count}"
    return got


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
@pytest.mark.parametrize("codec", list(CODECS), ids=[str(c) for c in CODECS])
def test_kafka_python_round_trip(broker: EmbeddedBroker, topic_name: str, codec: str | None,
                                 idempotent: bool) -> None:
    producer = kp_producer(broker, compression_type=codec, enable_idempotence=idempotent, acks="all")
    try:
        # Idempotence needs a broker it recognises as 0.11 or later.
        assert producer.config["api_version"] >= (0, 11)
        futures = [producer.send(topic_name, key=f"k{i}".encode(), value=compressible(i),
                                 headers=[("n", str(i).encode())]) for i in range(150)]
        producer.flush(timeout=20)
        assert [f.get(timeout=10).offset for f in futures] == list(range(150))
    finally:
        producer.close(timeout=5)

    batches = stored_batches(broker, topic_name)
    assert {b["codec"] for b in batches} == {CODECS[codec]}
    assert sum(b["records"] for b in batches) == 150
    if idempotent:
        assert all(b["producer_id"] >= 0 for b in batches)
        assert [b["base_sequence"] for b in batches] == [b["base_offset"] for b in batches]
    else:
        assert all(b["producer_id"] == -1 for b in batches)

    consumer = kp_consumer(broker)
    try:
        tp = TopicPartition(topic_name, 0)
        consumer.assign([tp])
        # Into the middle of a batch: the client must start at exactly this offset.
        start = next((b["base_offset"] + 1 for b in batches if b["records"] > 2), 75)
        consumer.seek(tp, start)
        records = kp_poll(consumer, 150 - start)
        assert [r.offset for r in records] == list(range(start, 150))
        assert [r.value for r in records] == [compressible(i) for i in range(start, 150)]
        assert [r.key for r in records] == [f"k{i}".encode() for i in range(start, 150)]
        assert [list(r.headers) for r in records] == [[("n", str(i).encode())] for i in range(start, 150)]
    finally:
        consumer.close()


def test_kafka_python_offsets_and_seeks(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = kp_producer(broker)
    try:
        timestamps = [1000, 3000, 2000, 3000, 4000]
        for ts in timestamps:
            producer.send(topic_name, value=f"at-{ts}".encode(), timestamp_ms=BASE_TS + ts)
        producer.send(topic_name, key=b"tombstone", value=None, timestamp_ms=BASE_TS + 4000)
        producer.flush(timeout=20)
    finally:
        producer.close(timeout=5)

    consumer = kp_consumer(broker)
    try:
        tp = TopicPartition(topic_name, 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 6}
        found = consumer.offsets_for_times({tp: BASE_TS + 2500})[tp]
        assert (found.offset, found.timestamp) == (1, BASE_TS + 3000)
        found = consumer.offsets_for_times({tp: BASE_TS + 3500})[tp]
        assert (found.offset, found.timestamp) == (4, BASE_TS + 4000)
        assert consumer.offsets_for_times({tp: BASE_TS + 5000})[tp] is None

        consumer.assign([tp])
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == 6
        consumer.seek_to_beginning(tp)
        records = kp_poll(consumer, 6)
        assert [r.timestamp for r in records] == [BASE_TS + ts for ts in timestamps] + [BASE_TS + 4000]
        assert (records[0].key, records[-1].key, records[-1].value) == (None, b"tombstone", None)
        consumer.seek(tp, 3)
        assert [r.offset for r in kp_poll(consumer, 3)] == [3, 4, 5]
    finally:
        consumer.close()


def test_kafka_python_oversized_record_is_refused_by_the_broker(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = kp_producer(broker, max_request_size=5_000_000, acks=1, retries=0)
    try:
        with pytest.raises(MessageSizeTooLargeError):
            producer.send(topic_name, value=os.urandom(1_200_000)).get(timeout=20)
        assert producer.send(topic_name, value=b"fits").get(timeout=20).offset == 0
    finally:
        producer.close(timeout=5)


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_kafka_python_acks(broker: EmbeddedBroker, topic_name: str, acks: int | str) -> None:
    producer = kp_producer(broker, acks=acks)
    try:
        futures = [producer.send(topic_name, value=f"{i}".encode()) for i in range(50)]
        producer.flush(timeout=20)
        for future in futures:
            future.get(timeout=10)
    finally:
        producer.close(timeout=5)
    consumer = kp_consumer(broker, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(topic_name, 0)])
        assert [r.value for r in kp_poll(consumer, 50)] == [f"{i}".encode() for i in range(50)]
    finally:
        consumer.close()


# -- aiokafka ------------------------------------------------------------------------------------


async def _aio_produce(broker: EmbeddedBroker, topic: str, values: list[bytes | None], **options: Any) -> list:
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=10, **options)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, key=f"k{i}".encode(), value=value, headers=[("n", str(i).encode())],
                                timestamp_ms=BASE_TS + i)
            for i, value in enumerate(values)
        ]
        return [await future for future in futures]
    finally:
        await producer.stop()


async def _aio_fetch(consumer: AIOKafkaConsumer, count: int, timeout: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout_ms=300)).values():
            got.extend(records)
    assert len(got) == count, f"fetched {len(got)} of {count}"
    return got


def _aio_consumer(broker: EmbeddedBroker, **options: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=None, enable_auto_commit=False,
                            **options)


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
@pytest.mark.parametrize("codec", list(CODECS), ids=[str(c) for c in CODECS])
def test_aiokafka_round_trip(broker: EmbeddedBroker, topic_name: str, codec: str | None, idempotent: bool) -> None:
    values: list[bytes | None] = [compressible(i) for i in range(120)]
    values[7] = None

    async def run() -> None:
        metadata = await _aio_produce(broker, topic_name, values, compression_type=codec,
                                      enable_idempotence=idempotent)
        assert [m.offset for m in metadata] == list(range(120))
        batches = stored_batches(broker, topic_name)
        assert {b["codec"] for b in batches} == {CODECS[codec]}
        assert all((b["producer_id"] >= 0) == idempotent for b in batches)

        consumer = _aio_consumer(broker)
        await consumer.start()
        try:
            tp = AioTopicPartition(topic_name, 0)
            consumer.assign([tp])
            start = next((b["base_offset"] + 1 for b in batches if b["records"] > 2), 60)
            consumer.seek(tp, start)
            records = await _aio_fetch(consumer, 120 - start)
            assert [r.offset for r in records] == list(range(start, 120))
            assert [r.value for r in records] == values[start:]
            assert [r.key for r in records] == [f"k{i}".encode() for i in range(start, 120)]
            assert [r.timestamp for r in records] == [BASE_TS + i for i in range(start, 120)]
            assert [list(r.headers) for r in records] == [[("n", str(i).encode())] for i in range(start, 120)]
        finally:
            await consumer.stop()

    asyncio.run(run())


def test_aiokafka_offsets_and_long_poll(broker: EmbeddedBroker, topic_name: str) -> None:
    async def run() -> None:
        await _aio_produce(broker, topic_name, [b"a", b"b", b"c"])
        consumer = _aio_consumer(broker, fetch_max_wait_ms=10_000)
        await consumer.start()
        try:
            tp = AioTopicPartition(topic_name, 0)
            assert await consumer.beginning_offsets([tp]) == {tp: 0}
            assert await consumer.end_offsets([tp]) == {tp: 3}
            found = (await consumer.offsets_for_times({tp: BASE_TS + 1}))[tp]
            assert (found.offset, found.timestamp) == (1, BASE_TS + 1)
            assert (await consumer.offsets_for_times({tp: BASE_TS + 3}))[tp] is None

            consumer.assign([tp])
            consumer.seek(tp, 3)
            assert await consumer.getmany(timeout_ms=1000) == {}
            # The parked fetch must be answered as soon as a record arrives, not at max wait.
            waiting = asyncio.ensure_future(consumer.getone())
            await asyncio.sleep(0.3)
            produced_at = time.monotonic()
            await _aio_produce(broker, topic_name, [b"d"])
            record = await asyncio.wait_for(waiting, 8)
            latency = time.monotonic() - produced_at
            assert (record.offset, record.value) == (3, b"d")
            assert latency < 1.5, f"the parked fetch answered {latency:.2f}s after the produce"
        finally:
            await consumer.stop()

    asyncio.run(run())


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_aiokafka_acks(broker: EmbeddedBroker, topic_name: str, acks: int | str) -> None:
    async def run() -> None:
        metadata = await _aio_produce(broker, topic_name, [f"{i}".encode() for i in range(40)], acks=acks)
        if acks != 0:
            assert [m.offset for m in metadata] == list(range(40))
        consumer = _aio_consumer(broker, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition(topic_name, 0)])
            records = await _aio_fetch(consumer, 40)
            assert [r.value for r in records] == [f"{i}".encode() for i in range(40)]
        finally:
            await consumer.stop()

    asyncio.run(run())


# -- every advertised version, through kafka-python's protocol codec ------------------------------


def _batch(count: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(count):
        builder.append(i, BASE_TS + i, b"k", f"v{i}".encode(), [])
    return bytes(builder.build())


def test_every_advertised_data_path_version(broker: EmbeddedBroker, topic_name: str) -> None:
    wire = WireClient(broker.bootstrap_servers)
    try:
        versions = {k.api_key: (k.min_version, k.max_version)
                    for k in wire.request(ApiVersionsRequest(), ApiVersionsResponse, 0).api_keys}
        wire.metadata([topic_name])  # creates the topic: Produce never does
        topic_data = ProduceRequest.TopicProduceData
        produce_versions = [v for v in range(versions[0][0], versions[0][1] + 1) if v >= 3]
        for n, version in enumerate(produce_versions):
            response = wire.request(ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
                topic_data(name=topic_name, partition_data=[topic_data.PartitionProduceData(index=0,
                                                                                            records=_batch(2))])]),
                ProduceResponse, version)
            (partition,) = response.responses[0].partition_responses
            assert (partition.error_code, partition.base_offset) == (0, 2 * n), version
        end = 2 * len(produce_versions)

        fetch_topic = FetchRequest.FetchTopic
        for version in range(versions[1][0], versions[1][1] + 1):
            def fetch(topic: str, offset: int, v: int = version) -> Any:
                request = FetchRequest(max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, topics=[
                    fetch_topic(topic=topic, partitions=[fetch_topic.FetchPartition(
                        partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)])])
                return wire.request(request, FetchResponse, v).responses[0].partitions[0]

            found = fetch(topic_name, 3)
            assert (found.error_code, found.high_watermark) == (0, end), version
            records = MemoryRecords(bytes(found.records))
            offsets = []
            while (batch := records.next_batch()) is not None:
                offsets.extend(r.offset for r in batch)
            assert offsets == list(range(2, end)), version  # from the whole batch holding offset 3
            # Errors come with empty (never null) records, which every client can parse.
            for topic, offset, code in ((topic_name, end + 5, 1), (f"{topic_name}-missing", 0, 3)):
                failed = fetch(topic, offset)
                assert failed.error_code == code, version
                assert failed.records is not None and len(failed.records) == 0, version

        list_topic = ListOffsetsRequest.ListOffsetsTopic
        for version in range(versions[2][0], versions[2][1] + 1):
            wanted = [(-2, 0), (-1, end), (BASE_TS + 1, 1), (BASE_TS + 2, -1)]
            if version >= 7:
                wanted.append((-3, 1))
            request = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[list_topic(
                name=topic_name, partitions=[list_topic.ListOffsetsPartition(partition_index=0, timestamp=ts)
                                             for ts, _ in wanted])])
            partitions = wire.request(request, ListOffsetsResponse, version).topics[0].partitions
            assert [(p.error_code, p.offset) for p in partitions] == [(0, o) for _, o in wanted], version

        for version in range(versions[3][0], versions[3][1] + 1):
            request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic_name)],
                                      allow_auto_topic_creation=False)
            (topic,) = wire.request(request, MetadataResponse, version).topics
            assert (topic.error_code, topic.name, len(topic.partitions)) == (0, topic_name, 1), version
    finally:
        wire.close()
