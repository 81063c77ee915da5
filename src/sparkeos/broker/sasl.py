"""SASL on a connection of a SASL_PLAINTEXT or SASL_SSL listener: the state Kafka's SaslServerAuthenticator keeps,
and the server side of the mechanisms PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802 and 7677, as
Kafka's ScramSaslServer does it). Nothing here knows of sockets: the server asks `allows` before it starts a
request, and the SaslHandshake and SaslAuthenticate handlers drive the state.

A connection of such a listener may send ApiVersions and SaslHandshake (v1: its tokens then come in
SaslAuthenticate requests; v0's raw tokens are left out, as Kafka 4 leaves them out), then SaslAuthenticate until
the mechanism is done; any other request before that closes the connection, as Kafka closes it. A failed
authentication is answered with SASL_AUTHENTICATION_FAILED, then the connection is closed. Connections of other
listeners are authenticated from the start, as `User:ANONYMOUS`.

Left out: re-authentication (KIP-368, `connections.max.reauth.ms`: the session lifetime answered is 0), SCRAM
extensions and delegation tokens, GSSAPI and OAUTHBEARER.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from .credentials import CredentialStore, ScramCredential
from .errors import ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ANONYMOUS = "User:ANONYMOUS"
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36


class SaslError(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


def _failed(mechanism: str) -> SaslError:
    # Kafka's message, which says no more than that: which of user and password was wrong is not told.
    return SaslError(SASL_AUTHENTICATION_FAILED, "Authentication failed during authentication due to invalid "
                                                 f"credentials with SASL mechanism {mechanism}")


class Plain:
    """RFC 4616: one message, `authzid NUL authcid NUL passwd`."""

    def __init__(self, credentials: CredentialStore) -> None:
        self.credentials = credentials
        self.user: str | None = None

    def step(self, token: bytes) -> tuple[bytes, bool]:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslError(SASL_AUTHENTICATION_FAILED, "Invalid SASL/PLAIN response: expected 3 tokens, got "
                                                        f"{len(parts)}")
        authzid, user, password = (part.decode("utf-8", "replace") for part in parts)
        if not user or not password:
            raise SaslError(SASL_AUTHENTICATION_FAILED, "Authentication failed: username or password not specified")
        if authzid and authzid != user:
            raise SaslError(SASL_AUTHENTICATION_FAILED, "Authentication failed: Client requested an authorization "
                                                        "id that is different from username")
        if not self.credentials.password_matches(user, password):
            raise SaslError(SASL_AUTHENTICATION_FAILED, "Authentication failed: Invalid username or password")
        self.user = user
        return b"", True


class Scram:
    """RFC 5802 server: client-first, server-first, client-final, server-final."""

    def __init__(self, mechanism: str, credentials: CredentialStore) -> None:
        self.mechanism = mechanism
        self.credentials = credentials
        self.user: str | None = None
        self._credential: ScramCredential | None = None
        self._nonce = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""

    def step(self, token: bytes) -> tuple[bytes, bool]:
        if self._credential is None:
            return self._first(token.decode("utf-8", "replace")), False
        return self._final(token.decode("utf-8", "replace")), True

    def _first(self, message: str) -> bytes:
        # gs2-header "n,," or "n,a=authzid,", then client-first-message-bare "n=user,r=nonce[,extensions]".
        pieces = message.split(",", 2)
        if len(pieces) != 3 or pieces[0] != "n" or not pieces[2].startswith("n="):
            raise SaslError(SASL_AUTHENTICATION_FAILED, f"Invalid SCRAM client first message: {message[:80]!r}")
        self._gs2_header = f"{pieces[0]},{pieces[1]},"
        self._client_first_bare = pieces[2]
        attributes = dict(item.split("=", 1) for item in pieces[2].split(",") if "=" in item)
        user = attributes.get("n", "").replace("=2C", ",").replace("=3D", "=")
        client_nonce = attributes.get("r", "")
        authzid = pieces[1][2:].replace("=2C", ",").replace("=3D", "=") if pieces[1].startswith("a=") else ""
        if not user or not client_nonce:
            raise SaslError(SASL_AUTHENTICATION_FAILED, "Invalid SCRAM client first message: no user or nonce")
        if authzid and authzid != user:
            raise SaslError(SASL_AUTHENTICATION_FAILED, "Authentication failed: Client requested an authorization "
                                                        "id that is different from username")
        credential = self.credentials.get(user, self.mechanism)
        if credential is None:
            raise _failed(self.mechanism)
        self.user, self._credential = user, credential
        self._nonce = client_nonce + base64.b64encode(secrets.token_bytes(18)).decode()
        self._server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                              f"i={credential.iterations}")
        return self._server_first.encode()

    def _final(self, message: str) -> bytes:
        credential = self._credential
        assert credential is not None
        without_proof, _, proof_part = message.rpartition(",p=")
        attributes = dict(item.split("=", 1) for item in without_proof.split(",") if "=" in item)
        if not proof_part or attributes.get("r") != self._nonce:
            raise SaslError(SASL_AUTHENTICATION_FAILED, "Invalid SCRAM client final message: its nonce is not the "
                                                        "server's")
        if attributes.get("c") != base64.b64encode(self._gs2_header.encode()).decode():
            raise SaslError(SASL_AUTHENTICATION_FAILED, "Invalid SCRAM client final message: channel binding does "
                                                        "not match the client first message")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        hash_name = credential.hash_name
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise _failed(self.mechanism) from None
        client_signature = hmac.new(credential.stored_key, auth_message, hash_name).digest()
        if len(proof) != len(client_signature):
            raise _failed(self.mechanism)
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        if not hmac.compare_digest(hashlib.new(hash_name, client_key).digest(), credential.stored_key):
            raise _failed(self.mechanism)
        server_signature = hmac.new(credential.server_key, auth_message, hash_name).digest()
        return b"v=" + base64.b64encode(server_signature)


@dataclass
class ConnectionAuth:
    """Where a connection is in authenticating, and who it is once it is."""

    sasl: bool  # the connection came in through a SASL listener
    principal: str | None = None  # `User:<name>` once authenticated
    mechanism: Plain | Scram | None = None  # chosen by SaslHandshake
    failed: bool = False  # the connection closes once the answer that says so is written
    enabled: tuple[str, ...] = field(default=MECHANISMS)

    def __post_init__(self) -> None:
        if not self.sasl:
            self.principal = ANONYMOUS

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    def allows(self, api_key: int) -> bool:
        """Whether a request of `api_key` may be started now; if not, the connection is closed."""
        if self.authenticated:
            return True
        if self.mechanism is not None:  # after the handshake, only its tokens, as Kafka's authenticator
            return api_key == SASL_AUTHENTICATE
        return api_key in (API_VERSIONS, SASL_HANDSHAKE)

    def handshake(self, mechanism: str, credentials: CredentialStore) -> None:
        if not self.sasl or self.authenticated or self.mechanism is not None:
            raise SaslError(ILLEGAL_SASL_STATE, "Unexpected SASL handshake: the connection is not authenticating")
        if mechanism not in self.enabled:
            self.failed = True
            raise SaslError(UNSUPPORTED_SASL_MECHANISM, f"Unsupported SASL mechanism {mechanism}")
        self.mechanism = Plain(credentials) if mechanism == "PLAIN" else Scram(mechanism, credentials)

    def authenticate(self, token: bytes) -> bytes:
        if self.authenticated or self.mechanism is None:
            raise SaslError(ILLEGAL_SASL_STATE, "SaslAuthenticate request received after successful "
                                                "authentication" if self.authenticated else
                                                "SaslAuthenticate before SaslHandshake")
        try:
            answer, done = self.mechanism.step(token)
        except SaslError:
            self.failed = True
            raise
        if done:
            self.principal = f"User:{self.mechanism.user}"
        return answer
