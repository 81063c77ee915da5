"""The sparkeos.kafka source and exactly-once sink on a secured cluster: SASL_SSL, SCRAM-SHA-512 and the authorizer
on, the query's principal allowed exactly what docs/security.md lists and nothing else. The query fails a batch
after its transactions committed and starts again from its checkpoint; an independent read_committed reader sees
every record once. Without any one of the listed ACLs the query fails, naming what Kafka refused. On the embedded
broker and on Apache Kafka, whose authorizer is the oracle for the list."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AclBindingFilter, AclOperation, AdminClient, NewTopic, ResourceType
from pyspark.errors import StreamingQueryException

from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from sparkeos.verify import assert_exactly_once, read_values
from support.secured import allow, secured_broker
from support.spark import arm_failpoint, clear_failpoints, fired, unique

PRINCIPAL = "User:etl"
PREFIX = "etl-orders"  # the sink's transactionalIdPrefix and the source's groupIdPrefix


def query_acls(source: str, sink: str) -> dict[str, list]:
    """What the query needs, by what it is for (docs/security.md lists the same)."""
    return {
        "read the input": allow(PRINCIPAL, ResourceType.TOPIC, source, [AclOperation.READ]),
        "write the output": allow(PRINCIPAL, ResourceType.TOPIC, sink, [AclOperation.WRITE]),
        "the commit markers": allow(PRINCIPAL, ResourceType.TOPIC, DEFAULT_MARKER_TOPIC, [
            AclOperation.CREATE, AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE_CONFIGS]),
        "the transactional ids": allow(PRINCIPAL, ResourceType.TRANSACTIONAL_ID, PREFIX, [AclOperation.WRITE],
                                       prefixed=True),
        "the groups": allow(PRINCIPAL, ResourceType.GROUP, PREFIX, [AclOperation.READ], prefixed=True),
    }


pytestmark = pytest.mark.apache_kafka(newest_only=True)


# Kafka's error for a query without one of them.
REFUSALS = {"read the input": "TOPIC_AUTHORIZATION_FAILED", "write the output": "TOPIC_AUTHORIZATION_FAILED",
            "the commit markers": "TOPIC_AUTHORIZATION_FAILED",
            "the transactional ids": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            "the groups": "GROUP_AUTHORIZATION_FAILED"}


@pytest.fixture
def secured(tmp_path, broker_kind):
    with secured_broker(tmp_path / "secured", broker_kind) as cluster:
        yield cluster


def create_topics(cluster, *names: str) -> None:
    admin = AdminClient(cluster.client_config("admin"))
    futures = admin.create_topics([NewTopic(name, 2, 1) for name in names])
    for future in futures.values():
        future.result(30)


def produce(cluster, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({**cluster.client_config("admin"), "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0


def start_query(spark, cluster, source: str, sink: str, checkpoint: str):
    options = cluster.spark_options("etl")
    frame = (spark.readStream.format("sparkeos.kafka").options(**options).option("subscribe", source)
             .option("startingOffsets", "earliest").option("groupIdPrefix", PREFIX)
             .option("maxOffsetsPerTrigger", "100").load())
    return (frame.select("key", "value").writeStream.format("sparkeos.kafka").options(**options)
            .option("topic", sink).option("transactionalIdPrefix", PREFIX)
            .option("checkpointLocation", checkpoint).start())


def test_a_query_allowed_exactly_what_the_docs_list_is_exact_through_a_failed_batch(spark, secured, tmp_path):
    source, sink = unique("orders"), unique("orders-out")
    create_topics(secured, source, sink)
    secured.create_acls([binding for bindings in query_acls(source, sink).values() for binding in bindings])
    values = [f"order-{n}".encode() for n in range(400)]
    produce(secured, source, values)
    clear_failpoints()
    arm_failpoint("sink.after_commit")
    checkpoint = str(tmp_path / "checkpoint")
    query = start_query(spark, secured, source, sink, checkpoint)
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(120)
        query.processAllAvailable()
    assert fired("sink.after_commit")
    query = start_query(spark, secured, source, sink, checkpoint)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once(values, read_values(secured.bootstrap_servers, sink, config=secured.client_config("admin")))


def test_without_any_one_of_the_listed_acls_the_query_fails_naming_what_kafka_refused(spark, secured, tmp_path):
    source, sink = unique("orders"), unique("orders-out")
    create_topics(secured, source, sink)
    produce(secured, source, [b"order"])
    needed = query_acls(source, sink)
    assert set(needed) == set(REFUSALS)
    admin = AdminClient(secured.client_config("admin"))
    for left_out in needed:
        granted = [binding for what, bindings in needed.items() if what != left_out for binding in bindings]
        secured.create_acls(granted)
        query = start_query(spark, secured, source, sink, str(tmp_path / left_out.replace(" ", "-")))
        try:
            query.awaitTermination(60)
            query.processAllAvailable()
        except StreamingQueryException as failure:
            refused = str(failure)
        else:
            refused = ""
        query.stop()
        assert REFUSALS[left_out] in refused, (left_out, refused[-2000:])
        futures = admin.delete_acls([AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                                                      b.operation, b.permission_type) for b in granted])
        for future in futures.values():
            future.result(30)


def test_a_read_refused_by_kafka_fails_naming_the_group_or_the_topic_and_the_acl_it_needs(spark, secured):
    """WRITE implies DESCRIBE: the driver plans the read of a topic the principal may only write; Kafka refuses the
    executors' readers their group and their fetches, in the order their requests meet the refusals (the group
    coordinator's lookup and the first fetch race); once the group is allowed, the fetches."""
    topic = unique("written-only")
    create_topics(secured, topic)
    produce(secured, topic, [b"record"])
    secured.create_acls(allow(PRINCIPAL, ResourceType.TOPIC, topic, [AclOperation.WRITE]))
    frame = (spark.read.format("sparkeos.kafka").options(**secured.spark_options("etl")).option("subscribe", topic)
             .option("groupIdPrefix", PREFIX).load())
    group_refused = (rf"Kafka refused this client's principal the group '{PREFIX}-reader' "
                     r"\(GROUP_AUTHORIZATION_FAILED\): reading needs READ on the group")
    topic_refused = (rf"Kafka refused to let this client's principal read {topic}-\d "
                     rf"\(TOPIC_AUTHORIZATION_FAILED\): reading needs READ on topic '{topic}'")
    with pytest.raises(Exception, match=rf"{group_refused}|{topic_refused}"):
        frame.collect()
    secured.create_acls(query_acls(topic, topic)["the groups"])
    with pytest.raises(Exception, match=topic_refused):
        frame.collect()
