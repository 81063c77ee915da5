"""JoinGroup (11): enter a group's next generation; parked until the rebalance completes.

Leaves out:
- `group.max.size`: GROUP_MAX_SIZE_REACHED is never answered;
- `skip_assignment` (v9, KIP-814), which spares a rejoining static leader a new assignment: always false;
- the `reason` a member gives (v8+), which Kafka only logs.
"""

from __future__ import annotations

from kafka.protocol.consumer import JoinGroupRequest, JoinGroupResponse

from ..acls import GROUP, READ
from ..dispatch import api
from ..errors import GROUP_AUTHORIZATION_FAILED

Member_ = JoinGroupResponse.JoinGroupResponseMember


def client_host(peer: str) -> str:
    """Kafka reports a member's address as `/<ip>`."""
    return "/" + peer.rsplit(":", 1)[0]


@api(JoinGroupRequest, JoinGroupResponse, 0, 9)
async def handle_join_group(broker, context, request):
    version = context.version
    if not broker.allowed(context, READ, GROUP, request.group_id):
        return JoinGroupResponse(throttle_time_ms=0, error_code=GROUP_AUTHORIZATION_FAILED, generation_id=-1,
                                 protocol_type=None, protocol_name=None if version >= 7 else "", leader="",
                                 skip_assignment=False, member_id="", members=[])
    result = await broker.groups.join_group(
        group_id=request.group_id,
        member_id=request.member_id or "",
        instance_id=request.group_instance_id if version >= 5 else None,
        client_id=context.client_id or "",
        client_host=client_host(context.peer),
        session_timeout_ms=request.session_timeout_ms,
        # v0 had no rebalance timeout: the session timeout bounded the rebalance too.
        rebalance_timeout_ms=request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms,
        protocol_type=request.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
        require_known_member_id=version >= 4,
    )
    protocol_name = result.protocol_name
    if protocol_name is None and version < 7:
        protocol_name = ""  # not nullable before v7
    return JoinGroupResponse(
        throttle_time_ms=0,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=protocol_name,
        leader=result.leader_id,
        skip_assignment=False,
        member_id=result.member_id,
        members=[Member_(member_id=m, group_instance_id=i, metadata=md) for m, i, md in result.members],
    )
