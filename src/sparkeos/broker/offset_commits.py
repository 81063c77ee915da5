"""What OffsetCommit and TxnOffsetCommit share: reading the offsets asked for, and answering."""

from __future__ import annotations

from .acls import READ, TOPIC
from .coordinator.groups import OFFSET_METADATA_MAX_BYTES
from .errors import OFFSET_METADATA_TOO_LARGE, TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, tuple[int, str | None, int]]


def read_offsets(broker, request_topics, with_leader_epoch: bool, context=None
                 ) -> tuple[Offsets, dict[TopicPartition, int]]:
    """The valid offsets {(topic, partition): (offset, metadata, leader epoch)} and the errors of the rest; with the
    request's `context`, a topic its principal may not READ is TOPIC_AUTHORIZATION_FAILED."""
    errors: dict[TopicPartition, int] = {}
    offsets: Offsets = {}
    for topic in request_topics:
        for partition in topic.partitions:
            key = (topic.name, partition.partition_index)
            metadata = partition.committed_metadata
            if context is not None and not broker.allowed(context, READ, TOPIC, topic.name):
                errors[key] = TOPIC_AUTHORIZATION_FAILED
            elif broker.partition(topic.name, partition.partition_index) is None:
                errors[key] = UNKNOWN_TOPIC_OR_PARTITION
            elif metadata is not None and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                errors[key] = OFFSET_METADATA_TOO_LARGE
            else:
                epoch = partition.committed_leader_epoch if with_leader_epoch else -1
                offsets[key] = (partition.committed_offset, metadata, epoch)
    return offsets, errors


def answer_topics(topic_class, partition_class, request_topics, errors: dict[TopicPartition, int]) -> list:
    return [
        topic_class(name=topic.name, partitions=[
            partition_class(partition_index=p.partition_index, error_code=errors[(topic.name, p.partition_index)])
            for p in topic.partitions
        ])
        for topic in request_topics
    ]
