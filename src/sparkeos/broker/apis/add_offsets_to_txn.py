"""AddOffsetsToTxn (25): the group's offsets join the producer's transaction."""

from __future__ import annotations

import time

from kafka.protocol.producer import AddOffsetsToTxnRequest, AddOffsetsToTxnResponse

from ..coordinator.transactions import TransactionError
from .init_producer_id import fenced_error
from .registry import api


@api(AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 3)
async def handle(broker, context, request):
    await broker.transactions.wait_completed(request.transactional_id)
    try:
        broker.transactions.add_offsets(request.transactional_id, request.producer_id, request.producer_epoch,
                                        request.group_id, int(time.time() * 1000),
                                        fenced_error=fenced_error(context.version, 2))
    except TransactionError as exc:
        return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=exc.error_code)
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=0)
