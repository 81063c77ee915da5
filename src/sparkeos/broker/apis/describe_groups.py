"""DescribeGroups (15): state, protocol and members (with assignments once Stable).

Leaves out:
- nothing known for versions 0-5 (authorized operations, v3+, are those of READ, DELETE and DESCRIBE the
  principal may do to the group).
"""

from __future__ import annotations

from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse

from ..acls import DESCRIBE, GROUP
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED

Group_ = DescribeGroupsResponse.DescribedGroup
Member_ = Group_.DescribedGroupMember

@api(DescribeGroupsRequest, DescribeGroupsResponse, 0, 5)
async def handle_describe_groups(broker, context, request):
    include_operations = context.version >= 3 and request.include_authorized_operations
    groups = []
    for group_id in request.groups:
        if not broker.allowed(context, DESCRIBE, GROUP, group_id):
            groups.append(Group_(error_code=GROUP_AUTHORIZATION_FAILED, group_id=group_id, group_state="",
                                 protocol_type="", protocol_data="", members=[],
                                 authorized_operations=None if not include_operations else set()))
            continue
        summary = broker.groups.describe_group(group_id)
        groups.append(Group_(
            error_code=0,
            group_id=summary.group_id,
            group_state=summary.state,
            protocol_type=summary.protocol_type,
            protocol_data=summary.protocol_name,
            members=[
                Member_(member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
                        client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
                for m in summary.members
            ],
            # The codec takes the set bit positions; None encodes INT32_MIN ("not requested").
            authorized_operations=broker.authorized_operations(context, GROUP, group_id) if include_operations
            else None,
        ))
    return DescribeGroupsResponse(throttle_time_ms=0, groups=groups)
