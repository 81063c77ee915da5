"""Row encoding: the sink's input rows (Spark's Kafka sink columns, in Arrow batches) as Kafka messages."""

from __future__ import annotations

import zlib

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer


class Rows:
    """The columns of one Arrow batch as Python lists, ready for Producer.produce."""

    def __init__(self, batch: pa.RecordBatch, default_topic: str | None):
        names = {name.lower(): i for i, name in enumerate(batch.schema.names)}
        self.count = batch.num_rows
        self.values = _bytes_column(batch, names["value"])
        self.values_have_nulls = batch.column(names["value"]).null_count > 0
        # An all-null key column is no column: a message without a key is cheaper to build (see _produce_simple).
        has_keys = "key" in names and batch.column(names["key"]).null_count < self.count
        self.keys = _bytes_column(batch, names["key"]) if has_keys else None
        self.topics = batch.column(names["topic"]).to_pylist() if "topic" in names else None
        self.partitions = batch.column(names["partition"]).to_pylist() if "partition" in names else None
        self.headers = batch.column(names["headers"]).to_pylist() if "headers" in names else None
        self.default_topic = default_topic

    def count_by_topic(self, counts: dict[str, int]) -> None:
        """Add this batch's records to `counts`, by the topic each goes to."""
        if self.topics is None:
            counts[self.default_topic] = counts.get(self.default_topic, 0) + self.count
            return
        for topic in self.topics:
            topic = topic if topic is not None else self.default_topic
            counts[topic] = counts.get(topic, 0) + 1

    def produce_all(self, producer: Producer, on_delivery=None) -> None:
        if self.topics is None and self.partitions is None and self.headers is None:
            self._produce_simple(producer, on_delivery)
            return
        keys = self.keys or [None] * self.count
        for i in range(self.count):
            args = self._row(i, keys[i])
            if on_delivery is not None:
                args["on_delivery"] = on_delivery
            produce(producer, args)

    def _produce_simple(self, producer: Producer, on_delivery) -> None:
        """Value, key and the sink's topic: one produce_batch call per Arrow batch, the sink's hot loop, far cheaper
        than a produce() call per record. Without keys the messages are built without a "key": None in each, which
        makes them markedly cheaper to build."""
        if self.keys is None:
            messages = [{"value": value} for value in self.values]
        else:
            messages = [{"value": value, "key": key} for value, key in zip(self.values, self.keys, strict=True)]
        _produce_batch_in_order(producer, self.default_topic, messages, on_delivery)

    def _row(self, i: int, key) -> dict:
        topic = self.topics[i] if self.topics is not None and self.topics[i] is not None else self.default_topic
        if topic is None:
            raise ValueError("a row has a null 'topic' and the sink has no 'topic' option")
        args = {"topic": topic, "value": self.values[i], "key": key}
        if self.partitions is not None and self.partitions[i] is not None:
            args["partition"] = self.partitions[i]
        if self.headers is not None and self.headers[i]:
            args["headers"] = [(h["key"], h["value"]) for h in self.headers[i]]
        return args


class RecordDigest:
    """An order-free digest of a task's records (key and value): the sum of a checksum of each record, so that the
    same records in another order give the same digest, and a record more, less or changed almost surely another.
    Cheap enough for every committed task: the hashing runs in C over the lists the producer is handed anyway, with
    Adler-32 for values (a third of CRC-32's cost) started from the CRC-32 of the key."""

    def __init__(self) -> None:
        self.records = 0
        self._sum = 0

    def add(self, rows: Rows) -> None:
        values = [b"" if v is None else v for v in rows.values] if rows.values_have_nulls else rows.values
        if rows.keys is None:
            self._sum += sum(map(zlib.adler32, values))
        else:
            keys = [b"" if k is None else k for k in rows.keys]
            self._sum += sum(map(zlib.adler32, values, map(zlib.crc32, keys)))
        self.records += rows.count

    @property
    def hex(self) -> str:
        return f"{self._sum % (1 << 64):016x}"


def _bytes_column(batch: pa.RecordBatch, index: int) -> list:
    column = batch.column(index)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [None if v is None else v.encode() for v in column.to_pylist()]
    return column.to_pylist()


def produce(producer: Producer, args: dict) -> None:
    """`producer.produce(**args)`, waiting for room whenever the producer's queue is full."""
    while True:
        try:
            producer.produce(**args)
            return
        except BufferError:
            producer.poll(0.05)  # local queue full: let deliveries drain


def _produce_batch_in_order(producer: Producer, topic: str, messages: list[dict], on_delivery) -> None:
    """Queue `messages` in order, waiting for room whenever the producer's queue is full."""
    extra = {} if on_delivery is None else {"on_delivery": on_delivery}
    while messages:
        queued = producer.produce_batch(topic, messages, **extra)
        if queued == len(messages):
            return
        # librdkafka queues a batch's messages in order and stops at the first that does not fit; no room can
        # free up meanwhile, as delivered messages are released only by poll(). Anything else is an error.
        first = next(i for i, message in enumerate(messages) if "_error" in message)
        error = messages[first]["_error"]
        rest = messages[first:]
        if error.code() != KafkaError._QUEUE_FULL or queued != first or any("_error" not in m for m in rest):
            raise KafkaException(error)
        for message in rest:
            del message["_error"]
        messages = rest
        producer.poll(0.05)  # local queue full: let deliveries drain
