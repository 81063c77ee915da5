"""DescribeUserScramCredentials (50): each user's SCRAM mechanisms and iteration counts, never the credentials
(broker/credentials.py). No users named (null or empty) describes every user.

Errors as Kafka's: a user named twice is DUPLICATE_RESOURCE, a user without credentials RESOURCE_NOT_FOUND;
without DESCRIBE on the cluster, CLUSTER_AUTHORIZATION_FAILED.

Leaves out:
- nothing known for version 0.
"""

from __future__ import annotations

from kafka.protocol.admin import DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse

from ..acls import CLUSTER, CLUSTER_NAME, DESCRIBE
from ..credentials import SCRAM_MECHANISMS
from ..dispatch import api
from ..errors import CLUSTER_AUTHORIZATION_FAILED, DUPLICATE_RESOURCE, RESOURCE_NOT_FOUND

Result = DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult


@api(DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse, 0, 0)
async def handle_describe_user_scram_credentials(broker, context, request):
    if not broker.allowed(context, DESCRIBE, CLUSTER, CLUSTER_NAME):
        return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED,
                                                    error_message="Cluster authorization failed.", results=[])
    store = broker.credentials
    named = [user.name for user in request.users or []]
    results = []
    for user in named or sorted(store.users):
        if named.count(user) > 1:
            if user not in [r.user for r in results]:
                results.append(Result(user=user, error_code=DUPLICATE_RESOURCE, error_message=(
                    "Cannot describe SCRAM credentials for the same user twice in a single request"),
                    credential_infos=[]))
            continue
        credentials = store.users.get(user)
        if not credentials:
            results.append(Result(user=user, error_code=RESOURCE_NOT_FOUND, error_message=(
                "Attempt to describe a user credential that does not exist"), credential_infos=[]))
            continue
        results.append(Result(user=user, error_code=0, error_message=None, credential_infos=[
            Result.CredentialInfo(mechanism=SCRAM_MECHANISMS[mechanism][0], iterations=credential.iterations)
            for mechanism, credential in sorted(credentials.items())]))
    return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=0, error_message=None, results=results)
