"""LeaveGroup (13): members leave at once instead of waiting for their sessions to expire.

Leaves out:
- the `reason` a member gives (v5), which Kafka only logs.
"""

from __future__ import annotations

from kafka.protocol.consumer import LeaveGroupRequest, LeaveGroupResponse

from ..acls import GROUP, READ
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED

MemberResponse_ = LeaveGroupResponse.MemberResponse


@api(LeaveGroupRequest, LeaveGroupResponse, 0, 5)
async def handle_leave_group(broker, context, request):
    if not broker.allowed(context, READ, GROUP, request.group_id):
        return LeaveGroupResponse(throttle_time_ms=0, error_code=GROUP_AUTHORIZATION_FAILED, members=[])
    if context.version >= 3:
        leaving = [(m.member_id or "", m.group_instance_id) for m in request.members]
    else:
        leaving = [(request.member_id, None)]
    error, member_errors = broker.groups.leave_group(request.group_id, leaving)
    if context.version < 3:
        # One member, one error: before v3 it is the response's only error.
        return LeaveGroupResponse(throttle_time_ms=0,
                                  error_code=error or next((e for e in member_errors if e), 0))
    members = [] if error else [
        MemberResponse_(member_id=member_id, group_instance_id=instance_id, error_code=member_error)
        for (member_id, instance_id), member_error in zip(leaving, member_errors, strict=True)
    ]
    return LeaveGroupResponse(throttle_time_ms=0, error_code=error, members=members)
