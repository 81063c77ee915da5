"""DeleteAcls (31): remove the ACLs each filter matches (broker/acls.py), and say which.

Needs ALTER on the cluster; with the authorizer off, SECURITY_DISABLED.

Leaves out:
- nothing known for versions 0-3 (v0 has no pattern type: its filters match LITERAL patterns only).
"""

from __future__ import annotations

from kafka.protocol.admin import DeleteAclsRequest, DeleteAclsResponse

from ..acls import ALTER, AclError
from ..dispatch import api
from ..errors import INVALID_REQUEST
from .describe_acls import acl_filter, refusal

FilterResult = DeleteAclsResponse.DeleteAclsFilterResult


@api(DeleteAclsRequest, DeleteAclsResponse, 0, 3)
async def handle_delete_acls(broker, context, request):
    refused = refusal(broker, context, ALTER)
    results = []
    for wanted in request.filters:
        if refused:
            results.append(FilterResult(error_code=refused[0], error_message=refused[1], matching_acls=[]))
            continue
        matching = acl_filter(wanted, context.version)
        try:
            matching.validate()
        except AclError as error:
            results.append(FilterResult(error_code=INVALID_REQUEST, error_message=str(error), matching_acls=[]))
            continue
        removed = broker.authorizer.remove(matching)
        results.append(FilterResult(error_code=0, error_message=None, matching_acls=[
            FilterResult.DeleteAclsMatchingAcl(error_code=0, error_message=None, resource_type=acl.resource_type,
                                               resource_name=acl.resource_name, pattern_type=acl.pattern_type,
                                               principal=acl.principal, host=acl.host, operation=acl.operation,
                                               permission_type=acl.permission_type)
            for acl in removed]))
    return DeleteAclsResponse(throttle_time_ms=0, filter_results=results)
