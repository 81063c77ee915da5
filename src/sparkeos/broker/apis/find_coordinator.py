"""FindCoordinator (10): this broker coordinates every group and every transactional id.

Leaves out:
- nothing known for versions 0-4.
"""

from __future__ import annotations

from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from ..acls import DESCRIBE, GROUP, TRANSACTIONAL_ID
from ..core import NODE_ID
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED, INVALID_REQUEST, TRANSACTIONAL_ID_AUTHORIZATION_FAILED

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1

SUPPORTED_KEY_TYPES = {GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE}


@api(FindCoordinatorRequest, FindCoordinatorResponse, 0, 4)
async def handle_find_coordinator(broker, context, request):
    key_type = request.key_type if context.version >= 1 else GROUP_KEY_TYPE
    host, port = context.listener.address

    def answer(key: str) -> tuple[int, int, str | None]:
        """(node, error, message) for one key."""
        if key_type not in SUPPORTED_KEY_TYPES:
            return -1, INVALID_REQUEST, f"unknown coordinator key type {key_type}"
        if key_type == GROUP_KEY_TYPE and not broker.allowed(context, DESCRIBE, GROUP, key):
            return -1, GROUP_AUTHORIZATION_FAILED, None
        if key_type == TRANSACTION_KEY_TYPE and not broker.allowed(context, DESCRIBE, TRANSACTIONAL_ID, key):
            return -1, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
        return NODE_ID, 0, None

    if context.version >= 4:
        coordinators = []
        for key in request.coordinator_keys:
            node, error, message = answer(key)
            coordinators.append(FindCoordinatorResponse.Coordinator(
                key=key, node_id=node, host=host if node >= 0 else "", port=port if node >= 0 else -1,
                error_code=error, error_message=message))
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)
    node, error, message = answer(request.key)
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=error, error_message=message, node_id=node,
                                   host=host if node >= 0 else "", port=port if node >= 0 else -1)
