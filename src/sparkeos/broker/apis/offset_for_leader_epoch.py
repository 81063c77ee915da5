"""OffsetForLeaderEpoch (23): clients validate their position after metadata changes.

Leaves out:
- `replica_id` (v3+): there are no followers.
"""

from __future__ import annotations

from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

from ..acls import DESCRIBE, TOPIC
from ..dispatch import api
from ..errors import TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION
from ..leader_epoch import LEADER_EPOCH, leader_epoch_error

TopicResult = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
EpochEndOffset = TopicResult.EpochEndOffset


@api(OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, 2, 4)
async def handle_offset_for_leader_epoch(broker, context, request):
    topics = []
    for topic in request.topics:
        results = []
        for wanted in topic.partitions:
            partition_log = broker.partition(topic.topic, wanted.partition)
            if not broker.allowed(context, DESCRIBE, TOPIC, topic.topic):
                error = TOPIC_AUTHORIZATION_FAILED
            elif partition_log is None:
                error = UNKNOWN_TOPIC_OR_PARTITION
            else:
                error = leader_epoch_error(wanted.current_leader_epoch)
            if error:
                results.append(EpochEndOffset(error_code=error, partition=wanted.partition))
            elif wanted.leader_epoch > LEADER_EPOCH:
                results.append(EpochEndOffset(error_code=0, partition=wanted.partition, leader_epoch=-1,
                                              end_offset=-1))
            else:
                # Every epoch up to ours ends where the log ends: there was only ever one leader.
                results.append(EpochEndOffset(error_code=0, partition=wanted.partition, leader_epoch=LEADER_EPOCH,
                                              end_offset=partition_log.log_end_offset))
        topics.append(TopicResult(topic=topic.topic, partitions=results))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)
