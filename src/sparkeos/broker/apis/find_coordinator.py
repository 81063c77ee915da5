"""FindCoordinator (10): this broker coordinates every group and every transactional id.

Leaves out:
- nothing known for versions 0-4.
"""

from __future__ import annotations

from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from ..core import NODE_ID
from ..dispatch import api
from ..errors import INVALID_REQUEST

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1

SUPPORTED_KEY_TYPES = {GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE}


@api(FindCoordinatorRequest, FindCoordinatorResponse, 0, 4)
async def handle_find_coordinator(broker, context, request):
    key_type = request.key_type if context.version >= 1 else GROUP_KEY_TYPE
    if key_type in SUPPORTED_KEY_TYPES:
        error, message = 0, None
    else:
        error, message = INVALID_REQUEST, f"unknown coordinator key type {key_type}"
    host, port = context.listener.address
    node = NODE_ID if error == 0 else -1
    if context.version >= 4:
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            coordinators=[
                FindCoordinatorResponse.Coordinator(key=key, node_id=node, host=host if node >= 0 else "",
                                                    port=port if node >= 0 else -1, error_code=error,
                                                    error_message=message)
                for key in request.coordinator_keys
            ],
        )
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=error, error_message=message, node_id=node,
                                   host=host if node >= 0 else "", port=port if node >= 0 else -1)
