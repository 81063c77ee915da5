"""DeleteRecords (21): advance partitions' log start offsets (offset -1 means the high watermark).

Leaves out:
- `timeout_ms`: the log start offsets have moved before the answer is sent.
"""

from __future__ import annotations

import logging

from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse

from ..acls import DELETE, TOPIC
from ..dispatch import api
from ..errors import TOPIC_AUTHORIZATION_FAILED, UNKNOWN_SERVER_ERROR, UNKNOWN_TOPIC_OR_PARTITION
from ..storage.log import OffsetOutOfRange

log = logging.getLogger("sparkeos.broker.admin")

TopicResult = DeleteRecordsResponse.DeleteRecordsTopicResult
PartitionResult = TopicResult.DeleteRecordsPartitionResult


def _delete(broker, topic: str, wanted) -> PartitionResult:
    index = wanted.partition_index
    partition_log = broker.partition(topic, index)
    if partition_log is None:
        return PartitionResult(partition_index=index, low_watermark=-1, error_code=UNKNOWN_TOPIC_OR_PARTITION)
    try:
        low_watermark = partition_log.delete_records_before(wanted.offset)
    except OffsetOutOfRange:
        return PartitionResult(partition_index=index, low_watermark=-1, error_code=OffsetOutOfRange.error_code)
    except OSError as exc:
        log.error("deleting records of %s-%d failed: %s", topic, index, exc)
        return PartitionResult(partition_index=index, low_watermark=-1, error_code=UNKNOWN_SERVER_ERROR)
    return PartitionResult(partition_index=index, low_watermark=low_watermark, error_code=0)


@api(DeleteRecordsRequest, DeleteRecordsResponse, 0, 2)
async def handle_delete_records(broker, context, request):
    topics = [
        TopicResult(name=topic.name, partitions=[
            _delete(broker, topic.name, p) if broker.allowed(context, DELETE, TOPIC, topic.name) else
            PartitionResult(partition_index=p.partition_index, low_watermark=-1, error_code=TOPIC_AUTHORIZATION_FAILED)
            for p in topic.partitions])
        for topic in request.topics
    ]
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)
