"""Metadata (3): one broker, every partition led by it; unknown topics auto-created if allowed.

Authorized operations (KIP-430) are reported when asked: a topic's from v8 on, the cluster's in v8-v10 (from
v11 on, DescribeCluster reports them).

Leaves out:
- racks: the broker's rack is null.
"""

from __future__ import annotations

from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from ..acls import CLUSTER, CLUSTER_NAME, CREATE, DESCRIBE, TOPIC
from ..core import CLUSTER_ID, NODE_ID
from ..dispatch import api
from ..errors import TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION
from ..leader_epoch import LEADER_EPOCH
from ..storage.topics import InvalidTopic, Topic

Broker_ = MetadataResponse.MetadataResponseBroker
Topic_ = MetadataResponse.MetadataResponseTopic
Partition_ = Topic_.MetadataResponsePartition


def _describe(topic: Topic, operations: set[int] | None) -> Topic_:
    return Topic_(
        error_code=0,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.internal,
        partitions=[
            Partition_(
                error_code=0,
                partition_index=i,
                leader_id=NODE_ID,
                leader_epoch=LEADER_EPOCH,
                replica_nodes=[NODE_ID],
                isr_nodes=[NODE_ID],
                offline_replicas=[],
            )
            for i in range(len(topic.partitions))
        ],
        authorized_operations=operations,
    )


@api(MetadataRequest, MetadataResponse, 0, 12)
async def handle_metadata(broker, context, request):
    def described(topic: Topic) -> Topic_:
        asked = context.version >= 8 and request.include_topic_authorized_operations
        return _describe(topic, broker.authorized_operations(context, TOPIC, topic.name) if asked else None)

    topics: list[Topic_] = []
    if request.topics is None or (context.version == 0 and not request.topics):
        # Every topic the principal may describe, as Kafka lists them.
        topics = [described(t) for t in broker.store.topics.values()
                  if broker.allowed(context, DESCRIBE, TOPIC, t.name)]
    else:
        # v4+ lets the client ask not to auto-create; before v4 Kafka always allowed it.
        allow = request.allow_auto_topic_creation if context.version >= 4 else True
        for wanted in request.topics:
            name = wanted.name
            if name is None and getattr(wanted, "topic_id", None) is not None:
                found = broker.store.by_id(wanted.topic_id)
                name = found.name if found else None
            if name and not broker.allowed(context, DESCRIBE, TOPIC, name):
                topics.append(Topic_(error_code=TOPIC_AUTHORIZATION_FAILED, name=name, partitions=[]))
                continue
            # Auto-creation needs CREATE on the cluster or on the topic, as Kafka's.
            may_create = (broker.allowed(context, CREATE, CLUSTER, CLUSTER_NAME)
                          or broker.allowed(context, CREATE, TOPIC, name or ""))
            try:
                topic = broker.topic_for_metadata(name, allow_auto_create=allow and may_create) if name else None
            except InvalidTopic:
                topics.append(Topic_(error_code=InvalidTopic.error_code, name=name, partitions=[]))
                continue
            if topic is None:
                # A topic the broker would have created but for the principal's rights: as Kafka answers.
                denied = allow and not may_create and broker.config.auto_create_topics
                topics.append(Topic_(error_code=TOPIC_AUTHORIZATION_FAILED if denied else UNKNOWN_TOPIC_OR_PARTITION,
                                     name=name, partitions=[]))
            else:
                topics.append(described(topic))
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[Broker_(node_id=NODE_ID, host=context.listener.address[0], port=context.listener.address[1],
                         rack=None)],
        cluster_id=CLUSTER_ID,
        controller_id=NODE_ID,
        topics=topics,
        authorized_operations=broker.authorized_operations(context, CLUSTER, CLUSTER_NAME)
        if 8 <= context.version <= 10 and request.include_cluster_authorized_operations else None,
    )
