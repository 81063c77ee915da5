"""InitProducerId (22) for idempotent producers: a fresh producer id at epoch 0.

Transactional ids are the transaction coordinator's business; until it exists they are
refused with the error Kafka gives a broker that has no coordinator for them.
"""

from __future__ import annotations

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from .registry import api

COORDINATOR_NOT_AVAILABLE = 15


@api(InitProducerIdRequest, InitProducerIdResponse, 0, 4)
async def handle(broker, context, request):
    if request.transactional_id:
        return InitProducerIdResponse(throttle_time_ms=0, error_code=COORDINATOR_NOT_AVAILABLE,
                                      producer_id=-1, producer_epoch=-1)
    return InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=broker.producer_ids.next_id(),
                                  producer_epoch=0)
