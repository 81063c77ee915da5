"""Fetch (1): long-poll reads of whole stored batches within the request's byte limits."""

from __future__ import annotations

import asyncio

from kafka.protocol.consumer import FetchRequest, FetchResponse

from ..storage.log import OffsetOutOfRange
from .leader_epoch import leader_epoch_error
from .registry import api

UNKNOWN_TOPIC_OR_PARTITION = 3
FETCH_SESSION_ID_NOT_FOUND = 70
READ_COMMITTED = 1

TopicResponse = FetchResponse.FetchableTopicResponse
PartitionData = TopicResponse.PartitionData


@api(FetchRequest, FetchResponse, 4, 12)
async def handle(broker, context, request):
    if context.version >= 7 and request.session_id != 0:
        # We keep no incremental fetch sessions; the client falls back to full fetches.
        return FetchResponse(throttle_time_ms=0, error_code=FETCH_SESSION_ID_NOT_FOUND, session_id=0,
                             responses=[])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
    while True:
        responses, total, errors = read_all(broker, request)
        remaining = deadline - loop.time()
        if total >= request.min_bytes or errors or remaining <= 0:
            return FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=responses)
        await broker.wait_for_append(remaining)


def read_all(broker, request) -> tuple[list[TopicResponse], int, bool]:
    read_committed = request.isolation_level == READ_COMMITTED
    budget = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    total = 0
    errors = False
    responses = []
    for topic in request.topics:
        partitions = []
        for wanted in topic.partitions:
            data = read_partition(broker, topic.topic, wanted, read_committed, budget - total, total == 0)
            if data.error_code:
                errors = True
            elif data.records:
                total += len(data.records)
            partitions.append(data)
        responses.append(TopicResponse(topic=topic.topic, partitions=partitions))
    return responses, total, errors


def read_partition(broker, topic: str, wanted, read_committed: bool, budget: int, first: bool) -> PartitionData:
    index = wanted.partition
    partition_log = broker.partition(topic, index)
    if partition_log is None:
        # Kafka sends empty records, never null, with an error: librdkafka refuses a null set.
        return PartitionData(partition_index=index, error_code=UNKNOWN_TOPIC_OR_PARTITION, high_watermark=-1,
                             records=b"")
    epoch_error = leader_epoch_error(getattr(wanted, "current_leader_epoch", -1))
    high_watermark = partition_log.high_watermark
    stable = broker.last_stable_offset(topic, index, partition_log)
    common = dict(partition_index=index, high_watermark=high_watermark, last_stable_offset=stable,
                  log_start_offset=partition_log.log_start_offset)
    if epoch_error:
        return PartitionData(error_code=epoch_error, records=b"", **common)
    limit = min(wanted.partition_max_bytes, budget)
    records = b""
    aborted = None
    try:
        if limit > 0 or first:
            upper = stable if read_committed else high_watermark
            # Kafka lets the first partition of a response exceed the limits by one batch,
            # so a consumer always makes progress.
            records = partition_log.read(wanted.fetch_offset, max(limit, 1), upper, min_one=first)
            if read_committed:
                aborted = [
                    PartitionData.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in broker.aborted_transactions(partition_log, wanted.fetch_offset, records)
                ]
        elif wanted.fetch_offset < partition_log.log_start_offset or (
            wanted.fetch_offset > partition_log.log_end_offset
        ):
            raise OffsetOutOfRange()
    except OffsetOutOfRange:
        return PartitionData(error_code=OffsetOutOfRange.error_code, records=b"", **common)
    if read_committed and aborted is None:
        aborted = []
    return PartitionData(error_code=0, records=records, aborted_transactions=aborted, **common)
