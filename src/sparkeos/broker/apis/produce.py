"""Produce (0): validate batches, check producer sequences, append, and acknowledge per acks."""

from __future__ import annotations

import logging

from kafka.protocol.producer import ProduceRequest, ProduceResponse

from ..records import InvalidBatch
from ..storage.producer_state import SequenceError
from ..storage.topics import InvalidTopic
from .registry import api

log = logging.getLogger("sparkeos.broker.produce")

UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REQUIRED_ACKS = 21
KAFKA_STORAGE_ERROR = 56
CORRUPT_MESSAGE = 2

TopicResponse = ProduceResponse.TopicProduceResponse
PartitionResponse = TopicResponse.PartitionProduceResponse


def _error(index: int, code: int, message: str | None = None) -> PartitionResponse:
    return PartitionResponse(index=index, error_code=code, base_offset=-1, error_message=message)


@api(ProduceRequest, ProduceResponse, 0, 9)
async def handle(broker, context, request):
    acks = request.acks
    results: list[TopicResponse] = []
    touched = []
    for topic_data in request.topic_data:
        partitions = []
        for partition_data in topic_data.partition_data:
            if acks not in (0, 1, -1):
                partitions.append(_error(partition_data.index, INVALID_REQUIRED_ACKS))
                continue
            partitions.append(
                append_partition(broker, request, topic_data.name, partition_data, touched)
            )
        results.append(TopicResponse(name=topic_data.name, partition_responses=partitions))
    if touched:
        broker.notify_appended()
    if acks == 0:
        return None
    if acks == -1:
        for partition_log in touched:
            await broker.make_durable(partition_log)
    return ProduceResponse(responses=results, throttle_time_ms=0)


def append_partition(broker, request, topic_name: str, partition_data, touched: list) -> PartitionResponse:
    index = partition_data.index
    try:
        topic = broker.topic_for_produce_or_metadata(topic_name)
    except InvalidTopic as exc:
        return _error(index, InvalidTopic.error_code, str(exc))
    partition_log = broker.partition(topic_name, index) if topic is not None else None
    if partition_log is None:
        return _error(index, UNKNOWN_TOPIC_OR_PARTITION)
    records = partition_data.records
    if records is None or len(records) == 0:
        return _error(index, CORRUPT_MESSAGE, "no records")
    try:
        broker.check_transactional_produce(request, topic_name, index, records)
        result = partition_log.append(records)
    except (InvalidBatch, SequenceError) as exc:
        return _error(index, exc.error_code, str(exc))
    except OSError as exc:
        log.error("append to %s-%d failed: %s", topic_name, index, exc)
        return _error(index, KAFKA_STORAGE_ERROR, str(exc))
    # A duplicate is acknowledged like its original, which may still await its fsync.
    touched.append(partition_log)
    return PartitionResponse(
        index=index,
        error_code=0,
        base_offset=result.base_offset,
        log_append_time_ms=result.log_append_time,
        log_start_offset=partition_log.log_start_offset,
    )
