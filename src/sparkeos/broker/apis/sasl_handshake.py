"""SaslHandshake (17): the SASL mechanism a connection of a SASL listener authenticates with (broker/sasl.py).

Answered with the enabled mechanisms; an unsupported one is UNSUPPORTED_SASL_MECHANISM and closes the connection,
and a handshake on a connection that is not authenticating (another listener's, or once authenticated) is
ILLEGAL_SASL_STATE, as Kafka answers.

Leaves out:
- version 0, whose SASL tokens follow as raw frames rather than SaslAuthenticate requests (Kafka 4 dropped it).
"""

from __future__ import annotations

from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

from ..dispatch import api
from ..sasl import SaslError


@api(SaslHandshakeRequest, SaslHandshakeResponse, 1, 1)
async def handle_sasl_handshake(broker, context, request):
    try:
        context.auth.handshake(request.mechanism, broker.credentials)
    except SaslError as error:
        return SaslHandshakeResponse(error_code=error.error_code, mechanisms=list(context.auth.enabled))
    return SaslHandshakeResponse(error_code=0, mechanisms=list(context.auth.enabled))
