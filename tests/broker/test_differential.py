"""The embedded broker against Apache Kafka, its oracle: the same client scenarios on both, comparing what the client
observes.

Each scenario drives confluent-kafka (the connectors' client) against one bootstrap address and returns what it saw:
values and offsets read at each isolation level, last stable offsets and high watermarks, the error codes of
fenced, refused and failed calls, committed group offsets, offsets found by timestamp, topic configs. The test runs
it on a fresh embedded broker and on a shared Apache Kafka node of each tested version and asserts both
observations equal. Names of topics, groups and transactional ids are the scenario's own, so they are left out of
what is compared. A difference is fixed in the broker, or listed in docs/broker.md and normalised here where the
scenario says so.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from sparkeos.verify import READ_COMMITTED, READ_UNCOMMITTED, end_offsets, read_records
from support import apache_kafka
from support.crash import wait_until_stable
from support.spark import create_topic, wait_for
from support.wire import WireClient

Observation = dict[str, object]


def _name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:10]}"


def _error_name(call: Callable[[], object]) -> str:
    try:
        call()
    except KafkaException as exc:
        return exc.args[0].name()
    return "NO_ERROR"


def _one(futures: dict) -> object:
    """The result of the only future of an admin call. The dict is held until then: a future whose dict was
    dropped never completed (confluent-kafka 2.16)."""
    (future,) = futures.values()
    return future.result(30)


def _ends(bootstrap: str, topic: str) -> tuple[int, int]:
    """Partition 0's (last stable offset, high watermark)."""
    return end_offsets(bootstrap, topic)[0], end_offsets(bootstrap, topic, isolation_level=READ_UNCOMMITTED)[0]


def _read(bootstrap: str, topic: str, isolation_level: str) -> list[tuple[int, str]]:
    """(offset, value) of every record a fresh reader at `isolation_level` reads up to the partition's end."""
    return [(record.offset, record.value.decode())
            for record in read_records(bootstrap, topic, isolation_level=isolation_level)]


def _stable_end(bootstrap: str, topic: str) -> int:
    """Partition 0's end once no transaction is open on it (Kafka writes the markers after it answers EndTxn)."""
    return wait_until_stable(bootstrap, topic)[0]


def _transactional(bootstrap: str, transactional_id: str | None = None, **config) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id or _name("txn"),
                         **config})
    producer.init_transactions(30)
    return producer


# --- scenarios ---------------------------------------------------------------------------------------------------


def transactions_with_aborts(bootstrap: str) -> Observation:
    topic = _name("aborts")
    create_topic(bootstrap, topic)
    producer = _transactional(bootstrap)
    for values, commit in ((["a0", "a1"], True), (["b0"], False), (["c0", "c1", "c2"], True)):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value.encode(), partition=0)
        producer.flush(30)
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    plain.produce(topic, b"p0", partition=0)
    plain.flush(30)
    end = _stable_end(bootstrap, topic)
    return {"ends": (end, end), "read_committed": _read(bootstrap, topic, READ_COMMITTED),
            "read_uncommitted": _read(bootstrap, topic, READ_UNCOMMITTED)}


def open_transaction_holds_the_last_stable_offset(bootstrap: str) -> Observation:
    topic = _name("open")
    create_topic(bootstrap, topic)
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, b"before", partition=0)
    plain.flush(30)
    producer = _transactional(bootstrap)
    producer.begin_transaction()
    producer.produce(topic, b"o0", partition=0)
    producer.produce(topic, b"o1", partition=0)
    producer.flush(30)
    plain.produce(topic, b"after", partition=0)
    plain.flush(30)
    while_open = _ends(bootstrap, topic)
    committed_while_open = _read(bootstrap, topic, READ_COMMITTED)
    producer.commit_transaction(30)
    end = _stable_end(bootstrap, topic)
    return {"ends while open": while_open, "read_committed while open": committed_while_open,
            "ends after": (end, end), "read_committed after": _read(bootstrap, topic, READ_COMMITTED)}


