"""Produce, Fetch and ListOffsets through librdkafka (confluent-kafka), checked against the bytes on disk."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from sparkeos.broker import EmbeddedBroker

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
# A whole hour, an hour ago: records this old are inside retention.ms (7 days by default). A fixed date
# long past let the broker's retention delete a test's records between two of its checks.
BASE_TS = (int(time.time()) // 3600 - 1) * 3600 * 1000
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")


# -- helpers -------------------------------------------------------------------------------------


def make_producer(broker: EmbeddedBroker, **overrides: Any) -> Producer:
    config: dict[str, Any] = {"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5}
    config.update(overrides)
    return Producer(config)


def make_consumer(broker: EmbeddedBroker, **overrides: Any) -> Consumer:
    config: dict[str, Any] = {
        "bootstrap.servers": broker.bootstrap_servers,
        "group.id": f"g-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    config.update(overrides)
    return Consumer(config)


class Deliveries:
    """Collects delivery reports so a test can assert on each record's fate."""

    def __init__(self) -> None:
        self.reports: list[tuple[KafkaError | None, Message]] = []

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        self.reports.append((error, message))

    def offsets(self) -> list[int]:
        errors = [e for e, _ in self.reports if e is not None]
        assert not errors, errors
        return [m.offset() for _, m in self.reports]


def flush(producer: Producer, timeout: float = 30.0) -> None:
    assert producer.flush(timeout) == 0, "records still undelivered"


def produce_values(producer: Producer, topic: str, values: list[bytes], **kwargs: Any) -> Deliveries:
    deliveries = Deliveries()
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=f"key-{i}".encode(), on_delivery=deliveries, **kwargs)
        producer.poll(0)
    flush(producer)
    return deliveries


def consume(consumer: Consumer, count: int, timeout: float = 20.0) -> list[Message]:
    """Exactly `count` records (fails on errors or when they do not arrive in time)."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for message in consumer.consume(min(count - len(got), 10_000), 0.5):
            assert message.error() is None, message.error()
            got.append(message)
    assert len(got) == count, f"consumed {len(got)} of {count}"
    return got


def consume_from(broker: EmbeddedBroker, topic: str, offset: int, count: int, partition: int = 0,
                 **overrides: Any) -> list[Message]:
    consumer = make_consumer(broker, **overrides)
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        return consume(consumer, count)
    finally:
        consumer.close()


def stored_batches(broker: EmbeddedBroker, topic: str, partition: int = 0) -> list[dict[str, int]]:
    """Headers of the batches in the partition's segment files, each CRC-checked."""
    directory = Path(broker.config.data_dir) / "topics" / f"{topic}-{partition}"
    batches = []
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        pos = 0
        while pos < len(data):
            (base, length, _epoch, magic, crc, attributes, last_delta, first_ts, max_ts, pid, producer_epoch,
             base_seq, count) = _BATCH_HEADER.unpack_from(data, pos)
            end = pos + 12 + length
            assert magic == 2
            assert crc32c.crc32c(data[pos + 21 : end]) == crc, f"stored batch at {base} fails its CRC"
            batches.append({"base_offset": base, "last_offset": base + last_delta, "codec": attributes & 7,
                            "records": count, "max_timestamp": max_ts, "producer_id": pid, "size": end - pos})
            pos = end
    return batches


@pytest.fixture
def broker4(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tmp_path / "broker4", num_partitions=4) as running:
        yield running


# -- compression and batch shapes ----------------------------------------------------------------


@pytest.mark.parametrize("codec", list(CODECS))
def test_round_trip_with_each_codec_is_stored_untouched(broker: EmbeddedBroker, topic_name: str, codec: str) -> None:
    # Repetitive values so every codec actually shrinks the batch (clients send it
    # uncompressed otherwise).
    values = [(f"value-{i}-" + "abcdefgh" * 40).encode() for i in range(400)]
    producer = make_producer(broker, **{"compression.type": codec, "linger.ms": 50, "enable.idempotence": True})
    offsets = produce_values(producer, topic_name, values).offsets()
    assert sorted(offsets) == list(range(400))

    batches = stored_batches(broker, topic_name)
    assert len(batches) < 100, "records should have been batched"
    # The broker keeps the producer's compressed batch as it is: same codec, no recompression.
    assert {b["codec"] for b in batches} == {CODECS[codec]}
    assert sum(b["records"] for b in batches) == 400
    assert all(b["producer_id"] >= 0 for b in batches)
    if codec != "none":
        assert sum(b["size"] for b in batches) < sum(len(v) for v in values) / 3

    messages = consume_from(broker, topic_name, 0, 400)
    assert [m.offset() for m in messages] == list(range(400))
    assert [m.value() for m in messages] == values
    assert [m.key() for m in messages] == [f"key-{i}".encode() for i in range(400)]


