"""Executor-side reading: the visible records of one offset range [start, end) of one partition, as Arrow batches.

One consumer per Python worker and configuration, cached, so connections survive from task to task.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import InputPartition

from ...client_cache import ClientCache
from ...gc_pause import cyclic_gc_paused
from ..cluster import KafkaNotAuthorized, learn_topic
from ..options import CONSUMER_CACHE_TIMEOUT, CONSUMER_TIMEOUT_ENV, SourceOptions
from .offsets import DataLossError, data_loss_message
from .planner import KafkaRange
from .schema import ARROW_HEADERS, arrow_schema

log = logging.getLogger("sparkeos.source")

ROWS_PER_ARROW_BATCH = 8192
# A task's first batch goes out small: the work downstream in the same task (a sink's writing, and its transaction's
# first call, which waits for the first row) starts while the rest is read.
FIRST_ROWS_PER_ARROW_BATCH = 1024
CONSUME_POLL_S = 0.02
TOPIC_LOOKUP_TIMEOUT_S = 5.0  # counts towards kafkaConsumer.pollTimeoutMs, after which a read fails
# One consumer per Python worker and configuration: connections survive from task to task.
_consumers: ClientCache[Consumer] = ClientCache(8, Consumer.close, CONSUMER_TIMEOUT_ENV, CONSUMER_CACHE_TIMEOUT)


class _ArrowBuilder:
    def __init__(self, topic: str, partition: int, include_headers: bool):
        self.topic, self.partition, self.include_headers = topic, partition, include_headers
        self.schema = arrow_schema(include_headers)
        self.reset()

    def reset(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list = []
        self.timestamps: list = []
        self.types: list = []
        self.headers: list = []

    def add(self, message) -> None:
        """Add one record (a message without error)."""
        self.add_records_below([message], message.offset() + 1)

    def add_records_below(self, messages: list, end: int) -> int:
        """Add the leading messages that are records with offsets below `end`; return how many were added.

        The reader's hot loop: per record, a method call to add() cost as much as the rest of the loop."""
        keys, values, offsets = self.keys.append, self.values.append, self.offsets.append
        timestamps, types, headers = self.timestamps.append, self.types.append, self.headers.append
        include_headers = self.include_headers
        before = len(self.offsets)
        for message in messages:
            if message.error() is not None or (offset := message.offset()) >= end:
                break
            keys(message.key())
            values(message.value())
            offsets(offset)
            kind, timestamp = message.timestamp()
            # Spark turns a missing timestamp (-1) into -1 ms, not null.
            timestamps(timestamp * 1000 if kind else -1000)
            # librdkafka: 0 none, 1 create time, 2 log append time; Spark: -1, 0, 1.
            types(kind - 1)
            if include_headers:
                headers(message.headers())  # None without headers: null, as in Spark
        return len(self.offsets) - before

    def __len__(self) -> int:
        return len(self.offsets)

    def build(self) -> pa.RecordBatch:
        count = len(self.offsets)
        columns = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            # One value for the whole batch: filled by Arrow, far faster than from a Python list of it.
            pa.repeat(pa.scalar(self.topic, pa.string()), count),
            pa.repeat(pa.scalar(self.partition, pa.int32()), count),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
            pa.array(self.types, pa.int32()),
        ]
        if self.include_headers:
            columns.append(pa.array(self.headers, ARROW_HEADERS))
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        self.reset()
        return batch


def read_range(options: SourceOptions, task: InputPartition) -> Iterator[pa.RecordBatch]:
    """Yield the visible records of offsets [start, end) of one partition, then stop."""
    # A batch read with nothing to read gets one placeholder partition, InputPartition(None), from Spark.
    if not isinstance(task, KafkaRange) or task.start >= task.end:
        return
    config = options.consumer_config()
    with _consumers.lease(json.dumps(config, sort_keys=True), lambda: Consumer(config)) as consumer, \
            cyclic_gc_paused():
        try:
            yield from _read_assigned(consumer, options, task)
        except KafkaException as failure:
            named = _named(failure, task, str(config.get("group.id")))
            if named is failure:
                raise
            raise named from None


