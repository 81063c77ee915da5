"""EndTxn (26): commit or abort; the decision is durable and markers written before the answer.

Leaves out:
- nothing known for versions 0-3.
"""

from __future__ import annotations

import time

from kafka.protocol.producer import EndTxnRequest, EndTxnResponse

from ..acls import TRANSACTIONAL_ID, WRITE
from ..coordinator.transactions import TransactionError, fenced_error
from ..dispatch import api
from ..errors import TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@api(EndTxnRequest, EndTxnResponse, 0, 3)
async def handle_end_txn(broker, context, request):
    if not broker.allowed(context, WRITE, TRANSACTIONAL_ID, request.transactional_id):
        return EndTxnResponse(throttle_time_ms=0, error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    await broker.transactions.wait_completed(request.transactional_id)
    try:
        broker.transactions.end_transaction_in_background(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed,
            int(time.time() * 1000), fenced_error=fenced_error(context.version, 2),
        )
    except TransactionError as exc:
        return EndTxnResponse(throttle_time_ms=0, error_code=exc.error_code)
    return EndTxnResponse(throttle_time_ms=0, error_code=0)
