"""OffsetCommit (8): durable committed offsets, checked against the committer's membership."""

from __future__ import annotations

from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse

from .offset_requests import answer_topics, read_offsets
from .registry import api

Topic_ = OffsetCommitResponse.OffsetCommitResponseTopic
Partition_ = Topic_.OffsetCommitResponsePartition


# v2-v4 carry a retention time; like Kafka 2.1+ the broker-wide retention applies instead.
@api(OffsetCommitRequest, OffsetCommitResponse, 2, 8)
async def handle(broker, context, request):
    version = context.version
    offsets, errors = read_offsets(broker, request.topics, with_leader_epoch=version >= 6)
    group_error = await broker.groups.commit_member_offsets(
        request.group_id,
        request.generation_id_or_member_epoch,
        request.member_id or "",
        request.group_instance_id if version >= 7 else None,
        offsets,
    )
    for key in offsets:
        errors[key] = group_error
    return OffsetCommitResponse(throttle_time_ms=0,
                                topics=answer_topics(Topic_, Partition_, request.topics, errors))
