"""Admin APIs through real admin clients: topics, partitions, configs, record deletion.

Error codes are Kafka's; every advertised version of every admin API is exercised on the wire.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from sparkeos.broker import EmbeddedBroker
from sparkeos.broker.storage.topics import TOPIC_CONFIG_DEFAULTS
from support.wire import WireClient

TIMEOUT = 15.0
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
UNKNOWN_TOPIC_ID = 100


# -- helpers -------------------------------------------------------------------------------------


def admin(broker: EmbeddedBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


def error_code(future: Any) -> int:
    exc = future.exception(timeout=TIMEOUT)
    if exc is None:
        return 0
    assert isinstance(exc, KafkaException), exc
    return exc.args[0].code()


def create(client: AdminClient, *topics: NewTopic, validate_only: bool = False) -> dict[str, int]:
    futures = client.create_topics(list(topics), operation_timeout=10, validate_only=validate_only)
    return {name: error_code(f) for name, f in futures.items()}


def partition_count(client: AdminClient, topic: str) -> int | None:
    found = client.list_topics(timeout=TIMEOUT).topics.get(topic)
    return None if found is None or found.error is not None else len(found.partitions)


def describe(client: AdminClient, resource: ConfigResource) -> dict[str, ConfigEntry]:
    return client.describe_configs([resource])[resource].result(timeout=TIMEOUT)


def produce_values(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), partition=partition)
    assert producer.flush(TIMEOUT) == 0


def first_poll(bootstrap: str, topic: str, offset: int, reset: str) -> Any:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": reset, "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                return message
        raise AssertionError(f"nothing consumed from {topic} at offset {offset}")
    finally:
        consumer.close()


# -- topics ----------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_create_describe_alter_delete_topic(broker: EmbeddedBroker, topic_name: str) -> None:
    client = admin(broker)
    assert create(client, NewTopic(topic_name, 3, config={"retention.ms": "3600000"})) == {topic_name: 0}
    assert partition_count(client, topic_name) == 3
    first_id = broker.broker.store.get(topic_name).topic_id

    configs = describe(client, ConfigResource(ResourceType.TOPIC, topic_name))
    assert set(configs) == set(TOPIC_CONFIG_DEFAULTS)
    retention = configs["retention.ms"]
    assert retention.value == "3600000" and retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not retention.is_default and not retention.is_read_only and not retention.is_sensitive
    assert "log.retention.ms" in retention.synonyms
    segment = configs["segment.bytes"]
    assert segment.value == "1073741824" and segment.source == ConfigSource.DEFAULT_CONFIG.value and segment.is_default

    resource = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("segment.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    assert error_code(client.incremental_alter_configs([resource])[resource]) == 0
    configs = describe(client, ConfigResource(ResourceType.TOPIC, topic_name))
    assert configs["segment.bytes"].value == "1048576"
    assert configs["segment.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["retention.ms"].value == "604800000" and configs["retention.ms"].is_default
    assert broker.broker.store.partition(topic_name, 2).config.segment_bytes == 1048576

    bad = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)])
    assert error_code(client.incremental_alter_configs([bad])[bad]) == INVALID_CONFIG
    # The legacy AlterConfigs replaces every topic config: segment.bytes returns to its default.
    legacy = ConfigResource(ResourceType.TOPIC, topic_name, set_config={"cleanup.policy": "compact,delete"})
    assert error_code(client.alter_configs([legacy])[legacy]) == 0
    configs = describe(client, ConfigResource(ResourceType.TOPIC, topic_name))
    assert configs["cleanup.policy"].value == "compact,delete" and configs["segment.bytes"].is_default

    assert error_code(client.delete_topics([topic_name], operation_timeout=10)[topic_name]) == 0
    assert partition_count(client, topic_name) is None
    assert not list(Path(broker.config.data_dir).glob(f"topics/{topic_name}-*"))
    assert create(client, NewTopic(topic_name, 1)) == {topic_name: 0}
    assert broker.broker.store.get(topic_name).topic_id != first_id
    assert partition_count(client, topic_name) == 1


@pytest.mark.parametrize("name", ["", ".", "..", "x" * 250, "bad/name", "spa ce", "ümlaut"])
def test_create_topic_invalid_names(broker: EmbeddedBroker, name: str) -> None:
    assert create(admin(broker), NewTopic(name, 1)) == {name: INVALID_TOPIC_EXCEPTION}
    assert broker.broker.store.get(name) is None


def test_create_topic_errors(broker: EmbeddedBroker, topic_name: str) -> None:
    client = admin(broker)
    longest = "y" * 249
    results = create(
        client,
        NewTopic(topic_name, 2),
        NewTopic(longest, 1),
        NewTopic(f"{topic_name}-rf3", 1, 3),
        NewTopic(f"{topic_name}-default", -1, -1),
        NewTopic(f"{topic_name}-unknown-config", 1, config={"no.such.config": "1"}),
        NewTopic(f"{topic_name}-bad-value", 1, config={"retention.bytes": "lots"}),
        NewTopic(f"{topic_name}-tiny-segment", 1, config={"segment.bytes": "2"}),
        NewTopic(f"{topic_name}-manual", 3, replica_assignment=[[0], [0], [0]]),
        NewTopic(f"{topic_name}-other-broker", 1, replica_assignment=[[1]]),
        NewTopic(f"{topic_name}-two-replicas", 1, replica_assignment=[[0, 0]]),
    )
    assert results == {
        topic_name: 0,
        longest: 0,
        f"{topic_name}-rf3": INVALID_REPLICATION_FACTOR,
        f"{topic_name}-default": 0,
        f"{topic_name}-unknown-config": INVALID_CONFIG,
        f"{topic_name}-bad-value": INVALID_CONFIG,
        f"{topic_name}-tiny-segment": INVALID_CONFIG,
        f"{topic_name}-manual": 0,
        f"{topic_name}-other-broker": INVALID_REPLICA_ASSIGNMENT,
        f"{topic_name}-two-replicas": INVALID_REPLICA_ASSIGNMENT,
    }
    assert partition_count(client, f"{topic_name}-default") == broker.config.num_partitions
    assert partition_count(client, f"{topic_name}-manual") == 3
    assert create(client, NewTopic(topic_name, 5)) == {topic_name: TOPIC_ALREADY_EXISTS}
    assert partition_count(client, topic_name) == 2
    # Names that differ only by '.' and '_' collide, as in Kafka.
    assert create(client, NewTopic(f"{topic_name}.dot", 1)) == {f"{topic_name}.dot": 0}
    assert create(client, NewTopic(f"{topic_name}_dot", 1)) == {f"{topic_name}_dot": INVALID_TOPIC_EXCEPTION}
    # librdkafka refuses these counts itself; kafka-python sends them.
    from kafka.admin import KafkaAdminClient

    kafka_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, request_timeout_ms=10000)
    try:
        result = kafka_admin.create_topics({
            f"{topic_name}-zero": {"num_partitions": 0},
            f"{topic_name}-negative": {"num_partitions": -5},
            f"{topic_name}-rf0": {"num_partitions": 1, "replication_factor": 0},
            f"{topic_name}-rf-negative": {"num_partitions": 1, "replication_factor": -3},
        }, raise_errors=False)
        assert {t["name"]: t["error_code"] for t in result["topics"]} == {
            f"{topic_name}-zero": INVALID_PARTITIONS,
            f"{topic_name}-negative": INVALID_PARTITIONS,
            f"{topic_name}-rf0": INVALID_REPLICATION_FACTOR,
            f"{topic_name}-rf-negative": INVALID_REPLICATION_FACTOR,
        }
    finally:
        kafka_admin.close()
    # validate_only answers like a real creation but creates nothing.
    assert create(client, NewTopic(f"{topic_name}-dry", 4), validate_only=True) == {f"{topic_name}-dry": 0}
    assert create(client, NewTopic(topic_name, 1), validate_only=True) == {topic_name: TOPIC_ALREADY_EXISTS}
    assert broker.broker.store.get(f"{topic_name}-dry") is None
    assert partition_count(client, f"{topic_name}-dry") is None
    # The longest legal name can be deleted too (its directories stay within file name limits).
    assert error_code(client.delete_topics([longest], operation_timeout=10)[longest]) == 0
    assert broker.broker.store.get(longest) is None


def test_delete_topic_errors_and_delete_by_id(broker: EmbeddedBroker, topic_name: str) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.errors import UnknownTopicIdError

    client = admin(broker)
    assert error_code(client.delete_topics([topic_name], operation_timeout=10)[topic_name]) == (
        UNKNOWN_TOPIC_OR_PARTITION)
    assert create(client, NewTopic(topic_name, 1)) == {topic_name: 0}
    topic_id = broker.broker.store.get(topic_name).topic_id
    kafka_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, request_timeout_ms=10000)
    try:
        with pytest.raises(UnknownTopicIdError):
            kafka_admin.delete_topics([uuid.uuid4()])
        result = kafka_admin.delete_topics([topic_id])
        assert [(t["name"], t["error_code"]) for t in result["topics"]] == [(topic_name, 0)]
    finally:
        kafka_admin.close()
    assert broker.broker.store.get(topic_name) is None


def test_delete_topics_wire_errors(broker: EmbeddedBroker, topic_name: str) -> None:
    wire = WireClient(broker.bootstrap_servers)
    try:
        State = DeleteTopicsRequest.DeleteTopicState
        response = wire.request(DeleteTopicsRequest(topics=[
            State(name=None, topic_id=uuid.uuid4()),
            State(name="a", topic_id=uuid.uuid4()),
            State(name="dup", topic_id=uuid.UUID(int=0)),
            State(name="dup", topic_id=uuid.UUID(int=0)),
        ], timeout_ms=1000), DeleteTopicsResponse, 6)
        assert [r.error_code for r in response.responses] == [UNKNOWN_TOPIC_ID, INVALID_REQUEST, INVALID_REQUEST,
                                                              INVALID_REQUEST]
        Topic = CreateTopicsRequest.CreatableTopic
        response = wire.request(CreateTopicsRequest(topics=[
            Topic(name=topic_name, num_partitions=1, replication_factor=1, assignments=[], configs=[]),
            Topic(name=topic_name, num_partitions=1, replication_factor=1, assignments=[], configs=[]),
        ], timeout_ms=1000, validate_only=False), CreateTopicsResponse, 7)
        assert [t.error_code for t in response.topics] == [INVALID_REQUEST, INVALID_REQUEST]
        assert broker.broker.store.get(topic_name) is None
    finally:
        wire.close()


# -- partitions --------------------------------------------------------------------------------------


def test_create_partitions(broker: EmbeddedBroker, topic_name: str) -> None:
    client = admin(broker)
    assert create(client, NewTopic(topic_name, 1)) == {topic_name: 0}

    def grow(count: int, assignment: list[list[int]] | None = None, validate_only: bool = False) -> int:
        wanted = NewPartitions(topic_name, count)
        if assignment is not None:
            wanted = NewPartitions(topic_name, count, assignment)
        futures = client.create_partitions([wanted], validate_only=validate_only, operation_timeout=10)
        return error_code(futures[topic_name])

    assert grow(4, validate_only=True) == 0
    assert partition_count(client, topic_name) == 1
    assert grow(3) == 0
    assert partition_count(client, topic_name) == 3
    assert grow(3) == INVALID_PARTITIONS
    assert grow(2) == INVALID_PARTITIONS
    assert grow(5, [[1], [0]]) == INVALID_REPLICA_ASSIGNMENT
    assert grow(5, [[0], [0]]) == 0
    assert partition_count(client, topic_name) == 5
    missing = client.create_partitions([NewPartitions(f"{topic_name}-missing", 2)], operation_timeout=10)
    assert error_code(missing[f"{topic_name}-missing"]) == UNKNOWN_TOPIC_OR_PARTITION

    produce_values(broker.bootstrap_servers, topic_name, 3, partition=4)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "g", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic_name, 4, 0)])
        got = consumer.consume(3, timeout=TIMEOUT)
        assert [m.value() for m in got] == [b"v0", b"v1", b"v2"]
    finally:
        consumer.close()


# -- configs -------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_describe_broker_configs(tmp_path: Path, topic_name: str) -> None:
    with EmbeddedBroker(tmp_path / "broker", num_partitions=3, transaction_max_timeout_ms=3_600_000,
                        topic_defaults={"retention.ms": "7200000"}) as broker:
        client = admin(broker)
        configs = describe(client, ConfigResource(ResourceType.BROKER, "0"))
        values = {name: entry.value for name, entry in configs.items()}
        assert values["transaction.max.timeout.ms"] == "3600000"
        assert configs["transaction.max.timeout.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
        assert values["transactional.id.expiration.ms"] == "604800000"
        assert configs["transactional.id.expiration.ms"].is_default
        assert values["num.partitions"] == "3"
        assert values["auto.create.topics.enable"] == "true"
        assert values["broker.id"] == "0"
        assert values["default.replication.factor"] == "1" and values["min.insync.replicas"] == "1"
        assert values["socket.request.max.bytes"] == "104857600"
        assert values["offsets.retention.minutes"] == "10080"
        assert values["group.initial.rebalance.delay.ms"] == "0"
        assert values["log.retention.ms"] == "7200000"
        assert values["log.segment.bytes"] == "1073741824"
        assert values["message.max.bytes"] == "1048588"
        assert all(entry.is_read_only for entry in configs.values())

        # A topic inherits the broker's static retention.ms.
        assert create(client, NewTopic(topic_name, 1)) == {topic_name: 0}
        retention = describe(client, ConfigResource(ResourceType.TOPIC, topic_name))["retention.ms"]
        assert retention.value == "7200000" and retention.source == ConfigSource.STATIC_BROKER_CONFIG.value

        for resource, code in [
            (ConfigResource(ResourceType.TOPIC, f"{topic_name}-missing"), UNKNOWN_TOPIC_OR_PARTITION),
            (ConfigResource(ResourceType.TOPIC, "bad/name"), INVALID_TOPIC_EXCEPTION),
        ]:
            future = client.describe_configs([resource])[resource]
            assert error_code(future) == code, resource
        # Clients send a broker's resources to that broker, so another id only arrives on the wire.
        wire = WireClient(broker.bootstrap_servers)
        try:
            Resource = DescribeConfigsRequest.DescribeConfigsResource
            response = wire.request(DescribeConfigsRequest(resources=[
                Resource(resource_type=4, resource_name="1", configuration_keys=None),
                Resource(resource_type=4, resource_name="zero", configuration_keys=None),
                Resource(resource_type=4, resource_name="0", configuration_keys=["broker.id", "no.such.key"]),
                Resource(resource_type=99, resource_name="0", configuration_keys=None),
            ], include_synonyms=False), DescribeConfigsResponse, 4)
            assert [r.error_code for r in response.results] == [INVALID_REQUEST, INVALID_REQUEST, 0, INVALID_REQUEST]
            assert [(c.name, c.value) for c in response.results[2].configs] == [("broker.id", "0")]
        finally:
            wire.close()
        change = ConfigResource(ResourceType.BROKER, "0", set_config={"num.partitions": "5"})
        assert error_code(client.alter_configs([change])[change]) == INVALID_REQUEST


def test_kafka_python_admin_client(broker: EmbeddedBroker, topic_name: str) -> None:
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, request_timeout_ms=10000)
    try:
        result = client.create_topics({topic_name: {"num_partitions": 2, "configs": {"retention.bytes": "123456"}}})
        [created] = result["topics"]
        assert created["error_code"] == 0 and created["num_partitions"] == 2 and created["replication_factor"] == 1
        assert created["topic_id"] == str(broker.broker.store.get(topic_name).topic_id)
        assert created["configs"]["retention.bytes"] == {"value": "123456", "read_only": False,
                                                         "config_source": "DYNAMIC_TOPIC_CONFIG",
                                                         "is_sensitive": False}
        assert created["configs"]["retention.ms"]["config_source"] == "DEFAULT_CONFIG"
        with pytest.raises(TopicAlreadyExistsError):
            client.create_topics({topic_name: {"num_partitions": 1}})
        described = client.describe_configs([KConfigResource(ConfigResourceType.TOPIC, topic_name)],
                                            config_filter="all")
        topic_configs = described["topic"][topic_name]
        assert topic_configs["retention.bytes"]["value"] == "123456"
        assert topic_configs["segment.ms"]["value"] == "604800000"
        broker_configs = client.describe_configs([KConfigResource(ConfigResourceType.BROKER, "0")],
                                                 config_filter="all")["broker"]["0"]
        assert broker_configs["transaction.max.timeout.ms"]["value"] == "900000"
        deleted = client.delete_topics([topic_name])
        assert [(t["name"], t["error_code"]) for t in deleted["topics"]] == [(topic_name, 0)]
        assert broker.broker.store.get(topic_name) is None
    finally:
        client.close()


# -- records ---------------------------------------------------------------------------------------------


def test_delete_records(broker: EmbeddedBroker, topic_name: str) -> None:
    client = admin(broker)
    assert create(client, NewTopic(topic_name, 1)) == {topic_name: 0}
    produce_values(broker.bootstrap_servers, topic_name, 100)

    def delete(offset: int, partition: int = 0) -> Any:
        tp = TopicPartition(topic_name, partition, offset)
        future = client.delete_records([tp], operation_timeout=10)[tp]
        return error_code(future) or future.result().low_watermark

    assert delete(40) == 40
    assert delete(10) == 40  # the log start never moves back
    assert delete(101) == KafkaError.OFFSET_OUT_OF_RANGE

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "wm"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=TIMEOUT) == (40, 100)
    finally:
        consumer.close()
    reset_error = first_poll(broker.bootstrap_servers, topic_name, 10, "error")
    assert reset_error.error() is not None and reset_error.error().code() == KafkaError._AUTO_OFFSET_RESET
    message = first_poll(broker.bootstrap_servers, topic_name, 10, "earliest")
    assert message.error() is None and (message.offset(), message.value()) == (40, b"v40")

    assert delete(-1) == 100
    produce_values(broker.bootstrap_servers, topic_name, 1)
    message = first_poll(broker.bootstrap_servers, topic_name, 5, "earliest")
    assert (message.offset(), message.value()) == (100, b"v0")


# -- auto-creation -----------------------------------------------------------------------------------------


def metadata_errors(wire: WireClient, topic: str, allow_auto_create: bool) -> tuple[int, int]:
    """(error code, partition count) of `topic` in a Metadata v4 answer."""
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                              allow_auto_topic_creation=allow_auto_create)
    [answer] = wire.request(request, MetadataResponse, 4).topics
    return answer.error_code, len(answer.partitions)


def raw_produce(wire: WireClient, topic: str) -> int:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=None, value=b"x", headers=[])
    TopicData = ProduceRequest.TopicProduceData
    request = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
        TopicData(name=topic, partition_data=[TopicData.PartitionProduceData(index=0, records=bytes(builder.build()))])
    ])
    return wire.request(request, ProduceResponse, 8).responses[0].partition_responses[0].error_code


def test_no_auto_create_topics(tmp_path: Path, topic_name: str) -> None:
    with EmbeddedBroker(tmp_path / "broker", auto_create_topics=False) as broker:
        wire = WireClient(broker.bootstrap_servers)
        try:
            assert raw_produce(wire, topic_name) == UNKNOWN_TOPIC_OR_PARTITION
            assert metadata_errors(wire, topic_name, allow_auto_create=True) == (UNKNOWN_TOPIC_OR_PARTITION, 0)
        finally:
            wire.close()
        errors: list[int] = []
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "message.timeout.ms": 3000,
                             "topic.metadata.propagation.max.ms": 500})
        producer.produce(topic_name, b"lost", on_delivery=lambda err, msg: errors.append(err.code() if err else 0))
        producer.flush(TIMEOUT)
        assert errors == [KafkaError.UNKNOWN_TOPIC_OR_PART]
        client = admin(broker)
        metadata = client.list_topics(topic_name, timeout=TIMEOUT).topics[topic_name]
        assert metadata.error is not None and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        assert broker.broker.store.get(topic_name) is None
        assert partition_count(client, topic_name) is None
        # Explicit creation still works.
        assert create(client, NewTopic(topic_name, -1)) == {topic_name: 0}
        assert partition_count(client, topic_name) == 1


def test_auto_create_topics_on_metadata(tmp_path: Path, topic_name: str) -> None:
    with EmbeddedBroker(tmp_path / "broker", num_partitions=3) as broker:
        wire = WireClient(broker.bootstrap_servers)
        try:
            assert metadata_errors(wire, topic_name, allow_auto_create=False) == (UNKNOWN_TOPIC_OR_PARTITION, 0)
            assert broker.broker.store.get(topic_name) is None
            assert metadata_errors(wire, topic_name, allow_auto_create=True) == (0, 3)
            assert metadata_errors(wire, "bad/name", allow_auto_create=True) == (INVALID_TOPIC_EXCEPTION, 0)
        finally:
            wire.close()
        assert partition_count(admin(broker), topic_name) == 3


# -- every advertised version ---------------------------------------------------------------------------------


def test_every_advertised_admin_version(broker: EmbeddedBroker, topic_name: str) -> None:
    wire = WireClient(broker.bootstrap_servers)
    try:
        ranges = {a.api_key: (a.min_version, a.max_version)
                  for a in wire.request(ApiVersionsRequest(), ApiVersionsResponse, 0).api_keys}
        assert {key: ranges[key] for key in (19, 20, 21, 32, 33, 37, 44)} == {
            19: (0, 7), 20: (0, 6), 21: (0, 2), 32: (0, 4), 33: (0, 2), 37: (0, 3), 44: (0, 1)}
        store = broker.broker.store
        names = [f"{topic_name}-v{v}" for v in range(8)]

        Creatable = CreateTopicsRequest.CreatableTopic
        for v, name in enumerate(names):
            config = Creatable.CreatableTopicConfig(name="retention.bytes", value=str(1000 + v))
            [result] = wire.request(CreateTopicsRequest(topics=[Creatable(
                name=name, num_partitions=2, replication_factor=1, assignments=[], configs=[config])],
                timeout_ms=5000, validate_only=False), CreateTopicsResponse, v).topics
            assert (result.name, result.error_code) == (name, 0), v
            assert store.get(name).configs == {"retention.bytes": str(1000 + v)}
            if v >= 5:
                assert (result.num_partitions, result.replication_factor) == (2, 1)
                assert {c.name: c.value for c in result.configs}["retention.bytes"] == str(1000 + v)
            if v >= 7:
                assert result.topic_id == store.get(name).topic_id

        Grow = CreatePartitionsRequest.CreatePartitionsTopic
        for v in range(4):
            [result] = wire.request(CreatePartitionsRequest(topics=[Grow(name=names[v], count=3, assignments=None)],
                                                            timeout_ms=5000, validate_only=False),
                                    CreatePartitionsResponse, v).results
            assert result.error_code == 0 and len(store.get(names[v]).partitions) == 3, v

        Delete = DeleteRecordsRequest.DeleteRecordsTopic
        for v in range(3):
            assert raw_produce(wire, names[v]) == 0
            assert raw_produce(wire, names[v]) == 0
            [topic] = wire.request(DeleteRecordsRequest(topics=[Delete(name=names[v], partitions=[
                Delete.DeleteRecordsPartition(partition_index=0, offset=1),
                Delete.DeleteRecordsPartition(partition_index=9, offset=0),
                Delete.DeleteRecordsPartition(partition_index=1, offset=5),
            ])], timeout_ms=5000), DeleteRecordsResponse, v).topics
            assert [(p.partition_index, p.error_code, p.low_watermark) for p in topic.partitions] == [
                (0, 0, 1), (9, UNKNOWN_TOPIC_OR_PARTITION, -1), (1, 1, -1)], v
            assert store.partition(names[v], 0).log_start_offset == 1

        Resource = DescribeConfigsRequest.DescribeConfigsResource
        for v in range(5):
            [result] = wire.request(DescribeConfigsRequest(resources=[
                Resource(resource_type=2, resource_name=names[v], configuration_keys=None)],
                include_synonyms=True, include_documentation=False), DescribeConfigsResponse, v).results
            configs = {c.name: c for c in result.configs}
            assert result.error_code == 0 and set(configs) == set(TOPIC_CONFIG_DEFAULTS), v
            assert configs["retention.bytes"].value == str(1000 + v)
            if v == 0:
                assert configs["segment.bytes"].is_default and not configs["retention.bytes"].is_default
            else:
                assert (configs["retention.bytes"].config_source, configs["segment.bytes"].config_source) == (1, 5)
                assert [(s.name, s.source) for s in configs["retention.bytes"].synonyms] == [
                    ("retention.bytes", 1), ("log.retention.bytes", 5)]
            if v >= 3:
                assert (configs["retention.bytes"].config_type, configs["cleanup.policy"].config_type) == (5, 7)

        AlterResource = AlterConfigsRequest.AlterConfigsResource
        for v in range(3):
            [result] = wire.request(AlterConfigsRequest(resources=[AlterResource(
                resource_type=2, resource_name=names[v],
                configs=[AlterResource.AlterableConfig(name="retention.ms", value=str(60000 + v))])],
                validate_only=False), AlterConfigsResponse, v).responses
            assert result.error_code == 0 and store.get(names[v]).configs == {"retention.ms": str(60000 + v)}, v

        IncResource = IncrementalAlterConfigsRequest.AlterConfigsResource
        Change = IncResource.AlterableConfig
        for v in range(2):
            [result] = wire.request(IncrementalAlterConfigsRequest(resources=[IncResource(
                resource_type=2, resource_name=names[v], configs=[
                    Change(name="cleanup.policy", config_operation=2, value="compact"),
                    Change(name="retention.ms", config_operation=1, value=None),
                ])], validate_only=False), IncrementalAlterConfigsResponse, v).responses
            assert result.error_code == 0 and store.get(names[v]).configs == {"cleanup.policy": "delete,compact"}, v
            [result] = wire.request(IncrementalAlterConfigsRequest(resources=[IncResource(
                resource_type=2, resource_name=names[v], configs=[
                    Change(name="segment.bytes", config_operation=2, value="1")])], validate_only=False),
                IncrementalAlterConfigsResponse, v).responses
            assert result.error_code == INVALID_CONFIG

        State = DeleteTopicsRequest.DeleteTopicState
        for v in range(7):
            name = names[v]
            if v >= 6:
                request = DeleteTopicsRequest(topics=[State(name=None, topic_id=store.get(name).topic_id)],
                                              timeout_ms=5000)
            else:
                request = DeleteTopicsRequest(topic_names=[name], timeout_ms=5000)
            [result] = wire.request(request, DeleteTopicsResponse, v).responses
            assert (result.name, result.error_code) == (name, 0), v
            assert store.get(name) is None
    finally:
        wire.close()
