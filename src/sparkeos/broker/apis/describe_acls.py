"""DescribeAcls (29): the ACLs a filter matches (broker/acls.py), grouped by resource pattern.

Needs DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED); with the authorizer off, SECURITY_DISABLED as Kafka
answers without one. A filter Kafka refuses (an unknown type, an ACL field of the wrong kind) is INVALID_REQUEST.

Leaves out:
- nothing known for versions 0-3 (v0 has no pattern type: its filters match LITERAL patterns only).
"""

from __future__ import annotations

from kafka.protocol.admin import DescribeAclsRequest, DescribeAclsResponse

from ..acls import CLUSTER, CLUSTER_NAME, DESCRIBE, LITERAL, AclError, AclFilter
from ..dispatch import api
from ..errors import CLUSTER_AUTHORIZATION_FAILED, INVALID_REQUEST, SECURITY_DISABLED

Resource_ = DescribeAclsResponse.DescribeAclsResource


def refusal(broker, context, operation: int) -> tuple[int, str] | None:
    """Why an ACL API may not be used now: no authorizer, or the principal may not do `operation` on the cluster."""
    if not broker.authorizer.enabled:
        return SECURITY_DISABLED, "No Authorizer is configured."
    if not broker.allowed(context, operation, CLUSTER, CLUSTER_NAME):
        return CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."
    return None


def acl_filter(wanted, version: int) -> AclFilter:
    """The filter of a DescribeAcls request or of one of DeleteAcls' filters (their fields are named alike)."""
    return AclFilter(wanted.resource_type_filter, wanted.resource_name_filter,
                     wanted.pattern_type_filter if version >= 1 else LITERAL,
                     wanted.principal_filter, wanted.host_filter, wanted.operation, wanted.permission_type)


@api(DescribeAclsRequest, DescribeAclsResponse, 0, 3)
async def handle_describe_acls(broker, context, request):
    refused = refusal(broker, context, DESCRIBE)
    if refused:
        return DescribeAclsResponse(throttle_time_ms=0, error_code=refused[0], error_message=refused[1], resources=[])
    matching = acl_filter(request, context.version)
    try:
        matching.validate()
    except AclError as error:
        return DescribeAclsResponse(throttle_time_ms=0, error_code=INVALID_REQUEST, error_message=str(error),
                                    resources=[])
    grouped: dict[tuple[int, str, int], list] = {}
    for acl in broker.authorizer.acls:
        if matching.matches(acl):
            grouped.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
                Resource_.AclDescription(principal=acl.principal, host=acl.host, operation=acl.operation,
                                         permission_type=acl.permission_type))
    return DescribeAclsResponse(throttle_time_ms=0, error_code=0, error_message=None, resources=[
        Resource_(resource_type=t, resource_name=n, pattern_type=p, acls=entries)
        for (t, n, p), entries in grouped.items()])


