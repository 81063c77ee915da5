"""TxnOffsetCommit (28): offsets staged in the transaction, published only when it commits."""

from __future__ import annotations

from kafka.protocol.producer import TxnOffsetCommitRequest, TxnOffsetCommitResponse

from ..coordinator.groups import OFFSET_METADATA_MAX_BYTES, OFFSET_METADATA_TOO_LARGE
from ..coordinator.transactions import TransactionError
from .init_producer_id import fenced_error
from .registry import api

UNKNOWN_TOPIC_OR_PARTITION = 3

Topic_ = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
Partition_ = Topic_.TxnOffsetCommitResponsePartition


@api(TxnOffsetCommitRequest, TxnOffsetCommitResponse, 0, 3)
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
                epoch = partition.committed_leader_epoch if version >= 2 else -1
                offsets[key] = (partition.committed_offset, metadata, epoch)
    error = _check(broker, request, version)
    if not error and offsets:
        await broker.groups.stage_transactional_offsets(request.group_id, request.producer_id, offsets)
    for key in offsets:
        errors[key] = error
    return TxnOffsetCommitResponse(
        throttle_time_ms=0,
        topics=[
            Topic_(name=topic.name, partitions=[
                Partition_(partition_index=p.partition_index, error_code=errors[(topic.name, p.partition_index)])
                for p in topic.partitions
            ])
            for topic in request.topics
        ],
    )


def _check(broker, request, version: int) -> int:
    try:
        broker.transactions.check_offset_commit(request.transactional_id, request.producer_id,
                                                request.producer_epoch, request.group_id,
                                                fenced_error=fenced_error(version, 2))
    except TransactionError as exc:
        return exc.error_code
    if version >= 3:
        # KIP-447: a zombie consumer generation must not commit through a live transaction.
        return broker.groups.validate_txn_offset_commit(
            request.group_id, request.generation_id, request.member_id or "", request.group_instance_id)
    return 0