def a_fenced_producer_cannot_commit(bootstrap: str) -> Observation:
    topic = _name("fence")
    create_topic(bootstrap, topic)
    transactional_id = _name("zombie")
    zombie = _transactional(bootstrap, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", partition=0)
    zombie.flush(30)
    successor = _transactional(bootstrap, transactional_id)
    try:
        zombie.commit_transaction(30)
        zombie_commit = "NO_ERROR"
    except KafkaException as exc:
        error = exc.args[0]
        zombie_commit = (error.name(), error.fatal(), error.txn_requires_abort())
    successor.begin_transaction()
    successor.produce(topic, b"successor", partition=0)
    successor.commit_transaction(30)
    end = _stable_end(bootstrap, topic)
    return {"zombie commit": zombie_commit, "ends": (end, end),
            "read_committed": [value for _, value in _read(bootstrap, topic, READ_COMMITTED)]}


def transactional_group_offsets_wait_for_the_commit(bootstrap: str) -> Observation:
    """KIP-447: a read_committed consumer's OffsetFetch waits while a transaction holds offsets of its group."""
    topic, group = _name("offsets"), _name("group")
    create_topic(bootstrap, topic)
    plain = Producer({"bootstrap.servers": bootstrap})
    for value in (b"x0", b"x1", b"x2"):
        plain.produce(topic, value, partition=0)
    plain.flush(30)
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    member.assign([TopicPartition(topic, 0, 0)])
    producer = _transactional(bootstrap)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 2)], member.consumer_group_metadata(), 30)

    def committed(isolation: str, timeout_s: float) -> object:
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": isolation})
        try:
            return reader.committed([TopicPartition(topic, 0)], timeout=timeout_s)[0].offset
        except KafkaException as exc:
            return exc.args[0].name()
        finally:
            reader.close()

    observed = {"read_committed while open": committed("read_committed", 3),
                "read_uncommitted while open": committed("read_uncommitted", 10)}
    producer.commit_transaction(30)
    observed["read_committed after"] = wait_for(
        lambda: (offset := committed("read_committed", 10)) == 2 and offset, timeout_s=30,
        what="the committed group offset")
    member.close()
    return observed


def offsets_by_timestamp(bootstrap: str) -> Observation:
    topic = _name("times")
    # Timestamps of 1970, far past Kafka's default retention.ms (7 days): without this, Apache Kafka's retention check
    # (every log.retention.check.interval.ms) deletes the records whenever it runs between the produce and the reads.
    create_topic(bootstrap, topic, 1, {"retention.ms": "-1"})
    producer = Producer({"bootstrap.servers": bootstrap})
    for value, stamp in ((b"t0", 1_000_000), (b"t1", 2_000_000), (b"t2", 2_000_000), (b"t3", 3_000_000)):
        producer.produce(topic, value, partition=0, timestamp=stamp)
    producer.flush(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": _name("times")})
    try:
        found = {stamp: consumer.offsets_for_times([TopicPartition(topic, 0, stamp)], timeout=10)[0].offset
                 for stamp in (0, 1_000_000, 1_500_000, 2_000_000, 3_000_000, 4_000_000)}
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partition = TopicPartition(topic, 0)
    specs = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(),
             "max_timestamp": OffsetSpec.max_timestamp()}
    listed = {name: admin.list_offsets({partition: spec})[partition].result(10).offset
              for name, spec in specs.items()}
    return {"offsets_for_times": found, "list_offsets": listed}


def admin_configs_and_errors(bootstrap: str) -> Observation:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = create_topic(bootstrap, _name("configs"), 2, {"cleanup.policy": "compact", "retention.ms": "3600000"})
    keys = ("cleanup.policy", "retention.ms", "max.message.bytes", "message.timestamp.type", "min.insync.replicas",
            "compression.type", "retention.bytes")
    resource = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(30)
    # Kafka 4.x reports min.insync.replicas as a dynamic cluster default (its controller writes one when eligible
    # leader replicas are on, KIP-966), 3.9 and the embedded broker as the built-in default: compared by value
    # (docs/broker.md, differences).
    configs = {key: described[key].value if key == "min.insync.replicas" else (described[key].value,
                                                                              described[key].source)
               for key in keys}
    bad_value = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "not-a-number", incremental_operation=AlterConfigOpType.SET)])
    return {
        "configs": configs,
        "create existing": _error_name(lambda: admin.create_topics([NewTopic(topic, 1)])[topic].result(30)),
        "create 0 partitions": _error_name(lambda: _one(admin.create_topics([NewTopic(_name("zero"), 0)]))),
        "create bad name": _error_name(lambda: admin.create_topics([NewTopic("bad name!", 1)])["bad name!"].result(30)),
        "create unknown config": _error_name(lambda: _one(admin.create_topics(
            [NewTopic(_name("conf"), 1, config={"no.such.config": "1"})]))),
        "delete unknown": _error_name(lambda: _one(admin.delete_topics([_name("nowhere")]))),
        "alter bad value": _error_name(lambda: admin.incremental_alter_configs([bad_value])[bad_value].result(30)),
        "fewer partitions": _error_name(
            lambda: admin.create_partitions([NewPartitions(topic, 1)])[topic].result(30)),
    }