def test_large_values(broker: EmbeddedBroker, topic_name: str) -> None:
    values = [os.urandom(900 * 1024) for _ in range(4)]
    producer = make_producer(broker)
    assert produce_values(producer, topic_name, values).offsets() == [0, 1, 2, 3]
    assert [b["records"] for b in stored_batches(broker, topic_name)] == [1, 1, 1, 1]
    # A partition fetch limit below one batch still returns that batch whole.
    messages = consume_from(broker, topic_name, 1, 3, **{"max.partition.fetch.bytes": 65536})
    assert [m.value() for m in messages] == values[1:]


def test_one_large_batch_of_many_small_records(broker: EmbeddedBroker, topic_name: str) -> None:
    values = [f"r{i:06d}".encode() for i in range(30_000)]
    producer = make_producer(broker, **{"batch.size": 900_000, "batch.num.messages": 100_000,
                                        "linger.ms": 500})
    assert produce_values(producer, topic_name, values).offsets() == list(range(30_000))
    batches = stored_batches(broker, topic_name)
    assert max(b["records"] for b in batches) >= 10_000
    messages = consume_from(broker, topic_name, 0, 30_000)
    assert [m.value() for m in messages] == values


def test_one_record_per_batch(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = make_producer(broker, **{"linger.ms": 0})
    for i in range(30):
        producer.produce(topic_name, value=f"v{i}".encode())
        flush(producer)
    batches = stored_batches(broker, topic_name)
    assert [(b["base_offset"], b["records"]) for b in batches] == [(i, 1) for i in range(30)]
    messages = consume_from(broker, topic_name, 0, 30)
    assert [m.value() for m in messages] == [f"v{i}".encode() for i in range(30)]


def test_keys_headers_nulls_and_timestamps_are_preserved(broker: EmbeddedBroker, topic_name: str) -> None:
    sent = [
        (b"k1", b"v1", [("h", b"a"), ("h", b"b"), ("empty", b""), ("null", None)], BASE_TS + 123),
        (None, b"no key", None, BASE_TS + 5),
        (b"tombstone", None, [("only", b"1")], BASE_TS - 1000),
        (None, None, None, BASE_TS),
        (b"", b"", None, 1),
    ]
    producer = make_producer(broker, **{"linger.ms": 20})
    for key, value, headers, timestamp in sent:
        producer.produce(topic_name, key=key, value=value, headers=headers, timestamp=timestamp)
    flush(producer)
    messages = consume_from(broker, topic_name, 0, len(sent))
    for message, (key, value, headers, timestamp) in zip(messages, sent, strict=True):
        assert message.key() == key
        assert message.value() == value
        assert message.headers() == headers
        assert message.timestamp() == (TIMESTAMP_CREATE_TIME, timestamp)


# -- positions and offsets -----------------------------------------------------------------------


def test_fetch_from_any_offset_including_inside_a_compressed_batch(broker: EmbeddedBroker, topic_name: str) -> None:
    values = [(f"value-{i}-" + "x" * 50).encode() for i in range(300)]
    producer = make_producer(broker, **{"compression.type": "lz4", "linger.ms": 20, "batch.num.messages": 40})
    for chunk in range(0, 300, 40):
        produce_values(producer, topic_name, values[chunk : chunk + 40])
    batches = stored_batches(broker, topic_name)
    assert len(batches) >= 5 and all(b["codec"] == CODECS["lz4"] for b in batches)
    inside = next(b for b in batches[1:] if b["records"] >= 3)
    starts = {0, inside["base_offset"] + 1, inside["last_offset"], batches[-1]["base_offset"], 123, 299}
    assert inside["base_offset"] < inside["base_offset"] + 1 < inside["last_offset"] + 1
    for start in sorted(starts):
        messages = consume_from(broker, topic_name, start, 300 - start)
        assert messages[0].offset() == start
        assert [m.value() for m in messages] == values[start:]


def test_fetch_at_log_end_gets_only_new_records(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = make_producer(broker)
    produce_values(producer, topic_name, [b"a", b"b", b"c"])
    consumer = make_consumer(broker)
    try:
        consumer.assign([TopicPartition(topic_name, 0, 3)])
        assert consumer.consume(10, 1.0) == []
        produce_values(producer, topic_name, [b"d"])
        (message,) = consume(consumer, 1)
        assert (message.offset(), message.value()) == (3, b"d")
    finally:
        consumer.close()


def test_watermarks(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = make_producer(broker)
    produce_values(producer, topic_name, [b"x"] * 7)
    consumer = make_consumer(broker)
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, 7)
        produce_values(producer, topic_name, [b"y"] * 3)
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, 10)
    finally:
        consumer.close()


def test_offsets_for_times(broker: EmbeddedBroker, topic_name: str) -> None:
    # Equal and out-of-order timestamps, across a multi-record batch and single-record batches.
    timestamps = [1000, 2000, 2000, 1500, 3000, 2500, 3000, 2800]
    producer = make_producer(broker, **{"linger.ms": 100})
    for ts in timestamps[:4]:
        producer.produce(topic_name, value=b"v", timestamp=BASE_TS + ts)
    flush(producer)
    for ts in timestamps[4:]:
        producer.produce(topic_name, value=b"v", timestamp=BASE_TS + ts)
        flush(producer)
    assert [b["records"] for b in stored_batches(broker, topic_name)] == [4, 1, 1, 1, 1]

    def expected(target: int) -> int:
        # The first offset whose timestamp is at or after the target, in log order.
        return next((i for i, ts in enumerate(timestamps) if BASE_TS + ts >= target), -1)

    consumer = make_consumer(broker)
    try:
        for ts in (0, 999, 1000, 1001, 1500, 1999, 2000, 2001, 2500, 2800, 2999, 3000, 3001):
            target = BASE_TS + ts if ts else 0
            (found,) = consumer.offsets_for_times([TopicPartition(topic_name, 0, target)], timeout=10)
            assert found.error is None
            assert found.offset == expected(target), ts
    finally:
        consumer.close()

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    tp = TopicPartition(topic_name, 0)
    specs = {
        "earliest": OffsetSpec.earliest(),
        "latest": OffsetSpec.latest(),
        "max": OffsetSpec.max_timestamp(),
        "at 2500": OffsetSpec.for_timestamp(BASE_TS + 2500),
    }
    results = {}
    for name, spec in specs.items():
        info = admin.list_offsets({tp: spec}, request_timeout=10)[tp].result(timeout=15)
        results[name] = (info.offset, info.timestamp)
    assert results["earliest"][0] == 0
    assert results["latest"][0] == len(timestamps)
    # Ties on the largest timestamp resolve to its first record, as in Kafka.
    assert results["max"] == (4, BASE_TS + 3000)
    assert results["at 2500"] == (4, BASE_TS + 3000)


def test_list_offsets_earliest_and_latest_on_empty_and_filled_partition(broker: EmbeddedBroker,
                                                                        topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    producer = make_producer(broker)
    producer.produce(topic_name, value=b"first")
    flush(producer)
    tp = TopicPartition(topic_name, 0)

    def offsets() -> tuple[int, int]:
        earliest = admin.list_offsets({tp: OffsetSpec.earliest()}, request_timeout=10)[tp].result(15).offset
        latest = admin.list_offsets({tp: OffsetSpec.latest()}, request_timeout=10)[tp].result(15).offset
        return earliest, latest

    assert offsets() == (0, 1)
    produce_values(producer, topic_name, [b"v"] * 24)
    assert offsets() == (0, 25)


# -- long polling --------------------------------------------------------------------------------


def test_fetch_long_polls_and_wakes_on_produce(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = make_producer(broker, **{"linger.ms": 0})
    produce_values(producer, topic_name, [b"before"])
    fetch_counts: list[int] = []

    def on_stats(raw: str) -> None:
        stats = json.loads(raw)
        fetch_counts.append(sum(b.get("req", {}).get("Fetch", 0) for b in stats["brokers"].values()))

    consumer = make_consumer(broker, **{"fetch.wait.max.ms": 1000, "statistics.interval.ms": 500,
                                        "stats_cb": on_stats})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 1)])
        idle_until = time.monotonic() + 3.0
        while time.monotonic() < idle_until:
            assert consumer.consume(10, 0.2) == []
        # An idle partition is long-polled: about one Fetch per fetch.wait.max.ms, not a busy loop.
        assert len(fetch_counts) >= 2
        assert fetch_counts[-1] - fetch_counts[0] <= 8, fetch_counts

        # With the consumer parked in a long poll, a produce must wake it right away.
        consumer.close()
        consumer = make_consumer(broker, **{"fetch.wait.max.ms": 10_000})
        consumer.assign([TopicPartition(topic_name, 0, 1)])
        assert consumer.consume(10, 1.5) == []
        produced_at: list[float] = []

        def produce_later() -> None:
            produced_at.append(time.monotonic())
            producer.produce(topic_name, value=b"wake")
            producer.flush(5)

        timer = threading.Timer(0.5, produce_later)
        timer.start()
        (message,) = consume(consumer, 1, timeout=9)
        received_at = time.monotonic()
        timer.join()
        assert message.value() == b"wake"
        latency = received_at - produced_at[0]
        assert latency < 1.5, f"the parked fetch answered {latency:.2f}s after the produce"
    finally:
        consumer.close()


