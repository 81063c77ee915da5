"""Option parsing of the sparkeos.kafka source and sink: every error names the option it is about."""

from __future__ import annotations

import pytest

from sparkeos.spark.kafka.cluster import connection_config
from sparkeos.spark.kafka.options import (
    EARLIEST,
    LATEST,
    parse_sink_options,
    parse_source_options,
)
from sparkeos.spark.options import OptionError

BOOT = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def source(streaming: bool = True, **options: str):
    # Spark hands options over with lower-cased keys.
    return parse_source_options({k.lower(): v for k, v in {**BOOT, **options}.items()}, streaming=streaming)


def sink(**options: str):
    return parse_sink_options({k.lower(): v for k, v in {**BOOT, **options}.items()})


def error_of(call, *args, **kwargs) -> str:
    with pytest.raises(OptionError) as raised:
        call(*args, **kwargs)
    return str(raised.value)


def test_defaults_follow_spark_and_read_committed():
    parsed = source(subscribe="a,b")
    assert parsed.subscribe == ("a", "b")
    assert parsed.starting.kind == "latest"
    assert parsed.fail_on_data_loss is True
    assert parsed.include_headers is False
    assert parsed.commit_offsets_to_group is False
    assert parsed.consumer_config()["isolation.level"] == "read_committed"
    assert parsed.consumer_config()["enable.auto.commit"] == "false"
    # librdkafka's 1 s pause once its queue holds 100,000 records left readers of large ranges idle.
    assert parsed.consumer_config()["fetch.queue.backoff.ms"] == "10"
    # A range exists before it is read: no long poll at its end to hold up the next range's first Fetch.
    assert parsed.consumer_config()["fetch.wait.max.ms"] == "10"
    assert source(streaming=False, subscribe="a").starting.kind == "earliest"


def test_kafka_options_pass_through_to_the_client():
    parsed = source(subscribe="a", **{"kafka.fetch.max.bytes": "1000", "kafka.isolation.level": "read_uncommitted",
                                      "kafka.fetch.queue.backoff.ms": "1000", "kafka.fetch.wait.max.ms": "500"})
    config = parsed.consumer_config()
    assert config["fetch.wait.max.ms"] == "500"
    assert config["fetch.max.bytes"] == "1000"
    assert config["fetch.queue.backoff.ms"] == "1000"
    assert config["isolation.level"] == "read_uncommitted"
    assert parsed.read_committed is False


def test_every_client_reaches_a_new_broker_after_25_ms_not_50_and_a_restarted_one_within_a_second():
    # librdkafka waits half of reconnect.backoff.ms before its first connection to a broker named by metadata.
    consumer = source(subscribe="a").consumer_config()
    producer = sink(topic="out").producer_config()
    assert consumer["reconnect.backoff.ms"] == producer["reconnect.backoff.ms"] == "50"
    # The sink's marker consumer and the driver's admin clients take the connection settings from these.
    assert connection_config(producer)["reconnect.backoff.ms"] == "50"
    assert connection_config(consumer)["reconnect.backoff.ms"] == "50"
    # The Java client's reconnect.backoff.max.ms: librdkafka's 10 s let a 3 s broker restart stall a task for
    # 10 s or more, past a 10 s transaction timeout.
    for config in (consumer, producer, connection_config(consumer), connection_config(producer)):
        assert config["reconnect.backoff.max.ms"] == "1000"
    assert sink(topic="out", **{"kafka.reconnect.backoff.ms": "200"}).producer_config()["reconnect.backoff.ms"] == "200"
    assert source(subscribe="a", **{"kafka.reconnect.backoff.ms": "5"}).consumer_config()["reconnect.backoff.ms"] == "5"


def test_keys_are_partitioned_as_the_java_client_does_unless_the_user_says_otherwise():
    assert sink(topic="out").producer_config()["partitioner"] == "murmur2_random"
    assert "partitioner" not in connection_config(sink(topic="out").producer_config())  # producers only
    assert sink(topic="out", **{"kafka.partitioner": "fnv1a"}).producer_config()["partitioner"] == "fnv1a"


