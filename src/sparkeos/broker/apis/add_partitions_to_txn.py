"""AddPartitionsToTxn (24): partitions join the producer's transaction.

The answer comes before the coordinator's record of it is fsynced: a restart aborts
transactional records that no open transaction lists, and fences their producer.

Leaves out:
- the batched form of v4 and later, in which brokers verify transactions for each other (KIP-890):
  only the client form of versions 0-3 is offered.
"""

from __future__ import annotations

import time

from kafka.protocol.producer import AddPartitionsToTxnRequest, AddPartitionsToTxnResponse

from ..acls import TOPIC, TRANSACTIONAL_ID, WRITE
from ..coordinator.transactions import fenced_error
from ..dispatch import api
from ..errors import OPERATION_NOT_ATTEMPTED, TOPIC_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED

TopicResult = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
PartitionResult = TopicResult.AddPartitionsToTxnPartitionResult


@api(AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, 0, 3)
async def handle_add_partitions_to_txn(broker, context, request):
    wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    transactional_id = request.v3_and_below_transactional_id
    denied = {name for name, _ in wanted if not broker.allowed(context, WRITE, TOPIC, name)}
    if not broker.allowed(context, WRITE, TRANSACTIONAL_ID, transactional_id):
        errors = dict.fromkeys(wanted, TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    elif denied:
        # As Kafka: the topics the principal may not write fail, and nothing of the rest is added.
        errors = {(name, p): TOPIC_AUTHORIZATION_FAILED if name in denied else OPERATION_NOT_ATTEMPTED
                  for name, p in wanted}
    else:
        await broker.transactions.wait_completed(transactional_id)
        errors = broker.transactions.add_partitions(
            transactional_id, request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch, wanted, int(time.time() * 1000),
            fenced_error=fenced_error(context.version, 2),
        )
    results = []
    for topic in request.v3_and_below_topics:
        results.append(TopicResult(name=topic.name, results_by_partition=[
            PartitionResult(partition_index=p, partition_error_code=errors[(topic.name, p)])
            for p in topic.partitions
        ]))
    return AddPartitionsToTxnResponse(throttle_time_ms=0, results_by_topic_v3_and_below=results)
