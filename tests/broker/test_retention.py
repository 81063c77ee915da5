"""Retention by size and by age, and the log start offset it moves, through real clients.

Small segments (segment.bytes=1024) make every topic roll often, so whole segments expire;
what survives must read back exactly, and the new log start must survive a kill -9.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from sparkeos.broker import BrokerProcess, EmbeddedBroker

TIMEOUT = 15.0
SEGMENT_BYTES = 1024
VALUE_SIZE = 100


def value(i: int) -> bytes:
    return f"{i:05d}".encode().ljust(VALUE_SIZE, b".")


def create_topic(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})
    client.create_topics([NewTopic(topic, 1, config=configs)])[topic].result(timeout=TIMEOUT)


def produce(bootstrap: str, topic: str, indexes: range, timestamp_ms: int | None = None) -> None:
    # One record per batch, so segments hold several batches and roll at batch boundaries. Keyed, as a
    # compacted topic requires.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for i in indexes:
        if timestamp_ms is None:
            producer.produce(topic, value=value(i), key=b"%d" % i, partition=0)
        else:
            producer.produce(topic, value=value(i), key=b"%d" % i, partition=0, timestamp=timestamp_ms)
    assert producer.flush(TIMEOUT) == 0


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)
    finally:
        consumer.close()


def wait_for(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


def consume_from(bootstrap: str, topic: str, offset: int, reset: str, count: int) -> list:
    """Up to `count` messages (or the first error) after assigning `offset`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": reset, "enable.auto.commit": False})
    got: list = []
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            got.append(message)
            if message.error() is not None:
                break
    finally:
        consumer.close()
    return got


def segment_files(data_dir: Path, topic: str) -> list[Path]:
    return sorted((data_dir / "topics" / f"{topic}-0").glob("*.log"))


def assert_survivors(bootstrap: str, topic: str, low: int, high: int) -> None:
    """Below the log start: out of range; from it: exactly the surviving records."""
    [error] = consume_from(bootstrap, topic, 0, "error", 1)
    assert error.error() is not None and error.error().code() == KafkaError._AUTO_OFFSET_RESET
    messages = consume_from(bootstrap, topic, 0, "earliest", high - low)
    assert all(m.error() is None for m in messages)
    assert [(m.offset(), m.value()) for m in messages] == [(i, value(i)) for i in range(low, high)]


def test_retention_bytes_set_at_runtime(tmp_path: Path, topic_name: str) -> None:
    with EmbeddedBroker(tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        create_topic(bootstrap, topic_name, {"segment.bytes": str(SEGMENT_BYTES)})
        produce(bootstrap, topic_name, range(200))
        files = segment_files(broker.config.data_dir, topic_name)
        assert len(files) > 20
        assert all(f.stat().st_size <= SEGMENT_BYTES for f in files)
        time.sleep(1.5)  # housekeeping ran: without retention.bytes nothing goes
        assert watermarks(bootstrap, topic_name) == (0, 200)

        retention = 3000
        client = AdminClient({"bootstrap.servers": bootstrap})
        resource = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
            ConfigEntry("retention.bytes", str(retention), incremental_operation=AlterConfigOpType.SET)])
        client.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT)
        wait_for(lambda: watermarks(bootstrap, topic_name)[0] > 0)
        low, high = watermarks(bootstrap, topic_name)
        files = segment_files(broker.config.data_dir, topic_name)
        sizes = [f.stat().st_size for f in files]
        # Kafka's rule: drop the oldest segment while the rest still hold retention.bytes.
        assert sum(sizes) - sizes[0] < retention <= sum(sizes)
        assert int(files[0].stem) == low and high == 200
        assert_survivors(bootstrap, topic_name, low, high)


