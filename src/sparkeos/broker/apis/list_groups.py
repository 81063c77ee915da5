"""ListGroups (16): every group this coordinator knows, optionally filtered by state (v4).

Leaves out:
- nothing known for versions 0-4.
"""

from __future__ import annotations

from kafka.protocol.admin import ListGroupsRequest, ListGroupsResponse

from ..acls import CLUSTER, CLUSTER_NAME, DESCRIBE, GROUP
from ..dispatch import api

Listed_ = ListGroupsResponse.ListedGroup


@api(ListGroupsRequest, ListGroupsResponse, 0, 4)
async def handle_list_groups(broker, context, request):
    states = list(request.states_filter) if context.version >= 4 and request.states_filter else None
    return ListGroupsResponse(
        throttle_time_ms=0,
        error_code=0,
        # Every group with DESCRIBE on the cluster, else the groups the principal may describe (as Kafka lists).
        groups=[Listed_(group_id=g, protocol_type=t, group_state=s) for g, t, s in broker.groups.list_groups(states)
                if broker.allowed(context, DESCRIBE, CLUSTER, CLUSTER_NAME)
                or broker.allowed(context, DESCRIBE, GROUP, g)],
    )
