"""SyncGroup (14): the leader hands in assignments; every member waits for its own.

Leaves out:
- nothing known for versions 0-5.
"""

from __future__ import annotations

from kafka.protocol.consumer import SyncGroupRequest, SyncGroupResponse

from ..acls import GROUP, READ
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED


@api(SyncGroupRequest, SyncGroupResponse, 0, 5)
async def handle_sync_group(broker, context, request):
    version = context.version
    if not broker.allowed(context, READ, GROUP, request.group_id):
        return SyncGroupResponse(throttle_time_ms=0, error_code=GROUP_AUTHORIZATION_FAILED, protocol_type=None,
                                 protocol_name=None, assignment=b"")
    result = await broker.groups.sync_group(
        group_id=request.group_id,
        generation_id=request.generation_id,
        member_id=request.member_id,
        instance_id=request.group_instance_id if version >= 3 else None,
        protocol_type=request.protocol_type if version >= 5 else None,
        protocol_name=request.protocol_name if version >= 5 else None,
        assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
    )
    return SyncGroupResponse(
        throttle_time_ms=0,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )
