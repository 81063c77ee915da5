"""Listeners with TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) through real clients: confluent-kafka
(librdkafka), kafka-python and aiokafka; what a wrong password, an unknown user, an unsupported mechanism and a
request sent before authenticating get, on the wire; users made with `sparkeos broker add-user` and with
AlterUserScramCredentials. Certificates are made for each test session (trustme).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from sparkeos.broker import BrokerProcess, EmbeddedBroker
from sparkeos.broker.credentials import CredentialStore, new_credential
from sparkeos.broker.listeners import parse_listeners
from support.kafka_java import run_kafka_check
from support.secured import make_certificates
from support.wire import ConnectionClosed, WireClient

LISTENERS = "SASL_SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0"
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
USER, PASSWORD = "alice", "alice-secret"


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, and the broker's certificate for 127.0.0.1 signed by it: PEM files."""
    return make_certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture
def secured(tmp_path: Path, certificates: dict[str, Path]):
    """A broker with one listener of each security protocol, and the user alice (both SCRAM mechanisms)."""
    data_dir = tmp_path / "broker"
    store = CredentialStore(data_dir)
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        store.put(USER, new_credential(mechanism, PASSWORD))
    data_dir.mkdir(parents=True)
    store.save()
    with EmbeddedBroker(data_dir, listeners=parse_listeners(LISTENERS), ssl_certfile=certificates["cert"],
                        ssl_keyfile=certificates["key"]) as broker:
        yield broker


def address(broker: EmbeddedBroker, protocol: str) -> str:
    listener = next(listener for listener in broker.broker.listeners if listener.name == protocol)
    return f"{listener.host}:{listener.port}"