# -- partitions, limits, acks --------------------------------------------------------------------


def test_partitioner_spreads_keys_over_partitions(broker4: EmbeddedBroker, topic_name: str) -> None:
    producer = make_producer(broker4, partitioner="murmur2_random")
    deliveries = Deliveries()
    for i in range(400):
        producer.produce(topic_name, key=f"key-{i % 40}".encode(), value=f"{i}".encode(), on_delivery=deliveries)
    flush(producer)
    partition_of_key: dict[bytes, set[int]] = {}
    per_partition: dict[int, list[int]] = {}
    for error, message in deliveries.reports:
        assert error is None
        partition_of_key.setdefault(message.key(), set()).add(message.partition())
        per_partition.setdefault(message.partition(), []).append(message.offset())
    assert all(len(parts) == 1 for parts in partition_of_key.values())
    assert set(per_partition) == {0, 1, 2, 3}
    for offsets in per_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))

    consumer = make_consumer(broker4)
    try:
        metadata = consumer.list_topics(topic_name, timeout=10)
        assert len(metadata.topics[topic_name].partitions) == 4
        consumer.assign([TopicPartition(topic_name, p, 0) for p in range(4)])
        messages = consume(consumer, 400)
    finally:
        consumer.close()
    by_key: dict[bytes, list[int]] = {}
    for message in messages:
        assert {message.partition()} == partition_of_key[message.key()]
        by_key.setdefault(message.key(), []).append(int(message.value()))
    # Per-key order is the produce order.
    for values in by_key.values():
        assert values == sorted(values)
    assert sum(len(v) for v in by_key.values()) == 400


