"""A secured broker, as production Kafka runs: a SASL_SSL listener whose certificate a CA made on the fly signed
(trustme), SCRAM-SHA-512 users, and the authorizer on with ``admin`` a super user and no one else allowed anything
until an ACL says so. The embedded broker, or a node of Apache Kafka (kind ``kafka-VERSION``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import trustme
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from cryptography.hazmat.primitives import serialization

from sparkeos.apache_kafka import ApacheKafkaCluster, SaslSsl
from sparkeos.broker import EmbeddedBroker
from sparkeos.broker.credentials import CredentialStore, new_credential
from sparkeos.broker.listeners import parse_listeners

MECHANISM = "SCRAM-SHA-512"


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, and a broker certificate for 127.0.0.1 and localhost signed by it: PEM files ``ca``, ``cert``, ``key``,
    and ``keystore`` as Apache Kafka reads one (`ssl.keystore.type=PEM`): the key in PKCS#8, then the chain."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    paths = {"ca": directory / "ca.pem", "cert": directory / "broker.pem", "key": directory / "broker-key.pem",
             "keystore": directory / "keystore.pem"}
    authority.cert_pem.write_to_path(str(paths["ca"]))
    certificate.private_key_pem.write_to_path(str(paths["key"]))
    chain = b"".join(blob.bytes() for blob in certificate.cert_chain_pems)
    paths["cert"].write_bytes(chain)
    key = serialization.load_pem_private_key(certificate.private_key_pem.bytes(), password=None)
    paths["keystore"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()) + chain)
    return paths


def allow(principal: str, resource_type: ResourceType, name: str, operations: Iterable[AclOperation],
          prefixed: bool = False) -> list[AclBinding]:
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    return [AclBinding(resource_type, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)
            for operation in operations]


@dataclass
class SecuredBroker:
    broker: EmbeddedBroker | ApacheKafkaCluster
    certificates: dict[str, Path]  # make_certificates': the CA, and a certificate for 127.0.0.1 that it signed
    passwords: dict[str, str]

    @property
    def ca(self) -> Path:
        return self.certificates["ca"]

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers

    def client_config(self, user: str) -> dict[str, str]:
        """librdkafka's settings to connect as `user`."""
        return {"bootstrap.servers": self.bootstrap_servers, "security.protocol": "SASL_SSL",
                "sasl.mechanism": MECHANISM, "sasl.username": user, "sasl.password": self.passwords[user],
                "ssl.ca.location": str(self.ca)}

    def spark_options(self, user: str) -> dict[str, str]:
        """The same, as options of the sparkeos.kafka source and sink."""
        return {f"kafka.{key}": value for key, value in self.client_config(user).items()}

    def create_acls(self, bindings: list[AclBinding]) -> None:
        admin = AdminClient(self.client_config("admin"))
        futures = admin.create_acls(bindings)
        for future in futures.values():
            future.result(30)


@contextmanager
def secured_broker(directory: Path, kind: str = "embedded", users: Iterable[str] = ("admin", "etl")
                   ) -> Iterator[SecuredBroker]:
    certificates = make_certificates(directory / "certificates")
    passwords = {user: f"{user}-secret" for user in users}
    if kind != "embedded":
        security = SaslSsl(certificates["keystore"], certificates["ca"], passwords, super_users=("admin",),
                           mechanism=MECHANISM)
        with ApacheKafkaCluster(directory / "kafka", kind.removeprefix("kafka-"), sasl_ssl=security) as cluster:
            yield SecuredBroker(cluster, certificates, passwords)
        return
    data_dir = directory / "broker"
    data_dir.mkdir(parents=True)
    store = CredentialStore(data_dir)
    for user, password in passwords.items():
        store.put(user, new_credential(MECHANISM, password))
    store.save()
    with EmbeddedBroker(data_dir, listeners=parse_listeners("SASL_SSL://127.0.0.1:0"),
                        ssl_certfile=certificates["cert"], ssl_keyfile=certificates["key"], authorizer=True,
                        super_users=("User:admin",)) as broker:
        yield SecuredBroker(broker, certificates, passwords)
