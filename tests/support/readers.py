"""Reading a partition to its end with real consumers, within a deadline.

A consumer that meets a record it cannot parse may raise, report an error, or (librdkafka) stop at
that offset and poll nothing forever: these helpers turn each of those into an AssertionError that
names the offset reached, so a test can require that every partition is readable to its end.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

Record = tuple[int, bytes | None, bytes | None]  # offset, key, value


def read_with_confluent(bootstrap: str, topic: str, partition: int, end: int, start: int = 0,
                        timeout: float = 30.0) -> list[Record]:
    """Every record of the partition from `start` until `end` (the offset after the last one)."""
    # An offset out of range is an error here, never a silent jump to the end.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": False, "auto.offset.reset": "error"})
    consumer.assign([TopicPartition(topic, partition, start)])
    records: list[Record] = []
    position = start
    deadline = time.monotonic() + timeout
    try:
        while position < end:
            if time.monotonic() > deadline:
                raise AssertionError(f"librdkafka stopped at offset {position} of {topic}-{partition} "
                                     f"(end {end}) with no error")
            for message in consumer.consume(500, 0.2):
                if message.error() is not None:
                    raise AssertionError(f"librdkafka reading {topic}-{partition} at {position}: {message.error()}")
                records.append((message.offset(), message.key(), message.value()))
                position = message.offset() + 1
    finally:
        consumer.close()
    return records


def read_with_kafka_python(bootstrap: str, topic: str, partition: int, end: int, start: int = 0,
                           timeout: float = 30.0) -> list[Record]:
    """The same with kafka-python, whose parse errors are raised from poll."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             request_timeout_ms=10000, auto_offset_reset="none")
    tp = KafkaTopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek(tp, start)
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    try:
        while consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise AssertionError(f"kafka-python stopped at offset {consumer.position(tp)} of "
                                     f"{topic}-{partition} (end {end})")
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend((r.offset, r.key, r.value) for r in batch)
    finally:
        consumer.close()
    return records