def librdkafka_config(broker: EmbeddedBroker, protocol: str, certificates: dict[str, Path],
                      mechanism: str | None = None, password: str = PASSWORD, user: str = USER) -> dict:
    config = {"bootstrap.servers": address(broker, protocol), "security.protocol": protocol}
    if "SSL" in protocol:
        config["ssl.ca.location"] = str(certificates["ca"])
    if mechanism:
        config |= {"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}
    return config


def round_trip(config: dict, values: list[bytes]) -> list[bytes]:
    """Produce `values` to a new topic and read them back, with librdkafka and `config`."""
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    producer = Producer({**config, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[bytes] = []
    try:
        while len(read) < len(values):
            message = consumer.poll(10)
            assert message is not None, f"read {len(read)} of {len(values)}"
            assert message.error() is None, message.error()
            read.append(message.value())
    finally:
        consumer.close()
    return read


@pytest.mark.parametrize("protocol", ["SASL_SSL", "SASL_PLAINTEXT"])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_authenticates_with_each_mechanism_on_each_sasl_listener(secured, certificates, protocol,
                                                                           mechanism) -> None:
    values = [b"%s-%d" % (mechanism.encode(), i) for i in range(50)]
    assert round_trip(librdkafka_config(secured, protocol, certificates, mechanism), values) == values


@pytest.mark.parametrize("protocol", ["SSL", "PLAINTEXT"])
def test_the_listeners_without_sasl_serve_anyone(secured, certificates, protocol) -> None:
    assert round_trip(librdkafka_config(secured, protocol, certificates), [b"a", b"b"]) == [b"a", b"b"]


def test_each_client_is_told_the_address_of_the_listener_it_came_through(secured, certificates) -> None:
    for protocol in ("SASL_SSL", "PLAINTEXT"):
        config = librdkafka_config(secured, protocol, certificates,
                                   "SCRAM-SHA-256" if protocol.startswith("SASL") else None)
        brokers = AdminClient(config).list_topics(timeout=30).brokers
        assert [f"{b.host}:{b.port}" for b in brokers.values()] == [address(secured, protocol)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_authenticates_with_each_mechanism_over_tls(secured, certificates, mechanism) -> None:
    topic = f"kp-{uuid.uuid4().hex[:8]}"
    settings = {"bootstrap_servers": address(secured, "SASL_SSL"), "security_protocol": "SASL_SSL",
                "sasl_mechanism": mechanism, "sasl_plain_username": USER, "sasl_plain_password": PASSWORD,
                "ssl_cafile": str(certificates["ca"]), "ssl_check_hostname": True}
    producer = KafkaProducer(**settings)
    for i in range(20):
        producer.send(topic, b"kp-%d" % i, partition=0)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(**settings, auto_offset_reset="earliest", consumer_timeout_ms=10000)
    consumer.assign([KafkaTopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    assert [m.value for m in consumer][:20] == [b"kp-%d" % i for i in range(20)]
    consumer.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka_authenticates_with_each_mechanism_over_tls(secured, certificates, mechanism) -> None:
    topic = f"aio-{uuid.uuid4().hex[:8]}"

    async def run() -> list[bytes]:
        settings = {"bootstrap_servers": address(secured, "SASL_SSL"), "security_protocol": "SASL_SSL",
                    "sasl_mechanism": mechanism, "sasl_plain_username": USER, "sasl_plain_password": PASSWORD,
                    "ssl_context": create_ssl_context(cafile=str(certificates["ca"]))}
        producer = AIOKafkaProducer(**settings)
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait(topic, b"aio-%d" % i, partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, **settings, auto_offset_reset="earliest")
        await consumer.start()
        try:
            return [(await consumer.getone()).value for _ in range(20)]
        finally:
            await consumer.stop()

    assert asyncio.run(asyncio.wait_for(run(), 60)) == [b"aio-%d" % i for i in range(20)]


LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                 "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_java_client_authenticates_with_each_mechanism_over_tls(secured, certificates, kafka_check, tmp_path,
                                                                   mechanism) -> None:
    settings = tmp_path / "client.properties"
    settings.write_text("\n".join([
        "security.protocol=SASL_SSL",
        f"sasl.mechanism={mechanism}",
        f'sasl.jaas.config={LOGIN_MODULES[mechanism]} required username="{USER}" password="{PASSWORD}";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={certificates['ca']}",
    ]) + "\n")
    run_kafka_check(kafka_check, address(secured, "SASL_SSL"), "transactions", settings)


# --- refusals, on the wire -----------------------------------------------------------------------------------------


def sasl_handshake(wire: WireClient, mechanism: str):
    return wire.request(SaslHandshakeRequest(mechanism=mechanism), SaslHandshakeResponse, 1)


def sasl_authenticate(wire: WireClient, token: bytes):
    return wire.request(SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse, 1)


def assert_closed(wire: WireClient) -> None:
    with pytest.raises((ConnectionClosed, OSError)):
        wire.metadata(None)


@pytest.mark.parametrize(("user", "password"), [(USER, "wrong"), ("mallory", PASSWORD)])
def test_a_wrong_password_or_an_unknown_user_fails_plain_with_kafkas_error_and_closes_the_connection(
        secured, user, password) -> None:
    with WireClient(address(secured, "SASL_PLAINTEXT")) as wire:
        assert sasl_handshake(wire, "PLAIN").error_code == 0
        answer = sasl_authenticate(wire, b"\x00%s\x00%s" % (user.encode(), password.encode()))
        assert answer.error_code == 58  # SASL_AUTHENTICATION_FAILED
        assert answer.error_message == "Authentication failed: Invalid username or password"
        assert_closed(wire)


def test_an_unknown_scram_user_fails_at_its_first_message(secured) -> None:
    with WireClient(address(secured, "SASL_PLAINTEXT")) as wire:
        assert sasl_handshake(wire, "SCRAM-SHA-512").error_code == 0
        answer = sasl_authenticate(wire, b"n,,n=mallory,r=abcdefgh")
        assert (answer.error_code, answer.error_message) == (58, (
            "Authentication failed during authentication due to invalid credentials with SASL mechanism "
            "SCRAM-SHA-512"))
        assert_closed(wire)


def test_librdkafka_with_a_wrong_scram_password_gets_an_authentication_error(secured, certificates) -> None:
    config = librdkafka_config(secured, "SASL_SSL", certificates, "SCRAM-SHA-256", password="wrong")
    with pytest.raises(KafkaException) as raised:
        AdminClient(config).list_topics(timeout=10)
    # librdkafka reports the broker's answer, or gives up on the broker it could not authenticate to.
    assert raised.value.args[0].name() in ("_AUTHENTICATION", "_TRANSPORT", "_ALL_BROKERS_DOWN"), raised.value


def test_an_unsupported_mechanism_is_refused_with_the_enabled_ones(secured) -> None:
    with WireClient(address(secured, "SASL_PLAINTEXT")) as wire:
        answer = sasl_handshake(wire, "GSSAPI")
        assert answer.error_code == 33  # UNSUPPORTED_SASL_MECHANISM
        assert answer.mechanisms == MECHANISMS
        assert_closed(wire)


def test_a_request_before_authentication_closes_the_connection_and_api_versions_does_not(secured) -> None:
    with WireClient(address(secured, "SASL_PLAINTEXT")) as wire:
        assert wire.api_versions().error_code == 0
        assert_closed(wire)


def test_sasl_requests_on_a_listener_without_sasl_are_an_illegal_state(secured) -> None:
    with WireClient(address(secured, "PLAINTEXT")) as wire:
        assert sasl_handshake(wire, "PLAIN").error_code == 34  # ILLEGAL_SASL_STATE
        assert sasl_authenticate(wire, b"\x00a\x00b").error_code == 34
        assert wire.metadata(None).brokers  # the connection stays usable


# --- users --------------------------------------------------------------------------------------------------------


def test_users_come_from_add_user_and_survive_a_restart_and_the_ready_line_names_every_listener(
        tmp_path, certificates) -> None:
    data_dir = tmp_path / "broker"
    created = subprocess.run([sys.executable, "-m", "sparkeos", "broker", "add-user", "--data-dir", str(data_dir),
                              "bob", "--password", "bob-secret", "--mechanism", "SCRAM-SHA-512"],
                             capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    refused = subprocess.run([sys.executable, "-m", "sparkeos", "broker", "add-user", "--data-dir", str(data_dir),
                              "bob", "--password", "x", "--iterations", "10"], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "Iterations 10 is less than the minimum 4096" in refused.stderr
    arguments = ["--listeners", "SASL_SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0", "--ssl-certfile",
                 str(certificates["cert"]), "--ssl-keyfile", str(certificates["key"])]
    with BrokerProcess(data_dir, extra_args=arguments) as broker:
        assert set(broker.listeners) == {"SASL_SSL", "PLAINTEXT"}
        assert broker.bootstrap_servers == broker.listeners["SASL_SSL"]
        config = {"bootstrap.servers": broker.listeners["SASL_SSL"], "security.protocol": "SASL_SSL",
                  "ssl.ca.location": str(certificates["ca"]), "sasl.mechanism": "SCRAM-SHA-512",
                  "sasl.username": "bob", "sasl.password": "bob-secret"}
        assert round_trip(config, [b"before"]) == [b"before"]
        broker.restart()
        config["bootstrap.servers"] = broker.listeners["SASL_SSL"]
        assert round_trip(config, [b"after"]) == [b"after"]


def test_scram_credentials_are_altered_and_described_through_the_admin_api(secured, certificates) -> None:
    admin = AdminClient(librdkafka_config(secured, "SASL_SSL", certificates, "SCRAM-SHA-256"))
    upsert = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                          b"carol-secret")
    futures = admin.alter_user_scram_credentials([upsert])
    futures["carol"].result(30)
    carol = librdkafka_config(secured, "SASL_SSL", certificates, "SCRAM-SHA-512", user="carol",
                              password="carol-secret")
    assert round_trip(carol, [b"carol"]) == [b"carol"]
    described = admin.describe_user_scram_credentials(["carol", USER])
    infos = {user: sorted((i.mechanism, i.iterations) for i in f.result(30).scram_credential_infos)
             for user, f in described.items()}
    assert infos == {"carol": [(ScramMechanism.SCRAM_SHA_512, 8192)],
                     USER: [(ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 4096)]}
    too_few = UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"x")
    missing = UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256)
    errors = {}
    futures = admin.alter_user_scram_credentials([too_few, missing])
    for user, future in futures.items():
        with pytest.raises(KafkaException) as raised:
            future.result(30)
        errors[user] = raised.value.args[0].name()
    assert errors == {"dave": "UNACCEPTABLE_CREDENTIAL", "nobody": "RESOURCE_NOT_FOUND"}
    futures = admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)])
    futures["carol"].result(30)
    unknown = admin.describe_user_scram_credentials(["carol"])
    with pytest.raises(KafkaException) as raised:
        unknown["carol"].result(30)
    assert raised.value.args[0].name() == "RESOURCE_NOT_FOUND"
    # Gone for authentication too, and kept so across a restart of the store.
    assert "carol" not in CredentialStore(Path(secured.config.data_dir)).users

