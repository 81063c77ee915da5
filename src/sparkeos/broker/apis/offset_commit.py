"""OffsetCommit (8): durable committed offsets, checked against the committer's membership."""

from __future__ import annotations

from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse

from ..coordinator.groups import OFFSET_METADATA_MAX_BYTES, OFFSET_METADATA_TOO_LARGE
from .registry import api

UNKNOWN_TOPIC_OR_PARTITION = 3

Topic_ = OffsetCommitResponse.OffsetCommitResponseTopic
Partition_ = Topic_.OffsetCommitResponsePartition


# v2-v4 carry a retention time; like Kafka 2.1+ the broker-wide retention applies instead.
@api(OffsetCommitRequest, OffsetCommitResponse, 2, 8)
async def handle(broker, context, request):
    version = context.version
    errors: dict[tuple[str, int], int] = {}
    offsets: dict[tuple[str, int], tuple[int, str | None, int]] = {}
    for topic in request.topics:
        for partition in topic.partitions:
            key = (topic.name, partition.partition_index)
            metadata = partition.committed_metadata
            if broker.partition(topic.name, partition.partition_index) is None:
                errors[key] = UNKNOWN_TOPIC_OR_PARTITION
            elif metadata is not None and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                errors[key] = OFFSET_METADATA_TOO_LARGE
            else:
                epoch = partition.committed_leader_epoch if version >= 6 else -1
                offsets[key] = (partition.committed_offset, metadata, epoch)
    group_error = await broker.groups.commit_member_offsets(
        request.group_id,
        request.generation_id_or_member_epoch,
        request.member_id or "",
        request.group_instance_id if version >= 7 else None,
        offsets,
    )
    for key in offsets:
        errors[key] = group_error
    return OffsetCommitResponse(
        throttle_time_ms=0,
        topics=[
            Topic_(name=topic.name, partitions=[
                Partition_(partition_index=p.partition_index, error_code=errors[(topic.name, p.partition_index)])
                for p in topic.partitions
            ])
            for topic in request.topics
        ],
    )