def test_sink_producers_linger_as_kafka_streams_does_unless_the_user_says_otherwise():
    assert sink(topic="out").producer_config()["linger.ms"] == "100"
    assert sink(topic="out", deliveryGuarantee="none").producer_config()["linger.ms"] == "100"
    assert sink(topic="out", **{"kafka.linger.ms": "0"}).producer_config()["linger.ms"] == "0"
    assert "linger.ms" not in connection_config(sink(topic="out").producer_config())  # producers only
    # librdkafka refuses a linger.ms not below the message timeout: a short one the user sets shortens the linger.
    assert sink(topic="out", **{"kafka.message.timeout.ms": "80"}).producer_config()["linger.ms"] == "79"
    assert sink(topic="out", **{"kafka.delivery.timeout.ms": "50"}).producer_config()["linger.ms"] == "49"
    assert sink(topic="out", **{"kafka.message.timeout.ms": "30000"}).producer_config()["linger.ms"] == "100"


def test_group_id_turns_on_commit_offsets_to_group():
    assert source(subscribe="a", **{"kafka.group.id": "g"}).commit_offsets_to_group is True
    assert source(subscribe="a", **{"kafka.group.id": "g", "commitOffsetsToGroup": "false"}).commit_offsets_to_group \
        is False
    assert "kafka.group.id" in error_of(source, subscribe="a", commitOffsetsToGroup="true")


def test_readers_group_id_starts_with_group_id_prefix_unless_kafka_group_id_names_one(caplog):
    assert source(subscribe="a").consumer_config()["group.id"] == "sparkeos-reader"
    assert source(subscribe="a", groupIdPrefix="team-etl").consumer_config()["group.id"] == "team-etl-reader"
    assert "groupIdPrefix" in error_of(source, subscribe="a", groupIdPrefix=" ")
    with caplog.at_level("WARNING", logger="sparkeos.options"):
        named = source(subscribe="a", groupIdPrefix="team-etl", **{"kafka.group.id": "g"})
    assert named.consumer_config()["group.id"] == "g"
    assert "'groupIdPrefix' is ignored" in caplog.text


def test_starting_offsets_forms():
    parsed = source(subscribe="t", startingOffsets='{"t": {"0": 23, "1": -2, "2": -1}}')
    assert parsed.starting.kind == "offsets"
    assert parsed.starting.offsets == {"t": {0: 23, 1: EARLIEST, 2: LATEST}}
    assert source(subscribe="t", startingOffsets="EARLIEST").starting.kind == "earliest"
    assert source(subscribe="t", startingTimestamp="1000").starting.timestamp == 1000
    by_time = source(subscribe="t", startingOffsetsByTimestamp='{"t": {"0": 5}}').starting
    assert (by_time.kind, by_time.offsets) == ("timestamps", {"t": {0: 5}})
    group = source(subscribe="t", startingOffsets="group",
                   **{"kafka.group.id": "g", "kafka.auto.offset.reset": "earliest"})
    assert group.starting.kind == "group"


