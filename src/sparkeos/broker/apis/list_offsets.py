"""ListOffsets (2): earliest (-2), latest (-1), max timestamp (-3), or by timestamp.

Leaves out:
- `replica_id`: there are no followers.
"""

from __future__ import annotations

from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from ..acls import DESCRIBE, TOPIC
from ..dispatch import api
from ..errors import TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION
from ..leader_epoch import LEADER_EPOCH, leader_epoch_error

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
READ_COMMITTED = 1

TopicResponse = ListOffsetsResponse.ListOffsetsTopicResponse
PartitionResponse = TopicResponse.ListOffsetsPartitionResponse


@api(ListOffsetsRequest, ListOffsetsResponse, 1, 7)
async def handle_list_offsets(broker, context, request):
    read_committed = context.version >= 2 and request.isolation_level == READ_COMMITTED
    topics = []
    for topic in request.topics:
        if broker.allowed(context, DESCRIBE, TOPIC, topic.name):
            partitions = [lookup(broker, topic.name, wanted, read_committed) for wanted in topic.partitions]
        else:
            partitions = [PartitionResponse(partition_index=wanted.partition_index,
                                            error_code=TOPIC_AUTHORIZATION_FAILED) for wanted in topic.partitions]
        topics.append(TopicResponse(name=topic.name, partitions=partitions))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


def lookup(broker, topic: str, wanted, read_committed: bool) -> PartitionResponse:
    index = wanted.partition_index
    partition_log = broker.partition(topic, index)
    if partition_log is None:
        return PartitionResponse(partition_index=index, error_code=UNKNOWN_TOPIC_OR_PARTITION)
    error = leader_epoch_error(getattr(wanted, "current_leader_epoch", -1))
    if error:
        return PartitionResponse(partition_index=index, error_code=error)
    timestamp = wanted.timestamp
    found_timestamp = -1
    if timestamp == EARLIEST:
        offset = partition_log.log_start_offset
    elif timestamp == LATEST:
        offset = broker.last_stable_offset(topic, index, partition_log) if read_committed else (
            partition_log.high_watermark)
    elif timestamp == MAX_TIMESTAMP:
        found = partition_log.max_timestamp_offset()
        offset, found_timestamp = found if found else (-1, -1)
    else:
        found = partition_log.offset_for_timestamp(timestamp)
        offset, found_timestamp = found if found else (-1, -1)
        if read_committed and offset >= broker.last_stable_offset(topic, index, partition_log):
            offset, found_timestamp = -1, -1
    return PartitionResponse(partition_index=index, error_code=0, timestamp=found_timestamp, offset=offset,
                             leader_epoch=LEADER_EPOCH)
