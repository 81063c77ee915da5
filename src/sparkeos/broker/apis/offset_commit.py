"""OffsetCommit (8): durable committed offsets, checked against the committer's membership.

Leaves out:
- the retention time of v2-v4 (`retention_time_ms`): as in Kafka 2.1 and later, the broker-wide
  `offsets.retention.minutes` applies instead.
"""

from __future__ import annotations

from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse

from ..acls import GROUP, READ
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED
from ..offset_commits import answer_topics, read_offsets

Topic_ = OffsetCommitResponse.OffsetCommitResponseTopic
Partition_ = Topic_.OffsetCommitResponsePartition


@api(OffsetCommitRequest, OffsetCommitResponse, 2, 8)
async def handle_offset_commit(broker, context, request):
    version = context.version
    if not broker.allowed(context, READ, GROUP, request.group_id):
        errors = {(t.name, p.partition_index): GROUP_AUTHORIZATION_FAILED for t in request.topics for p in t.partitions}
        return OffsetCommitResponse(throttle_time_ms=0,
                                    topics=answer_topics(Topic_, Partition_, request.topics, errors))
    offsets, errors = read_offsets(broker, request.topics, with_leader_epoch=version >= 6, context=context)
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
