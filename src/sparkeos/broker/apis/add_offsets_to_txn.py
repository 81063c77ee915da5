"""AddOffsetsToTxn (25): the group's offsets join the producer's transaction.

Leaves out:
- nothing known for versions 0-3.
"""

from __future__ import annotations

import time

from kafka.protocol.producer import AddOffsetsToTxnRequest, AddOffsetsToTxnResponse

from ..coordinator.transactions import TransactionError, fenced_error
from ..dispatch import api


@api(AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 3)
async def handle_add_offsets_to_txn(broker, context, request):
    await broker.transactions.wait_completed(request.transactional_id)
    try:
        broker.transactions.add_offsets(request.transactional_id, request.producer_id, request.producer_epoch,
                                        request.group_id, int(time.time() * 1000),
                                        fenced_error=fenced_error(context.version, 2))
    except TransactionError as exc:
        return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=exc.error_code)
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=0)
