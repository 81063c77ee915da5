"""CreateAcls (30): add ACLs (broker/acls.py), on disk before the answer.

Needs ALTER on the cluster; with the authorizer off, SECURITY_DISABLED. Each creation Kafka refuses (an unknown
resource type or operation, a pattern type other than LITERAL or PREFIXED, a principal without a type) is
INVALID_REQUEST, naming the field; the others are added.

Leaves out:
- nothing known for versions 0-3 (v0 has no pattern type: its ACLs are LITERAL).
"""

from __future__ import annotations

from kafka.protocol.admin import CreateAclsRequest, CreateAclsResponse

from ..acls import ALTER, LITERAL, Acl, AclError
from ..dispatch import api
from ..errors import INVALID_REQUEST
from .describe_acls import refusal

Result = CreateAclsResponse.AclCreationResult


@api(CreateAclsRequest, CreateAclsResponse, 0, 3)
async def handle_create_acls(broker, context, request):
    refused = refusal(broker, context, ALTER)
    results, added = [], []
    for creation in request.creations:
        if refused:
            results.append(Result(error_code=refused[0], error_message=refused[1]))
            continue
        acl = Acl(creation.resource_type, creation.resource_name,
                  creation.resource_pattern_type if context.version >= 1 else LITERAL,
                  creation.principal, creation.host, creation.operation, creation.permission_type)
        try:
            acl.validate()
        except AclError as error:
            results.append(Result(error_code=INVALID_REQUEST, error_message=str(error)))
            continue
        added.append(acl)
        results.append(Result(error_code=0, error_message=None))
    if added:
        broker.authorizer.add(added)
    return CreateAclsResponse(throttle_time_ms=0, results=results)