def _read_assigned(consumer: Consumer, options: SourceOptions, task: KafkaRange) -> Iterator[pa.RecordBatch]:
    idle_since = time.monotonic()
    learn_topic(consumer, task.topic, min(options.poll_timeout_ms / 1000, TOPIC_LOOKUP_TIMEOUT_S))
    consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
    builder = _ArrowBuilder(task.topic, task.partition, options.include_headers)
    timeout_s = options.poll_timeout_ms / 1000
    next_offset = task.start
    last_offset = task.end - 1
    try:
        done = False
        batch_rows = FIRST_ROWS_PER_ARROW_BATCH
        while not done:
            # consume() waits for num_messages or the timeout. Asking for no more than the range can still
            # hold usually returns at once, but control records take offsets and never arrive: a range ending
            # at the end of a transactional partition comes up short, so each wait is kept short.
            wanted = max(min(task.end - next_offset, batch_rows), 1)
            messages = consumer.consume(num_messages=wanted, timeout=min(timeout_s, CONSUME_POLL_S))
            if not messages:
                if time.monotonic() - idle_since > timeout_s:
                    raise TimeoutError(
                        f"reading {task.topic}-{task.partition} offsets [{task.start}, {task.end}) got nothing for "
                        f"{timeout_s:.0f} s (kafkaConsumer.pollTimeoutMs)"
                    )
                continue
            idle_since = time.monotonic()
            # The common message, a record short of the range's last offset, in bulk; everything after the
            # first other one (an event, the range's last record) goes to _take.
            added = builder.add_records_below(messages, last_offset)
            if added:
                next_offset = max(next_offset, messages[added - 1].offset() + 1)
            for message in messages[added:]:
                try:
                    if _take(message, task, builder, options.fail_on_data_loss):
                        done = True
                        break
                except _OffsetsGone:
                    resumed = _resume_after_lost_offsets(consumer, task, next_offset, timeout_s)
                    if resumed is None:
                        done = True
                        break
                    next_offset = resumed
                    continue
                next_offset = max(next_offset, message.offset() + 1)
            if len(builder) >= batch_rows:
                yield builder.build()
                batch_rows = ROWS_PER_ARROW_BATCH
        if len(builder):
            yield builder.build()
    finally:
        consumer.unassign()


class _OffsetsGone(Exception):
    """The reader's position is no longer in Kafka, and failOnDataLoss=false."""


def _resume_after_lost_offsets(consumer: Consumer, task: KafkaRange, position: int, timeout_s: float) -> int | None:
    """Where reading goes on within the range once `position` is gone from Kafka; None if nothing of it is left.

    As Spark's reader: the records still in Kafka are read, and a log that now ends below `position` (the topic
    was deleted and made again) ends the range."""
    partition = TopicPartition(task.topic, task.partition)
    low, high = consumer.get_watermark_offsets(partition, timeout=timeout_s, cached=False)
    name = f"{task.topic}-{task.partition}"
    if position >= high or low >= task.end:
        log.warning("offsets [%d, %d) of %s are gone (Kafka now holds [%d, %d)); failOnDataLoss=false skips them",
                    position, task.end, name, low, high)
        return None
    resume = max(position, low)
    log.warning("offsets [%d, %d) of %s are gone; failOnDataLoss=false reads on from %d", position, resume, name,
                resume)
    # Not seek(): librdkafka stopped fetching the partition at the error, and refuses to seek it.
    consumer.assign([TopicPartition(task.topic, task.partition, resume)])
    return resume


def _named(failure: KafkaException, task: KafkaRange, group: str) -> Exception:
    """Kafka's authorizer names neither the topic nor the group it refused; the reader knows both."""
    error = failure.args[0] if failure.args and isinstance(failure.args[0], KafkaError) else None
    if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return KafkaNotAuthorized(f"Kafka refused to let this client's principal read {task.topic}-{task.partition} "
                                  f"({error.name()}): reading needs READ on topic {task.topic!r}")
    if error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return KafkaNotAuthorized(f"Kafka refused this client's principal the group {group!r} ({error.name()}): "
                                  "reading needs READ on the group (the source's groupIdPrefix, or kafka.group.id)")
    return failure


def _take(message, task: KafkaRange, builder: _ArrowBuilder, fail_on_data_loss: bool) -> bool:
    """Add one message; True once the range is finished."""
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            # The end of what is readable (LSO under read_committed): finished if it reached `end`.
            return message.offset() >= task.end
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            if fail_on_data_loss:
                raise DataLossError(data_loss_message(
                    f"offsets [{task.start}, {task.end}) of {task.topic}-{task.partition} are no longer in Kafka"
                ))
            raise _OffsetsGone()
        raise KafkaException(error)
    offset = message.offset()
    if offset >= task.end:
        return True
    builder.add(message)
    return offset == task.end - 1
