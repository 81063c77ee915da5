"""Heartbeat (12): keeps a member's session alive and tells it when to rejoin.

Leaves out:
- nothing known for versions 0-4.
"""

from __future__ import annotations

from kafka.protocol.consumer import HeartbeatRequest, HeartbeatResponse

from ..acls import GROUP, READ
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED


@api(HeartbeatRequest, HeartbeatResponse, 0, 4)
async def handle_heartbeat(broker, context, request):
    if not broker.allowed(context, READ, GROUP, request.group_id):
        return HeartbeatResponse(throttle_time_ms=0, error_code=GROUP_AUTHORIZATION_FAILED)
    error = broker.groups.heartbeat(
        request.group_id,
        request.generation_id,
        request.member_id,
        request.group_instance_id if context.version >= 3 else None,
    )
    return HeartbeatResponse(throttle_time_ms=0, error_code=error)
