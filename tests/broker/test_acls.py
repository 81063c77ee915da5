"""ACLs through real clients on a SASL_PLAINTEXT listener with the authorizer on: a principal may do exactly what
its ACLs allow (topics, groups, transactional ids, the cluster), a DENY wins, super users may do anything, and each
refusal carries Kafka's error; ACLs are created, described, deleted and kept across a restart; without the
authorizer the ACL APIs answer SECURITY_DISABLED."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.protocol.admin import DescribeAclsRequest, DescribeAclsResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from sparkeos.broker import EmbeddedBroker
from sparkeos.broker.credentials import CredentialStore, new_credential
from sparkeos.broker.listeners import parse_listeners
from support.wire import WireClient

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
EVERY = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                         AclPermissionType.ANY)


def start(data_dir: Path, **options) -> EmbeddedBroker:
    store = CredentialStore(data_dir)
    for user, password in USERS.items():
        store.put(user, new_credential("SCRAM-SHA-256", password))
    data_dir.mkdir(parents=True, exist_ok=True)
    store.save()
    return EmbeddedBroker(data_dir, listeners=parse_listeners("SASL_PLAINTEXT://127.0.0.1:0"), **options).start()


@pytest.fixture
def guarded(tmp_path: Path):
    broker = start(tmp_path / "broker", authorizer=True, super_users=("User:admin",))
    try:
        yield broker
    finally:
        broker.stop()


def client(broker: EmbeddedBroker, user: str, **extra) -> dict:
    return {"bootstrap.servers": broker.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": USERS[user], **extra}


def allow(resource_type, name: str, operation, principal: str = "User:alice",
          pattern=ResourcePatternType.LITERAL, permission=AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, "*", operation, permission)


def create_acls(broker: EmbeddedBroker, bindings: list[AclBinding]) -> None:
    admin = AdminClient(client(broker, "admin"))
    futures = admin.create_acls(bindings)
    for future in futures.values():
        future.result(30)


def authenticated(broker: EmbeddedBroker, user: str) -> WireClient:
    """A raw connection, authenticated as `user` (PLAIN)."""
    wire = WireClient(broker.bootstrap_servers)
    wire.request(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1)
    token = b"\x00%s\x00%s" % (user.encode(), USERS[user].encode())
    assert wire.request(SaslAuthenticateRequest(auth_bytes=token), SaslAuthenticateResponse, 1).error_code == 0
    return wire


def describe_acls_error(broker: EmbeddedBroker, user: str, resource_type: int = 1) -> int:
    """The error code of a DescribeAcls of everything (of `resource_type`), asked on the wire as `user`."""
    with authenticated(broker, user) as wire:
        answer = wire.request(DescribeAclsRequest(
            resource_type_filter=resource_type, resource_name_filter=None, pattern_type_filter=1,
            principal_filter=None, host_filter=None, operation=1, permission_type=1), DescribeAclsResponse, 1)
        return answer.error_code


def produce(config: dict, topic: str, values: list[bytes]) -> list[str]:
    """Delivery results: offsets as text, or the error's name."""
    results: list[str] = []
    producer = Producer({**config, "message.timeout.ms": 10000})
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=lambda error, message: results.append(
            error.name() if error else str(message.offset())))
    producer.flush(30)
    return results


def consume_first_error_or_values(config: dict, topic: str, group: str, count: int) -> list[bytes] | str:
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        while len(values) < count:
            message = consumer.poll(15)
            assert message is not None, f"nothing read from {topic} as group {group}"
            if message.error():
                return message.error().name()
            values.append(message.value())
    finally:
        consumer.close()
    return values


