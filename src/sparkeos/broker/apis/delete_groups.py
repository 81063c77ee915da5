"""DeleteGroups (42): remove empty groups and their committed offsets (admin tools, lag-tool clean-up).

Leaves out:
- INVALID_GROUP_ID for an empty group id: it is answered like any other group id.
"""

from __future__ import annotations

from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse

from ..acls import DELETE, GROUP
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED

Result = DeleteGroupsResponse.DeletableGroupResult


@api(DeleteGroupsRequest, DeleteGroupsResponse, 0, 2)
async def handle_delete_groups(broker, context, request):
    return DeleteGroupsResponse(
        throttle_time_ms=0,
        results=[Result(group_id=group_id, error_code=broker.groups.delete_group(group_id)
                        if broker.allowed(context, DELETE, GROUP, group_id) else GROUP_AUTHORIZATION_FAILED)
                 for group_id in request.groups_names],
    )
