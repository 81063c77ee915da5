"""InitProducerId (22): a fresh producer id for idempotent producers; for a transactional.id,
the transaction coordinator's id and a bumped epoch that fences any older producer.

Leaves out:
- nothing known for versions 0-4.
"""

from __future__ import annotations

import time

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from ..acls import CLUSTER, CLUSTER_NAME, IDEMPOTENT_WRITE, TOPIC, TRANSACTIONAL_ID, WRITE
from ..coordinator.transactions import TransactionError, fenced_error
from ..dispatch import api
from ..errors import CLUSTER_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@api(InitProducerIdRequest, InitProducerIdResponse, 0, 4)
async def handle_init_producer_id(broker, context, request):
    # Kafka's checks: WRITE on the transactional id; for an idempotent producer, IDEMPOTENT_WRITE on the cluster
    # or WRITE on some topic.
    if request.transactional_id is not None and not broker.allowed(context, WRITE, TRANSACTIONAL_ID,
                                                                   request.transactional_id):
        return InitProducerIdResponse(throttle_time_ms=0, error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                      producer_id=-1, producer_epoch=-1)
    if request.transactional_id is None and not (
            broker.allowed(context, IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME)
            or broker.authorizer.allowed_on_any(context.auth.principal, context.host, WRITE, TOPIC)):
        return InitProducerIdResponse(throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED, producer_id=-1,
                                      producer_epoch=-1)
    if request.transactional_id is None:
        return InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=broker.producer_ids.next_id(),
                                      producer_epoch=0)
    await broker.transactions.wait_completed(request.transactional_id)
    expected_pid = request.producer_id if context.version >= 3 else -1
    expected_epoch = request.producer_epoch if context.version >= 3 else -1
    try:
        producer_id, epoch = broker.transactions.init_producer_id(
            request.transactional_id, request.transaction_timeout_ms, expected_pid, expected_epoch,
            int(time.time() * 1000), fenced_error=fenced_error(context.version, 4),
        )
    except TransactionError as exc:
        return InitProducerIdResponse(throttle_time_ms=0, error_code=exc.error_code, producer_id=-1,
                                      producer_epoch=-1)
    broker.notify_appended()  # fencing may have aborted a transaction: stable offsets moved
    return InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=producer_id, producer_epoch=epoch)