def test_a_principal_may_do_exactly_what_its_acls_allow(guarded) -> None:
    topic, other, group = f"orders-{uuid.uuid4().hex[:6]}", f"secret-{uuid.uuid4().hex[:6]}", "orders-readers"
    admin = AdminClient(client(guarded, "admin"))
    futures = admin.create_topics([NewTopic(topic, 1), NewTopic(other, 1)])
    for future in futures.values():
        future.result(30)
    create_acls(guarded, [
        allow(ResourceType.TOPIC, topic, AclOperation.WRITE),
        allow(ResourceType.TOPIC, topic, AclOperation.READ),
        allow(ResourceType.GROUP, group, AclOperation.READ),
        allow(ResourceType.TRANSACTIONAL_ID, "orders-tx-", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
    ])
    alice = client(guarded, "alice")
    assert produce(alice, topic, [b"one", b"two"]) == ["0", "1"]
    assert produce(alice, other, [b"no"]) == ["TOPIC_AUTHORIZATION_FAILED"]
    # A transactional id under the allowed prefix writes; another is refused.
    producer = Producer({**alice, "transactional.id": "orders-tx-1"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"three", partition=0)
    producer.commit_transaction(30)
    refused = Producer({**alice, "transactional.id": "elsewhere"})
    with pytest.raises(KafkaException) as raised:
        refused.init_transactions(15)
    assert raised.value.args[0].name() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    assert consume_first_error_or_values(alice, topic, group, 3) == [b"one", b"two", b"three"]
    assert consume_first_error_or_values(alice, topic, "another-group", 1) == "GROUP_AUTHORIZATION_FAILED"
    # Metadata shows alice the topic she may describe (READ and WRITE imply DESCRIBE), and not the other.
    listed = AdminClient(alice).list_topics(timeout=30).topics
    assert topic in listed and other not in listed
    # bob has no ACL: nothing.
    bob = client(guarded, "bob")
    assert produce(bob, topic, [b"bob"]) == ["TOPIC_AUTHORIZATION_FAILED"]
    assert consume_first_error_or_values(bob, topic, group, 1) in ("GROUP_AUTHORIZATION_FAILED",
                                                                  "TOPIC_AUTHORIZATION_FAILED")
    # A DENY wins over the ALLOW.
    create_acls(guarded, [allow(ResourceType.TOPIC, topic, AclOperation.READ, permission=AclPermissionType.DENY)])
    assert consume_first_error_or_values(alice, topic, group, 1) == "TOPIC_AUTHORIZATION_FAILED"
    # ACLs and credentials are the cluster's to change: alice may not.
    alice_admin = AdminClient(alice)  # held until the futures are done: a dropped client ends them
    grant = allow(ResourceType.TOPIC, other, AclOperation.READ)
    futures = alice_admin.create_acls([grant])
    with pytest.raises(KafkaException) as raised:
        futures[grant].result(30)
    assert raised.value.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED"
    # librdkafka shows DescribeAcls' error as an empty list (as it does Apache Kafka's): the answer itself says it.
    assert describe_acls_error(guarded, "alice") == 31  # CLUSTER_AUTHORIZATION_FAILED
    futures = alice_admin.create_topics([NewTopic("alice-made", 1)])
    with pytest.raises(KafkaException) as raised:
        futures["alice-made"].result(30)
    assert raised.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED"
    # The super user is never denied.
    assert produce(client(guarded, "admin"), other, [b"admin"]) == ["0"]


def test_acls_are_created_described_deleted_and_kept_across_a_restart(tmp_path) -> None:
    data_dir = tmp_path / "broker"
    bindings = [allow(ResourceType.TOPIC, "t", AclOperation.READ),
                allow(ResourceType.GROUP, "g-", AclOperation.ALL, pattern=ResourcePatternType.PREFIXED),
                allow(ResourceType.BROKER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE, principal="User:bob")]
    broker = start(data_dir, authorizer=True, super_users=("User:admin",))
    try:
        create_acls(broker, bindings)
        admin = AdminClient(client(broker, "admin"))
        assert sorted(map(str, admin.describe_acls(EVERY).result(30))) == sorted(map(str, bindings))
    finally:
        broker.stop()
    broker = start(data_dir, authorizer=True, super_users=("User:admin",))
    try:
        admin = AdminClient(client(broker, "admin"))
        assert len(admin.describe_acls(EVERY).result(30)) == 3
        only_alice = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None,
                                      AclOperation.ANY, AclPermissionType.ANY)
        futures = admin.delete_acls([only_alice])
        deleted = futures[only_alice].result(30)
        assert sorted(map(str, deleted)) == sorted(map(str, bindings[:2]))
        assert [str(b) for b in admin.describe_acls(EVERY).result(30)] == [str(bindings[2])]
        bad = AclBinding(ResourceType.BROKER, "not-the-cluster", ResourcePatternType.LITERAL, "User:x", "*",
                         AclOperation.ALTER, AclPermissionType.ALLOW)
        futures = admin.create_acls([bad])
        with pytest.raises(KafkaException) as raised:
            futures[bad].result(30)
        assert raised.value.args[0].name() == "INVALID_REQUEST"
    finally:
        broker.stop()


def test_without_the_authorizer_the_acl_apis_answer_security_disabled_and_everyone_may_do_anything(tmp_path):
    broker = start(tmp_path / "broker")
    try:
        bob = client(broker, "bob")
        bob_admin = AdminClient(bob)
        grant = allow(ResourceType.TOPIC, "t", AclOperation.READ)
        futures = bob_admin.create_acls([grant])
        with pytest.raises(KafkaException) as raised:
            futures[grant].result(30)
        assert raised.value.args[0].name() == "SECURITY_DISABLED"
        assert describe_acls_error(broker, "bob") == 54  # SECURITY_DISABLED
        assert produce(bob, "anything", [b"x"]) == ["0"]
        consumer = Consumer({**bob, "group.id": "any"})
        consumer.assign([TopicPartition("anything", 0, 0)])
        message = consumer.poll(15)
        consumer.close()
        assert message is not None and message.value() == b"x"
    finally:
        broker.stop()


def test_each_admin_operation_without_its_acl_gets_kafkas_error(guarded) -> None:
    topic, group = f"guarded-{uuid.uuid4().hex[:6]}", "guarded-group"
    admin = AdminClient(client(guarded, "admin"))
    futures = admin.create_topics([NewTopic(topic, 1)])
    futures[topic].result(30)
    assert produce(client(guarded, "admin"), topic, [b"x"]) == ["0"]
    # bob may see the topic (clients find its leader through Metadata first), and do nothing else to it.
    create_acls(guarded, [allow(ResourceType.TOPIC, topic, AclOperation.DESCRIBE, principal="User:bob")])
    bob = AdminClient(client(guarded, "bob"))

    def error_of(futures: dict) -> str:
        (future,) = futures.values()
        try:
            future.result(30)
        except KafkaException as exc:
            return exc.args[0].name()
        return "NO_ERROR"

    resource = ConfigResource(ResourceType.TOPIC, topic)
    seen = {
        "delete topic": error_of(bob.delete_topics([topic])),
        "create partitions": error_of(bob.create_partitions([NewPartitions(topic, 2)])),
        "describe configs": error_of(bob.describe_configs([resource])),
        "alter configs": error_of(bob.incremental_alter_configs([ConfigResource(
            ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(
                "retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])])),
        "delete records": error_of(bob.delete_records([TopicPartition(topic, 0, 1)])),
        "describe cluster configs": error_of(bob.describe_configs([ConfigResource(ResourceType.BROKER, "0")])),
        "delete group": error_of(bob.delete_consumer_groups([group])),
        "alter credentials": error_of(bob.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "mallory", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"secret")])),
    }
    assert seen == {
        "delete topic": "TOPIC_AUTHORIZATION_FAILED",
        "create partitions": "TOPIC_AUTHORIZATION_FAILED",
        "describe configs": "TOPIC_AUTHORIZATION_FAILED",
        "alter configs": "TOPIC_AUTHORIZATION_FAILED",
        "delete records": "TOPIC_AUTHORIZATION_FAILED",
        "describe cluster configs": "CLUSTER_AUTHORIZATION_FAILED",
        "delete group": "GROUP_AUTHORIZATION_FAILED",
        "alter credentials": "CLUSTER_AUTHORIZATION_FAILED",
    }
    # Nothing of it happened: the topic, its record and its config are as they were.
    assert len(admin.list_topics(topic, timeout=30).topics[topic].partitions) == 1
    config = admin.describe_configs([resource])[resource].result(30)
    assert config["retention.ms"].value == "604800000"
    # An idempotent producer needs IDEMPOTENT_WRITE on the cluster, or WRITE on some topic: bob has neither.
    producer = Producer({**client(guarded, "bob"), "enable.idempotence": True, "message.timeout.ms": 10000})
    # librdkafka asks for a producer id as it starts, and raises the refusal as a fatal error.
    with pytest.raises(KafkaException) as raised:
        for _ in range(150):
            producer.poll(0.2)
    assert raised.value.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED"


def test_a_principal_that_may_write_a_topic_cannot_write_into_another_producers_transaction(guarded) -> None:
    """Transactional batches need the transactional id, and the principal's WRITE on it: a batch that names
    another producer's id and epoch, and no transactional id, is refused rather than added to its transaction."""
    topic = f"shared-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(client(guarded, "admin"))
    futures = admin.create_topics([NewTopic(topic, 1)])
    futures[topic].result(30)
    create_acls(guarded, [allow(ResourceType.TOPIC, topic, AclOperation.WRITE, principal="User:bob")])
    owner = Producer({**client(guarded, "admin"), "transactional.id": "owned"})
    owner.init_transactions(30)
    owner.begin_transaction()
    owner.produce(topic, b"the owner's", partition=0)
    owner.flush(30)
    with authenticated(guarded, "admin") as wire:
        (batch,) = [b for b in wire.log_batches(topic) if not b.control]
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                        producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
                                        base_sequence=1, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=None, value=b"bob's", headers=[])
    with authenticated(guarded, "bob") as wire:
        answer = wire.produce(topic, 0, bytes(builder.build()))
    assert answer.error_code == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    owner.commit_transaction(30)
    assert consume_first_error_or_values(client(guarded, "admin"), topic, "reader", 1) == [b"the owner's"]


def test_an_acl_filter_kafka_refuses_is_an_invalid_request(guarded) -> None:
    assert describe_acls_error(guarded, "admin", resource_type=0) == 42  # INVALID_REQUEST: UNKNOWN resource type


def test_metadata_reports_the_operations_a_principal_may_do_to_the_cluster_and_each_topic(guarded) -> None:
    """KIP-430: what describe_cluster and describe_topics report with include_authorized_operations (Metadata v8+),
    as AdminClient users and confluent-kafka-python's own tests of describe operations read it."""
    from confluent_kafka import TopicCollection

    admin = AdminClient(client(guarded, "admin"))
    topic = f"operations-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    create_acls(guarded, [allow(ResourceType.TOPIC, topic, AclOperation.READ),
                          allow(ResourceType.BROKER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE)])
    alice = AdminClient(client(guarded, "alice"))

    def operations(admin_client: AdminClient) -> tuple[set, set]:
        cluster = admin_client.describe_cluster(include_authorized_operations=True).result(30)
        topics = admin_client.describe_topics(TopicCollection([topic]), include_authorized_operations=True)
        return set(cluster.authorized_operations), set(topics[topic].result(30).authorized_operations)

    cluster, on_topic = operations(alice)
    assert cluster == {AclOperation.IDEMPOTENT_WRITE}
    # READ implies DESCRIBE, as it does for the authorizer's decisions.
    assert on_topic == {AclOperation.READ, AclOperation.DESCRIBE}
    cluster, on_topic = operations(admin)
    assert cluster == {AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.CLUSTER_ACTION,
                       AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE}
    assert on_topic == {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
                        AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
                        AclOperation.ALTER_CONFIGS}
