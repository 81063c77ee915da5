"""Writes without transactions: deliveryGuarantee at_least_once and none."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer
from pyspark import TaskContext

from ...client_cache import ClientCache
from ...visible_latency import TimestampTally
from ..options import PRODUCER_CACHE_TIMEOUT, PRODUCER_TIMEOUT_ENV, SinkOptions
from .reports import SinkCommit
from .rows import Rows

log = logging.getLogger("sparkeos.sink")


def _close_plain_producer(producer: Producer) -> None:
    # Every task flushed its records already; purge only so that close() cannot wait on a dead cluster.
    producer.flush(10)
    producer.purge()
    producer.close()


_plain_producers: ClientCache[Producer] = ClientCache(8, _close_plain_producer, PRODUCER_TIMEOUT_ENV,
                                                     PRODUCER_CACHE_TIMEOUT)


def write_without_transactions(options: SinkOptions, batch: int, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
    """at_least_once: idempotent producer, every record acknowledged before the task succeeds.

    none: records are handed to the producer and flushed; delivery errors are logged, not raised.
    """
    partition = TaskContext.get().partitionId()
    key = json.dumps(options.producer_config(), sort_keys=True)
    with _plain_producers.lease(key, lambda: Producer(options.producer_config())) as producer:
        try:
            timestamps = TimestampTally()
            records, errors, remaining, by_topic = _produce_and_flush(producer, options, batches, timestamps)
            flushed_at = time.time()
        except BaseException:
            _plain_producers.forget(producer)
            raise
        if errors or remaining:
            # A write that failed may have landed: the next task starts on a new producer id rather than on
            # sequence numbers this producer may have left ambiguous.
            _plain_producers.forget(producer)
    if options.delivery_guarantee == "at_least_once":
        if remaining:
            raise TimeoutError(f"{remaining} records were not acknowledged in time")
        if errors:
            raise KafkaException(errors[0])
    elif errors or remaining:
        log.warning("deliveryGuarantee=none: %d records failed, %d unacknowledged", len(errors), remaining)
    # Without transactions a record is visible once acknowledged, by the end of the flush at the latest.
    return SinkCommit(partition, batch, records, False, None, by_topic,
                      visible_latency=timestamps.latencies(flushed_at))


def _produce_and_flush(producer: Producer, options: SinkOptions,
                       batches: Iterator[pa.RecordBatch], timestamps: TimestampTally
                       ) -> tuple[int, list[KafkaError], int, dict[str, int]]:
    """(records handed over, delivery errors, records still unacknowledged after the flush, records by topic);
    tallies the records' timestamps into `timestamps`."""
    errors: list[KafkaError] = []

    def on_delivery(error, _message) -> None:
        if error is not None:
            errors.append(error)

    records = 0
    by_topic: dict[str, int] = {}
    for arrow_batch in batches:
        timestamps.add(arrow_batch)
        rows = Rows(arrow_batch, options.topic)
        rows.produce_all(producer, on_delivery)
        records += rows.count
        rows.count_by_topic(by_topic)
    remaining = producer.flush(options.transaction_timeout_ms / 1000 + 30)
    return records, errors, remaining, by_topic
