"""SaslAuthenticate (36): one SASL token of the mechanism SaslHandshake chose, and the broker's answer to it
(broker/sasl.py). A failed authentication is SASL_AUTHENTICATION_FAILED, with Kafka's message, and closes the
connection once answered.

Leaves out:
- re-authentication (KIP-368): the session lifetime (v1+) is always 0.
"""

from __future__ import annotations

from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse

from ..dispatch import api
from ..sasl import SaslError


@api(SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 2)
async def handle_sasl_authenticate(broker, context, request):
    try:
        answer = context.auth.authenticate(bytes(request.auth_bytes))
    except SaslError as error:
        return SaslAuthenticateResponse(error_code=error.error_code, error_message=str(error), auth_bytes=b"",
                                        session_lifetime_ms=0)
    return SaslAuthenticateResponse(error_code=0, error_message=None, auth_bytes=answer, session_lifetime_ms=0)
