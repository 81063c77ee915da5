"""OffsetFetch (9): committed offsets of one group (v1-7) or several (v8); -1 when none.

Leaves out:
- nothing known for versions 1-8.
"""

from __future__ import annotations

from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse

from ..acls import DESCRIBE, GROUP, TOPIC
from ..coordinator.groups import FetchedOffset
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED

Topic_ = OffsetFetchResponse.OffsetFetchResponseTopic
Partition_ = Topic_.OffsetFetchResponsePartition
Group_ = OffsetFetchResponse.OffsetFetchResponseGroup
GroupTopic_ = Group_.OffsetFetchResponseTopics
GroupPartition_ = GroupTopic_.OffsetFetchResponsePartitions


def _fetch(broker, context, group_id: str, topics, require_stable: bool) -> dict[str, list]:
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    by_topic: dict[str, list] = {}
    for found in broker.groups.fetch_offsets(group_id, wanted, require_stable):
        if not broker.allowed(context, DESCRIBE, TOPIC, found.topic):
            if wanted is None:
                continue  # all of the group's topics: only those the principal may describe, as Kafka lists them
            found = FetchedOffset(found.topic, found.partition, error=TOPIC_AUTHORIZATION_FAILED)
        by_topic.setdefault(found.topic, []).append(found)
    return by_topic


@api(OffsetFetchRequest, OffsetFetchResponse, 1, 8)
async def handle_offset_fetch(broker, context, request):
    version = context.version
    require_stable = version >= 7 and request.require_stable
    if version >= 8:
        groups = []
        for group in request.groups:
            if not broker.allowed(context, DESCRIBE, GROUP, group.group_id):
                groups.append(Group_(group_id=group.group_id, error_code=GROUP_AUTHORIZATION_FAILED, topics=[]))
                continue
            by_topic = _fetch(broker, context, group.group_id, group.topics, require_stable)
            groups.append(Group_(group_id=group.group_id, error_code=0, topics=[
                GroupTopic_(name=name, partitions=[
                    GroupPartition_(partition_index=f.partition, committed_offset=f.offset,
                                    committed_leader_epoch=f.leader_epoch, metadata=f.metadata, error_code=f.error)
                    for f in found
                ])
                for name, found in by_topic.items()
            ]))
        return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    if not broker.allowed(context, DESCRIBE, GROUP, request.group_id):
        if version >= 2:
            return OffsetFetchResponse(throttle_time_ms=0, error_code=GROUP_AUTHORIZATION_FAILED, topics=[])
        return OffsetFetchResponse(throttle_time_ms=0, topics=[
            Topic_(name=t.name, partitions=[Partition_(partition_index=p, committed_offset=-1, metadata="",
                                                       error_code=GROUP_AUTHORIZATION_FAILED)
                                            for p in t.partition_indexes]) for t in request.topics])
    # v1 has no "all topics" form (its topics array is not nullable).
    by_topic = _fetch(broker, context, request.group_id, request.topics, require_stable)
    return OffsetFetchResponse(throttle_time_ms=0, error_code=0, topics=[
        Topic_(name=name, partitions=[
            Partition_(partition_index=f.partition, committed_offset=f.offset, committed_leader_epoch=f.leader_epoch,
                       metadata=f.metadata, error_code=f.error)
            for f in found
        ])
        for name, found in by_topic.items()
    ])
