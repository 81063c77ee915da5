"""AddOffsetsToTxn (25): the group's offsets join the producer's transaction.

Leaves out:
- nothing known for versions 0-3.
"""

from __future__ import annotations

import time

from kafka.protocol.producer import AddOffsetsToTxnRequest, AddOffsetsToTxnResponse

from ..acls import GROUP, READ, TRANSACTIONAL_ID, WRITE
from ..coordinator.transactions import TransactionError, fenced_error
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@api(AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 3)
async def handle_add_offsets_to_txn(broker, context, request):
    if not broker.allowed(context, WRITE, TRANSACTIONAL_ID, request.transactional_id):
        return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not broker.allowed(context, READ, GROUP, request.group_id):
        return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=GROUP_AUTHORIZATION_FAILED)
    await broker.transactions.wait_completed(request.transactional_id)
    try:
        broker.transactions.add_offsets(request.transactional_id, request.producer_id, request.producer_epoch,
                                        request.group_id, int(time.time() * 1000),
                                        fenced_error=fenced_error(context.version, 2))
    except TransactionError as exc:
        return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=exc.error_code)
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=0)
