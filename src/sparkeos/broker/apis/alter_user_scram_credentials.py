"""AlterUserScramCredentials (51): create, replace or delete users' SCRAM credentials (broker/credentials.py). The
client sends the salted password, never the password; the credentials are on disk before the answer.

Errors as Kafka's, per user: an unknown mechanism is UNSUPPORTED_SASL_MECHANISM, an empty name or an iteration
count out of 4096-16384 UNACCEPTABLE_CREDENTIAL, a user altered twice in one request DUPLICATE_RESOURCE, the
deletion of a credential that does not exist RESOURCE_NOT_FOUND; without ALTER on the cluster, every user is
CLUSTER_AUTHORIZATION_FAILED. A user with any error has none of its changes applied.

Leaves out:
- nothing known for version 0.
"""

from __future__ import annotations

from collections import Counter

from kafka.protocol.admin import AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse

from ..acls import ALTER, CLUSTER, CLUSTER_NAME
from ..credentials import MECHANISM_BY_ID, check_iterations, credential_from_salted
from ..dispatch import api
from ..errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    DUPLICATE_RESOURCE,
    RESOURCE_NOT_FOUND,
    UNACCEPTABLE_CREDENTIAL,
    UNSUPPORTED_SASL_MECHANISM,
)

Result = AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult


@api(AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, 0, 0)
async def handle_alter_user_scram_credentials(broker, context, request):
    store = broker.credentials
    changes = [(d.name, d.mechanism, None) for d in request.deletions] + [
        (u.name, u.mechanism, u) for u in request.upsertions]
    per_user = Counter((name, mechanism) for name, mechanism, _ in changes)
    errors: dict[str, tuple[int, str]] = {}
    denied = not broker.allowed(context, ALTER, CLUSTER, CLUSTER_NAME)
    for name, mechanism, upsertion in changes:
        if name in errors:
            continue
        if denied:
            errors[name] = (CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
        elif not name:
            errors[name] = (UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        elif mechanism not in MECHANISM_BY_ID:
            errors[name] = (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        elif per_user[(name, mechanism)] > 1:
            errors[name] = (DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
        elif upsertion is None and store.get(name, MECHANISM_BY_ID[mechanism]) is None:
            errors[name] = (RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
        elif upsertion is not None:
            try:
                check_iterations(MECHANISM_BY_ID[mechanism], upsertion.iterations)
            except ValueError as error:
                errors[name] = (UNACCEPTABLE_CREDENTIAL, str(error))
    for name, mechanism, upsertion in changes:
        if name in errors:
            continue
        if upsertion is None:
            store.delete(name, MECHANISM_BY_ID[mechanism])
        else:
            store.put(name, credential_from_salted(MECHANISM_BY_ID[mechanism], bytes(upsertion.salt),
                                                   upsertion.iterations, bytes(upsertion.salted_password)))
    if any(name not in errors for name, _, _ in changes):
        store.save()
    users = list(dict.fromkeys(name for name, _, _ in changes))
    return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=[
        Result(user=user, error_code=errors.get(user, (0, None))[0], error_message=errors.get(user, (0, None))[1])
        for user in users])
