"""Users' SCRAM credentials (RFC 5802, as Kafka stores them), kept durably in the broker's data directory.

A credential is what Kafka keeps per user and mechanism: a salt, an iteration count, StoredKey and ServerKey;
never the password. The PLAIN mechanism checks a password against the user's SCRAM credentials (any of them), so
one store serves both: Kafka's PLAIN reads its users from JAAS instead.

Written with `sparkeos broker add-user` before the broker starts (Kafka's `kafka-storage format --add-scram`) and
by AlterUserScramCredentials while it runs. The file is replaced atomically (written, fsynced, renamed).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from .storage.files import fsync_directory

CREDENTIALS_FILE = "scram-credentials.json"
# Kafka's names and protocol ids (AlterUserScramCredentials' `mechanism`) and hash functions.
SCRAM_MECHANISMS = {"SCRAM-SHA-256": (1, "sha256"), "SCRAM-SHA-512": (2, "sha512")}
MECHANISM_BY_ID = {number: name for name, (number, _) in SCRAM_MECHANISMS.items()}
# Kafka's bounds on a credential's iteration count (ScramMechanism.minIterations / maxIterations).
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096  # Kafka's, when a command names none


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @property
    def hash_name(self) -> str:
        return SCRAM_MECHANISMS[self.mechanism][1]

    def matches(self, password: str) -> bool:
        """Whether `password` is the one this credential was made from."""
        made = credential_from_salted(self.mechanism, self.salt, self.iterations,
                                      salted_password(self.mechanism, password, self.salt, self.iterations))
        return hmac.compare_digest(made.stored_key, self.stored_key)

    def to_json(self) -> dict:
        return {"salt": _b64(self.salt), "iterations": self.iterations, "stored_key": _b64(self.stored_key),
                "server_key": _b64(self.server_key)}

    @classmethod
    def from_json(cls, mechanism: str, data: dict) -> ScramCredential:
        return cls(mechanism, base64.b64decode(data["salt"]), data["iterations"], base64.b64decode(data["stored_key"]),
                   base64.b64decode(data["server_key"]))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(SCRAM_MECHANISMS[mechanism][1], password.encode(), salt, iterations)


def credential_from_salted(mechanism: str, salt: bytes, iterations: int, salted: bytes) -> ScramCredential:
    """The credential a server keeps, from the salted password (what AlterUserScramCredentials carries)."""
    hash_name = SCRAM_MECHANISMS[mechanism][1]
    client_key = hmac.new(salted, b"Client Key", hash_name).digest()
    return ScramCredential(mechanism, salt, iterations, hashlib.new(hash_name, client_key).digest(),
                           hmac.new(salted, b"Server Key", hash_name).digest())


def new_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    salt = secrets.token_bytes(24)
    return credential_from_salted(mechanism, salt, iterations, salted_password(mechanism, password, salt, iterations))


def check_iterations(mechanism: str, iterations: int) -> None:
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"Iterations {iterations} is less than the minimum {MIN_ITERATIONS} for {mechanism}")
    if iterations > MAX_ITERATIONS:
        raise ValueError(f"Iterations {iterations} is more than the maximum {MAX_ITERATIONS} for {mechanism}")


_UNKNOWN_USER = credential_from_salted("SCRAM-SHA-512", b"\x00" * 24, DEFAULT_ITERATIONS, b"\x00" * 64)


class CredentialStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / CREDENTIALS_FILE
        self.users: dict[str, dict[str, ScramCredential]] = {}
        if self.path.exists():
            data = json.loads(self.path.read_text())
            self.users = {user: {mechanism: ScramCredential.from_json(mechanism, credential)
                                 for mechanism, credential in mechanisms.items()}
                          for user, mechanisms in data["users"].items()}

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.users.get(user, {}).get(mechanism)

    def password_matches(self, user: str, password: str) -> bool:
        """PLAIN: whether `password` is `user`'s, by any of the user's SCRAM credentials."""
        credentials = self.users.get(user)
        if not credentials:
            # As long as for a user that exists, so that timing does not tell which users do.
            _UNKNOWN_USER.matches(password)
            return False
        return any(c.matches(password) for c in credentials.values())

    def put(self, user: str, credential: ScramCredential) -> None:
        self.users.setdefault(user, {})[credential.mechanism] = credential

    def delete(self, user: str, mechanism: str) -> bool:
        """False if the user had no such credential."""
        credentials = self.users.get(user, {})
        if credentials.pop(mechanism, None) is None:
            return False
        if not credentials:
            del self.users[user]
        return True

    def save(self) -> None:
        data = {"users": {user: {m: c.to_json() for m, c in mechanisms.items()}
                          for user, mechanisms in sorted(self.users.items())}}
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)