def incremental_config_changes_as_clients_make_them(bootstrap: str) -> Observation:
    """IncrementalAlterConfigs' four operations on topics created with a codec, as confluent-kafka-python's own
    integration test of them makes them: APPEND to and SUBTRACT from a list, SET, DELETE back to the default; what
    DescribeConfigs then reports as set (min.insync.replicas left out: see admin_configs_and_errors)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    first, second = (create_topic(bootstrap, _name(kind), 2, {"compression.type": "gzip"}) for kind in ("inc", "dec"))

    def alter(topic: str, *changes: tuple[str, str | None, AlterConfigOpType]) -> str:
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
            ConfigEntry(name, value, incremental_operation=operation) for name, value, operation in changes])
        return _error_name(lambda: admin.incremental_alter_configs([resource])[resource].result(30))

    def set_entries(topic: str, settled: Callable[[list[str]], bool]) -> list[str]:
        """The entries not at their default, asked again until `settled` (a broker applies a change a moment after
        its controller took it), for at most 15 s."""
        resource = ConfigResource(ResourceType.TOPIC, topic)
        deadline = time.monotonic() + 15
        while True:
            described = admin.describe_configs([resource])[resource].result(30)
            entries = sorted(f"{entry.name}={entry.value}" for entry in described.values()
                             if not entry.is_default and entry.name != "min.insync.replicas")
            if settled(entries) or time.monotonic() >= deadline:
                return entries

    append, subtract, set_, delete = (AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT, AlterConfigOpType.SET,
                                      AlterConfigOpType.DELETE)
    return {
        "append and set": alter(first, ("cleanup.policy", "compact", append), ("retention.ms", "10000", set_)),
        "subtract and set": alter(second, ("cleanup.policy", "delete", subtract), ("retention.ms", "5000", set_)),
        "first": set_entries(first, lambda entries: "retention.ms=10000" in entries),
        "second": set_entries(second, lambda entries: "retention.ms=5000" in entries),
        "delete and set": alter(second, ("compression.type", None, delete), ("retention.ms", "10000", set_)),
        "second after": set_entries(second, lambda entries: "retention.ms=10000" in entries),
        "append to a non-list": alter(first, ("retention.ms", "1", append)),
    }


def authorized_operations_without_an_authorizer(bootstrap: str) -> Observation:
    """KIP-430 through describe_cluster and describe_topics: with no authorizer, every operation Kafka defines on
    the resource."""
    from confluent_kafka import TopicCollection

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = create_topic(bootstrap, _name("operations"), 1)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
    described = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[topic].result(30)
    plain = admin.describe_cluster().result(30)
    return {"cluster": sorted(str(op) for op in cluster.authorized_operations or []),
            "topic": sorted(str(op) for op in described.authorized_operations or []),
            "not asked": plain.authorized_operations}


def a_record_too_large_for_the_topic(bootstrap: str) -> Observation:
    topic = _name("large")
    create_topic(bootstrap, topic, config={"max.message.bytes": "2000"})
    reports: list[object] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "message.max.bytes": 100_000,
                         "linger.ms": 0})
    producer.produce(topic, b"x" * 5000, partition=0,
                     on_delivery=lambda error, message: reports.append(error.name() if error else message.offset()))
    producer.produce(topic, b"small", partition=0)
    producer.flush(30)
    producer.produce(topic, b"after", partition=0,
                     on_delivery=lambda error, message: reports.append(error.name() if error else message.offset()))
    producer.flush(30)
    return {"delivery reports": reports}


def topics_that_recompress(bootstrap: str) -> Observation:
    """A topic whose compression.type names a codec holds its batches in that codec, whatever the producer sent;
    `uncompressed` holds them uncompressed; the records, their order and a transactional producer's batches are kept.
    And the values Kafka refuses."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    seen: dict[str, object] = {}
    values = [f"value-{i}-{'abc' * 30}" for i in range(300)]
    for target, sent in (("zstd", "none"), ("gzip", "lz4"), ("lz4", "none"), ("snappy", "zstd"),
                         ("uncompressed", "gzip"), ("producer", "snappy")):
        topic = create_topic(bootstrap, _name(f"codec-{target}"), 1, {"compression.type": target})
        producer = _transactional(bootstrap, **{"compression.type": sent, "linger.ms": 20})
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value.encode(), key=value[:9].encode(), partition=0)
        producer.commit_transaction(30)
        producer.flush(30)
        with WireClient(bootstrap) as wire:
            data = [batch for batch in wire.log_batches(topic) if not batch.control]
        described = admin.describe_configs([resource := ConfigResource(ResourceType.TOPIC, topic)])
        seen[target] = {
            "codecs": sorted({batch.codec for batch in data}),
            "transactional": all(batch.transactional and batch.producer_id >= 0 for batch in data),
            "values read": _read(bootstrap, topic, READ_COMMITTED) == list(enumerate(values)),
            "described": described[resource].result(30)["compression.type"].value,
        }
    for name, config in (("unknown codec", {"compression.type": "brotli"}),
                         ("gzip level", {"compression.gzip.level": "12"}),
                         ("zstd level", {"compression.zstd.level": "30"}),
                         ("lz4 level", {"compression.lz4.level": "0"})):
        seen[f"create with bad {name}"] = _error_name(
            lambda config=config: _one(admin.create_topics([NewTopic(_name("badcodec"), 1, config=config)])))
    levels = create_topic(bootstrap, _name("levels"), 1, {"compression.type": "gzip", "compression.gzip.level": "9"})
    described = admin.describe_configs([resource := ConfigResource(ResourceType.TOPIC, levels)])[resource].result(30)
    seen["levels described"] = {key: (described[key].value, described[key].source) for key in (
        "compression.gzip.level", "compression.lz4.level", "compression.zstd.level")}
    return seen