def test_record_larger_than_max_message_bytes_is_rejected(broker: EmbeddedBroker, topic_name: str) -> None:
    # The client's own limit is raised so the broker is the one that refuses.
    producer = make_producer(broker, **{"message.max.bytes": 5_000_000, "linger.ms": 0})
    deliveries = Deliveries()
    producer.produce(topic_name, value=os.urandom(1_200_000), on_delivery=deliveries)
    flush(producer)
    ((error, _),) = deliveries.reports
    assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    # Nothing was written, and the partition still takes records that fit.
    assert produce_values(producer, topic_name, [os.urandom(1_000_000)]).offsets() == [0]


def test_topic_max_message_bytes_applies(tmp_path: Path, topic_name: str) -> None:
    with EmbeddedBroker(tmp_path / "small", topic_defaults={"max.message.bytes": "20000"}) as small:
        producer = make_producer(small, **{"linger.ms": 0})
        deliveries = Deliveries()
        producer.produce(topic_name, value=os.urandom(30_000), on_delivery=deliveries)
        flush(producer)
        ((error, _),) = deliveries.reports
        assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE
        assert produce_values(producer, topic_name, [os.urandom(15_000)]).offsets() == [0]


def test_log_append_time_topic(tmp_path: Path, topic_name: str) -> None:
    with EmbeddedBroker(tmp_path / "lat", topic_defaults={"message.timestamp.type": "LogAppendTime"}) as lat:
        producer = make_producer(lat, **{"compression.type": "zstd", "linger.ms": 20})
        before = int(time.time() * 1000)
        deliveries = Deliveries()
        for i in range(50):
            producer.produce(topic_name, value=(f"{i}-" + "z" * 100).encode(), timestamp=1000 + i,
                             on_delivery=deliveries)
        flush(producer)
        after = int(time.time() * 1000)
        assert sorted(deliveries.offsets()) == list(range(50))
        for _, message in deliveries.reports:
            kind, stamp = message.timestamp()
            assert kind == TIMESTAMP_LOG_APPEND_TIME and before <= stamp <= after
        # The broker rewrote only the batch header: still zstd, and a valid CRC.
        assert {b["codec"] for b in stored_batches(lat, topic_name)} == {CODECS["zstd"]}
        messages = consume_from(lat, topic_name, 0, 50)
        assert all(m.timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME for m in messages)
        assert all(before <= m.timestamp()[1] <= after for m in messages)
        consumer = make_consumer(lat)
        try:
            (found,) = consumer.offsets_for_times([TopicPartition(topic_name, 0, 1010)], timeout=10)
            assert found.offset == 0  # the producer's own timestamps no longer count
        finally:
            consumer.close()