def test_ending_offsets_for_batch_queries():
    parsed = source(streaming=False, subscribe="t", endingOffsets='{"t": {"0": 50, "1": -1}}')
    assert parsed.ending.offsets == {"t": {0: 50, 1: LATEST}}
    assert "endingOffsets" in error_of(source, streaming=False, subscribe="t", endingOffsets="earliest")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "t", "startingOfsets": "earliest"}, "did you mean 'startingOffsets'"),
        ({"subscribe": "t", "bogus": "1"}, "unknown sparkeos.kafka source option 'bogus'"),
        ({}, "exactly one of 'subscribe', 'subscribePattern' or 'assign'"),
        ({"subscribe": "t", "assign": '{"t": [0]}'}, "'subscribe', 'assign'"),
        ({"subscribe": " , "}, "'subscribe' names no topic"),
        ({"subscribePattern": "("}, "'subscribePattern' is not a valid regular expression"),
        ({"assign": '{"t": [0'}, "option 'assign' is not valid JSON"),
        ({"assign": '{"t": "0"}'}, "option 'assign'"),
        ({"subscribe": "t", "startingOffsets": '{"t": {"0": 1'}, "option 'startingOffsets' is not valid JSON"),
        ({"subscribe": "t", "startingOffsets": '["t"]'}, "option 'startingOffsets' must be a JSON object"),
        ({"subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, "partition 'x' of topic 't'"),
        ({"subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, "must be an integer >= -2"),
        ({"subscribe": "t", "startingOffsets": "group"}, "'kafka.group.id' is not set"),
        ({"subscribe": "t", "startingOffsets": "earliest", "startingTimestamp": "5"}, "contradict"),
        ({"subscribe": "t", "endingOffsets": "latest"}, "'endingOffsets' is not supported in streaming"),
        ({"subscribe": "t", "failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
        ({"subscribe": "t", "maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be at least 1"),
        ({"subscribe": "t", "maxOffsetsPerTrigger": "ten"}, "'maxOffsetsPerTrigger' must be an integer"),
        ({"subscribe": "t", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "'minOffsetsPerTrigger' (10)"),
        ({"subscribe": "t", "maxTriggerDelay": "soon"}, "'maxTriggerDelay' must be a duration"),
        ({"subscribe": "t", "startingOffsetsByTimestampStrategy": "first"}, "startingOffsetsByTimestampStrategy"),
        ({"subscribe": "t", "kafka.enable.auto.commit": "true"}, "'kafka.enable.auto.commit' cannot be set"),
        ({"subscribe": "t", "kafka.isolation.level": "dirty"}, "'kafka.isolation.level'"),
        ({"subscribe": "t", "kafka.auto.offset.reset": "earliest"}, "startingOffsets=group"),
    ],
)
def test_bad_source_options_name_the_option(options, named):
    assert named in error_of(source, **options)


def test_batch_only_and_stream_only_options(caplog):
    # As Spark: a stream's trigger options in a batch read are ignored with a warning; ending offsets in a stream
    # are an error.
    with caplog.at_level("WARNING", logger="sparkeos.options"):
        assert source(streaming=False, subscribe="t", maxOffsetsPerTrigger="5", maxTriggerDelay="1s")
    assert [r.getMessage() for r in caplog.records] == ["option 'maxOffsetsPerTrigger' is ignored in batch queries",
                                                        "option 'maxTriggerDelay' is ignored in batch queries"]
    assert "'minOffsetsPerTrigger' (10)" in error_of(source, streaming=False, subscribe="t",
                                                     minOffsetsPerTrigger="10", maxOffsetsPerTrigger="5")
    assert "'endingOffsets' is not supported in streaming" in error_of(source, subscribe="t", endingOffsets="latest")
    assert "'kafka.bootstrap.servers' is required" in error_of(parse_source_options, {"subscribe": "t"}, True)


def test_durations():
    assert source(subscribe="t", maxTriggerDelay="500ms").max_trigger_delay_ms == 500
    assert source(subscribe="t", maxTriggerDelay="30s").max_trigger_delay_ms == 30_000
    assert source(subscribe="t").max_trigger_delay_ms == 15 * 60_000


def test_sink_defaults_are_exactly_once():
    parsed = sink(topic="out")
    assert parsed.delivery_guarantee == "exactly_once"
    assert parsed.transaction_timeout_ms == 60_000
    config = parsed.producer_config()
    assert config["enable.idempotence"] == "true"
    assert config["transaction.timeout.ms"] == "60000"
    assert "transactional.id" not in config
    assert sink(deliveryGuarantee="AT_LEAST_ONCE").delivery_guarantee == "at_least_once"
    assert sink(deliveryGuarantee="none").producer_config().get("enable.idempotence") is None


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"deliveryGuarantee": "twice"}, "option 'deliveryGuarantee' must be one of exactly_once, at_least_once, none"),
        ({"kafka.transactional.id": "x"}, "set the option transactionalIdPrefix instead"),
        ({"kafka.enable.idempotence": "false"}, "contradicts deliveryGuarantee=exactly_once"),
        ({"deliveryGuarantee": "none", "transactionalIdPrefix": "p"}, "'transactionalIdPrefix' only applies"),
        ({"kafka.transaction.timeout.ms": "soon"}, "'kafka.transaction.timeout.ms' must be an integer"),
        ({"transactionalIdPrefix": "  "}, "'transactionalIdPrefix' is empty"),
        ({"topik": "x"}, "did you mean 'topic'"),
    ],
)
def test_bad_sink_options_name_the_option(options, named):
    assert named in error_of(sink, **options)


def test_driver_and_marker_clients_keep_every_security_setting():
    security = {
        "security.protocol": "SASL_SSL", "ssl.ca.location": "/ca.pem", "sasl.mechanism": "OAUTHBEARER",
        "enable.ssl.certificate.verification": "false", "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "https.ca.location": "/idp-ca.pem", "connections.max.idle.ms": "60000",
        "topic.metadata.refresh.interval.ms": "1000",
    }
    options = {f"kafka.{key}": value for key, value in security.items()}
    for config in (source(subscribe="a", **options).consumer_config(), sink(topic="out", **options).producer_config()):
        kept = connection_config(config)
        assert {key: kept.get(key) for key in security} == security
        assert "isolation.level" not in kept and "transactional.id" not in kept and "acks" not in kept