def scram_credentials_through_the_admin_api(bootstrap: str) -> Observation:
    """AlterUserScramCredentials and DescribeUserScramCredentials: what is kept, what is refused, and how."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    user = _name("user")

    def alter(*changes) -> dict[str, str]:
        futures = admin.alter_user_scram_credentials(list(changes))
        return {name.split("-")[0]: _error_name(lambda f=future: f.result(30)) for name, future in futures.items()}

    def describe(*users: str) -> dict[str, object]:
        futures = admin.describe_user_scram_credentials(list(users))
        seen: dict[str, object] = {}
        for name, future in futures.items():
            try:
                seen[name.split("-")[0]] = sorted((str(i.mechanism), i.iterations)
                                                  for i in future.result(30).scram_credential_infos)
            except KafkaException as exc:
                seen[name.split("-")[0]] = exc.args[0].name()
        return seen

    def described_once(settled) -> dict[str, object]:
        """Kafka answers an alteration once its controller took it; its brokers apply the change to what they
        describe a moment later: asked again until `settled(seen)`, for at most 15 s."""
        deadline = time.monotonic() + 15
        seen = describe(user)
        while not settled(seen[user.split("-")[0]]) and time.monotonic() < deadline:
            time.sleep(0.1)
            seen = describe(user)
        return seen

    sha256, sha512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
    return {
        "describe unknown": describe(user),
        "upsert": alter(UserScramCredentialUpsertion(user, ScramCredentialInfo(sha256, 10000), b"secret", b"salt")),
        "upsert other mechanism": alter(UserScramCredentialUpsertion(user, ScramCredentialInfo(sha512, 8192),
                                                                     b"secret")),
        "described": described_once(lambda seen: isinstance(seen, list) and len(seen) == 2),
        # Every user, as DescribeUserScramCredentials without names (None or an empty list) describes them.
        "described among all": [sorted((str(i.mechanism), i.iterations) for i in
                                       admin.describe_user_scram_credentials(*names).result(30)[user]
                                       .scram_credential_infos) for names in ([], [None])],
        "too few iterations": alter(UserScramCredentialUpsertion(_name("few"), ScramCredentialInfo(sha256, 100),
                                                                 b"secret")),
        "too many iterations": alter(UserScramCredentialUpsertion(_name("many"), ScramCredentialInfo(sha256, 20000),
                                                                  b"secret")),
        "delete missing": alter(UserScramCredentialDeletion(_name("nobody"), sha256)),
        "delete one": alter(UserScramCredentialDeletion(user, sha512)),
        "described after": described_once(lambda seen: isinstance(seen, list) and len(seen) == 1),
        "delete last": alter(UserScramCredentialDeletion(user, sha256)),
        "described at last": described_once(lambda seen: seen == "RESOURCE_NOT_FOUND"),
    }


SCENARIOS = [transactions_with_aborts, open_transaction_holds_the_last_stable_offset, a_fenced_producer_cannot_commit,
             transactional_group_offsets_wait_for_the_commit, offsets_by_timestamp, admin_configs_and_errors,
             a_record_too_large_for_the_topic, topics_that_recompress,
             scram_credentials_through_the_admin_api, incremental_config_changes_as_clients_make_them,
             authorized_operations_without_an_authorizer]


@pytest.mark.parametrize("version", apache_kafka.tested_versions())
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda scenario: scenario.__name__)
def test_the_client_sees_the_same_on_both_brokers(broker, apache_kafka_nodes, version, scenario) -> None:
    oracle = scenario(apache_kafka_nodes.node(version).bootstrap_servers)
    ours = scenario(broker.bootstrap_servers)
    assert ours == oracle, f"{scenario.__name__}: embedded broker {ours}\nApache Kafka {version} {oracle}"