@pytest.mark.parametrize(("reset", "first_offset"), [("earliest", 0), ("latest", 10)])
def test_fetch_out_of_range_resets_by_policy(broker: EmbeddedBroker, topic_name: str, reset: str,
                                             first_offset: int) -> None:
    producer = make_producer(broker)
    produce_values(producer, topic_name, [f"{i}".encode() for i in range(10)])
    consumer = make_consumer(broker, **{"auto.offset.reset": reset})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 500)])
        if reset == "latest":
            assert consumer.consume(10, 1.5) == []
            produce_values(producer, topic_name, [b"new"])
        (message,) = consume(consumer, 1)
        assert message.offset() == first_offset
    finally:
        consumer.close()


def test_fetch_out_of_range_is_reported_with_reset_error(broker: EmbeddedBroker, topic_name: str) -> None:
    producer = make_producer(broker)
    produce_values(producer, topic_name, [b"a", b"b"])
    consumer = make_consumer(broker, **{"auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 50)])
        deadline = time.monotonic() + 10
        errors = []
        while not errors and time.monotonic() < deadline:
            errors = [m.error() for m in consumer.consume(10, 0.5) if m.error() is not None]
        assert errors and errors[0].code() == KafkaError._AUTO_OFFSET_RESET
    finally:
        consumer.close()


def test_records_survive_restart_across_segments(tmp_path: Path, topic_name: str) -> None:
    data_dir = tmp_path / "restart"
    values = [f"{i:05d}-".encode() + os.urandom(300) for i in range(3000)]
    with EmbeddedBroker(data_dir, topic_defaults={"segment.bytes": "100000"}) as first:
        producer = make_producer(first, **{"linger.ms": 10, "batch.size": 20_000})
        assert sorted(produce_values(producer, topic_name, values).offsets()) == list(range(3000))
        del producer
    segments = sorted((data_dir / "topics" / f"{topic_name}-0").glob("*.log"))
    assert len(segments) > 5
    with EmbeddedBroker(data_dir, topic_defaults={"segment.bytes": "100000"}) as second:
        for start in (0, int(segments[2].stem), int(segments[2].stem) + 1, 2999):
            messages = consume_from(second, topic_name, start, 3000 - start)
            assert [m.value() for m in messages] == values[start:]
        producer = make_producer(second)
        assert produce_values(producer, topic_name, [b"after restart"]).offsets() == [3000]


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_each_acks_setting_delivers(broker: EmbeddedBroker, topic_name: str, acks: str) -> None:
    producer = make_producer(broker, **{"acks": acks, "enable.idempotence": False, "linger.ms": 5})
    values = [f"{acks}-{i}".encode() for i in range(200)]
    offsets = produce_values(producer, topic_name, values).offsets()
    if acks != "0":
        assert sorted(offsets) == list(range(200))
    messages = consume_from(broker, topic_name, 0, 200)
    assert [m.value() for m in messages] == values