def test_retention_ms_by_record_timestamps(broker: EmbeddedBroker, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    hour_ago = int(time.time() * 1000) - 3600_000
    create_topic(bootstrap, topic_name, {"segment.bytes": str(SEGMENT_BYTES), "retention.ms": "600000"})
    produce(bootstrap, topic_name, range(60), timestamp_ms=hour_ago)
    produce(bootstrap, topic_name, range(60, 80))
    wait_for(lambda: watermarks(bootstrap, topic_name)[0] > 0)
    low, high = watermarks(bootstrap, topic_name)
    files = segment_files(broker.config.data_dir, topic_name)
    # Only segments whose newest record is too old go: the one holding offset 60 stays.
    assert int(files[0].stem) == low and 0 < low <= 60 and high == 80
    assert len(segment_files(broker.config.data_dir, topic_name)[0].read_bytes()) <= SEGMENT_BYTES
    assert_survivors(bootstrap, topic_name, low, high)


def test_retention_ms_expires_the_active_segment(broker: EmbeddedBroker, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, topic_name, {"retention.ms": "60000"})
    produce(bootstrap, topic_name, range(5), timestamp_ms=int(time.time() * 1000) - 3600_000)
    # As in Kafka, an expired active segment is rolled and deleted, not kept forever.
    wait_for(lambda: watermarks(bootstrap, topic_name) == (5, 5))
    [error] = consume_from(bootstrap, topic_name, 0, "error", 1)
    assert error.error().code() == KafkaError._AUTO_OFFSET_RESET
    produce(bootstrap, topic_name, range(5, 7))
    messages = consume_from(bootstrap, topic_name, 0, "earliest", 2)
    assert [(m.offset(), m.value()) for m in messages] == [(5, value(5)), (6, value(6))]


def test_retention_deletes_only_under_the_delete_policy(broker: EmbeddedBroker, topic_name: str) -> None:
    bootstrap = broker.bootstrap_servers
    hour_ago = int(time.time() * 1000) - 3600_000
    topics = {policy: f"{topic_name}-{policy.replace(',', '-')}" for policy in ("delete", "compact", "compact,delete")}
    for policy, topic in topics.items():
        create_topic(bootstrap, topic, {"cleanup.policy": policy, "retention.ms": "60000"})
        produce(bootstrap, topic, range(5), timestamp_ms=hour_ago)
    wait_for(lambda: watermarks(bootstrap, topics["delete"]) == (5, 5))
    wait_for(lambda: watermarks(bootstrap, topics["compact,delete"]) == (5, 5))
    # The same housekeeping passes left the compact-only topic whole, as Kafka's retention does.
    assert watermarks(bootstrap, topics["compact"]) == (0, 5)
    messages = consume_from(bootstrap, topics["compact"], 0, "error", 5)
    assert [(m.offset(), m.value()) for m in messages] == [(i, value(i)) for i in range(5)]


def test_log_start_survives_kill_and_restart(tmp_path: Path, topic_name: str) -> None:
    process = BrokerProcess(tmp_path / "broker")
    process.start()
    try:
        bootstrap = process.bootstrap_servers
        create_topic(bootstrap, topic_name, {"segment.bytes": str(SEGMENT_BYTES), "retention.bytes": "2048"})
        produce(bootstrap, topic_name, range(120))
        wait_for(lambda: watermarks(bootstrap, topic_name)[0] > 0)
        retained_low, high = watermarks(bootstrap, topic_name)
        assert high == 120

        process.kill()
        process.start()
        assert process.bootstrap_servers == bootstrap
        assert watermarks(bootstrap, topic_name) == (retained_low, 120)
        assert_survivors(bootstrap, topic_name, retained_low, 120)

        # DeleteRecords inside a segment moves the log start past the segment base; that too is durable.
        target = retained_low + 3
        client = AdminClient({"bootstrap.servers": bootstrap})
        tp = TopicPartition(topic_name, 0, target)
        assert client.delete_records([tp])[tp].result(timeout=TIMEOUT).low_watermark == target
        process.kill()
        process.start()
        assert watermarks(bootstrap, topic_name) == (target, 120)
        assert_survivors(bootstrap, topic_name, target, 120)
    finally:
        process.kill()
