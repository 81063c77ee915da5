"""The `sparkeos.kafka` source against the real broker and a real local Spark: Spark's Kafka source options,
streaming (foreachBatch collecting every micro-batch) and batch (spark.read).

Records are placed deliberately (partition, timestamp, transactions) and every assertion names exact
(partition, offset) or value sets, so a source that skips, repeats or misplaces a record fails.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sparkeos.spark.kafka.options import parse_source_options
from sparkeos.spark.kafka.source import range_reader as source_module
from sparkeos.spark.kafka.source.readers import KafkaStreamReader
from support.spark import create_topic, produce, produce_transaction, unique, wait_for

pytestmark = pytest.mark.apache_kafka

# Spark's own Kafka source schema (KafkaRecordToRowConverter), written out independently of source.py.
SPARK_KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
SPARK_KAFKA_HEADERS = StructField(
    "headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
)


# --- helpers ---------------------------------------------------------------------------------------


class Collected:
    """foreachBatch target: every micro-batch's rows (as dicts) by batch id, plus its Spark partition count."""

    def __init__(self, count_partitions: bool = False):
        self.batches: dict[int, list[dict]] = {}
        self.spark_partitions: dict[int, int] = {}
        self.arrival: dict[int, float] = {}
        self.count_partitions = count_partitions

    def __call__(self, frame, batch_id: int) -> None:
        if self.count_partitions:
            self.spark_partitions[batch_id] = frame.rdd.getNumPartitions()
        self.batches[batch_id] = [row.asDict(recursive=True) for row in frame.collect()]
        self.arrival[batch_id] = time.monotonic()

    @property
    def rows(self) -> list[dict]:
        return [row for batch_id in sorted(self.batches) for row in self.batches[batch_id]]

    def sizes(self) -> list[int]:
        return [len(self.batches[batch_id]) for batch_id in sorted(self.batches)]


def reader_options(bootstrap: str, options: dict) -> dict:
    return {"kafka.bootstrap.servers": bootstrap, **options}


def read_batch(spark, bootstrap: str, **options) -> list[dict]:
    return [row.asDict(recursive=True) for row in batch_frame(spark, bootstrap, options).collect()]


def batch_frame(spark, bootstrap: str, options: dict):
    return spark.read.format("sparkeos.kafka").options(**reader_options(bootstrap, options)).load()


def start_stream(
    spark, bootstrap: str, checkpoint, options: dict, available_now: bool = False, collected: Collected | None = None
):
    collected = collected if collected is not None else Collected()
    frame = spark.readStream.format("sparkeos.kafka").options(**reader_options(bootstrap, options)).load()
    writer = frame.writeStream.foreachBatch(collected).option("checkpointLocation", str(checkpoint))
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start(), collected


def run_available_now(spark, bootstrap: str, checkpoint, collected: Collected | None = None, **options):
    """A Trigger.AvailableNow query run to its end; returns what it collected and its progress reports."""
    query, collected = start_stream(spark, bootstrap, checkpoint, options, available_now=True, collected=collected)
    try:
        assert query.awaitTermination(120), "Trigger.AvailableNow query did not stop by itself"
    finally:
        query.stop()
    return collected, query.recentProgress


def placed(rows: list[dict]) -> set[tuple[str, int, int]]:
    return {(row["topic"], row["partition"], row["offset"]) for row in rows}


def values(rows: list[dict]) -> list[str]:
    return sorted(row["value"].decode() for row in rows)


def fill(bootstrap: str, topic: str, partitions: int, per_partition: int, timestamps: list[int] | None = None) -> None:
    """`per_partition` records "p{partition}-{i}" in each partition, optionally with explicit timestamps."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for partition in range(partitions):
        for i in range(per_partition):
            extra = {"timestamp": timestamps[i]} if timestamps else {}
            producer.produce(topic, value=f"p{partition}-{i}".encode(), partition=partition, **extra)
    assert producer.flush(30) == 0


def offsets(topic: str, ranges: dict[int, range]) -> set[tuple[str, int, int]]:
    return {(topic, partition, offset) for partition, span in ranges.items() for offset in span}


def commit_group_offsets(bootstrap: str, group: str, topic: str, committed: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed.items()], asynchronous=False)
    consumer.close()


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets, read by a consumer: librdkafka's admin client can crash on a fresh Apache Kafka
    node (tests/spark/kafka/test_cluster_broker_restart.py)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        result = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in result if tp.offset >= 0}


def failure_of_batch(spark, bootstrap: str, **options) -> str:
    with pytest.raises(AnalysisException) as failure:
        batch_frame(spark, bootstrap, options).collect()
    return str(failure.value)


def failure_of_stream(spark, bootstrap: str, checkpoint, **options) -> str:
    query, _ = start_stream(spark, bootstrap, checkpoint, options)
    try:
        with pytest.raises(StreamingQueryException) as failure:
            query.awaitTermination(120)
    finally:
        query.stop()
    return str(failure.value)


# --- schema -----------------------------------------------------------------------------------------


def test_schema_is_spark_kafka_schema_and_headers_round_trip(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("schema"), partitions=2)
    stamp = int(time.time() * 1000) - 60_000
    headers = [("trace", b"abc"), ("trace", b"second value of a repeated key"), ("empty", b""), ("none", None)]
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=b"k0", value=b"v0", partition=1, timestamp=stamp, headers=headers)
    producer.produce(topic, value=b"v1", partition=0, timestamp=stamp + 1)
    assert producer.flush(30) == 0

    assert batch_frame(spark, bootstrap, {"subscribe": topic}).schema == SPARK_KAFKA_SCHEMA
    with_headers = StructType([*SPARK_KAFKA_SCHEMA.fields, SPARK_KAFKA_HEADERS])
    assert batch_frame(spark, bootstrap, {"subscribe": topic, "includeHeaders": "true"}).schema == with_headers

    expected = {
        b"v0": {
            "key": b"k0",
            "topic": topic,
            "partition": 1,
            "offset": 0,
            "timestampType": 0,
            "headers": [{"key": k, "value": v} for k, v in headers],
        },
        b"v1": {"key": None, "topic": topic, "partition": 0, "offset": 0, "timestampType": 0, "headers": None},
    }
    stream, _ = run_available_now(
        spark, bootstrap, tmp_path / "ck", subscribe=topic, includeHeaders="true", startingOffsets="earliest"
    )
    batch = read_batch(spark, bootstrap, subscribe=topic, includeHeaders="true")
    for rows in (stream.rows, batch):
        by_value = {row["value"]: row for row in rows}
        assert set(by_value) == set(expected)
        for value, fields in expected.items():
            row = by_value[value]
            assert {name: row[name] for name in fields} == fields
            assert int(row["timestamp"].timestamp() * 1000) == stamp + (value == b"v1")

    appended = create_topic(bootstrap, unique("append"), config={"message.timestamp.type": "LogAppendTime"})
    before = time.time()
    producer.produce(appended, value=b"a", timestamp=stamp)
    assert producer.flush(30) == 0
    (row,) = read_batch(spark, bootstrap, subscribe=appended)
    assert row["timestampType"] == 1  # Spark's LogAppendTime
    assert row["timestamp"].timestamp() >= before - 1, "the producer's timestamp was kept on a LogAppendTime topic"


# --- subscription -----------------------------------------------------------------------------------


def test_subscribe_reads_every_listed_topic_and_nothing_else(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    first = create_topic(bootstrap, unique("a"), partitions=2)
    second = create_topic(bootstrap, unique("b"))
    other = create_topic(bootstrap, unique("c"))
    for topic in (first, second, other):
        fill(bootstrap, topic, 2 if topic == first else 1, 5)
    expected = offsets(first, {0: range(5), 1: range(5)}) | offsets(second, {0: range(5)})
    stream, _ = run_available_now(
        spark, bootstrap, tmp_path / "ck", subscribe=f"{first},{second}", startingOffsets="earliest"
    )
    assert placed(stream.rows) == expected
    assert len(stream.rows) == 15
    batch = read_batch(spark, bootstrap, subscribe=f"{first}, {second}")
    assert placed(batch) == expected
    assert len(batch) == 15


def test_subscribe_pattern_picks_up_new_topics_and_partitions_from_earliest(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    prefix = unique("pat").replace("-", "")
    first = create_topic(bootstrap, f"{prefix}-1")
    create_topic(bootstrap, unique("unmatched"))
    fill(bootstrap, first, 1, 3)
    options = {"subscribePattern": f"{prefix}-.*", "startingOffsets": "latest"}
    query, collected = start_stream(spark, bootstrap, tmp_path / "ck", options)
    try:
        query.processAllAvailable()
        assert collected.rows == []  # latest: the 3 existing records are not read
        produce(bootstrap, first, ["late"], partition=0)
        query.processAllAvailable()
        assert placed(collected.rows) == {(first, 0, 3)}
    finally:
        query.stop()

    # Created while the query is down: on restart the checkpoint knows neither, so both start at earliest
    # even though startingOffsets says latest.
    second = create_topic(bootstrap, f"{prefix}-2")
    fill(bootstrap, second, 1, 4)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(first, 3)])[first].result(30)
    wait_for(lambda: len(admin.list_topics(first, timeout=10).topics[first].partitions) == 3, what="new partitions")
    produce(bootstrap, first, ["new-1a", "new-1b"], partition=1)
    produce(bootstrap, first, ["new-2"], partition=2)
    query, collected = start_stream(spark, bootstrap, tmp_path / "ck", options)
    try:
        query.processAllAvailable()
        assert placed(collected.rows) == offsets(second, {0: range(4)}) | offsets(first, {1: range(2), 2: range(1)})
        # Created while the query runs: records already in it when it is discovered are read too.
        third = create_topic(bootstrap, f"{prefix}-3", partitions=2)
        fill(bootstrap, third, 2, 2)
        query.processAllAvailable()
        assert placed(collected.rows) - placed(collected.rows[:7]) == offsets(third, {0: range(2), 1: range(2)})
        assert len(collected.rows) == 11
    finally:
        query.stop()


def test_subscribe_pattern_is_found_anywhere_in_a_topic_name_as_in_spark(broker):
    """Spark matches subscribePattern with Java's find(): `orders` picks `eu-orders-v2` too."""
    from sparkeos.spark.kafka.cluster import KafkaCluster

    bootstrap = broker.bootstrap_servers
    mark = unique("orders").replace("-", "")
    names = [create_topic(bootstrap, name) for name in (mark, f"eu-{mark}-v2", f"{mark}x")]
    create_topic(bootstrap, unique("payments"))
    cluster = KafkaCluster({"bootstrap.servers": bootstrap})
    assert cluster.partitions_of(pattern=mark) == sorted((name, 0) for name in names)
    assert cluster.partitions_of(pattern=f"^{mark}$") == [(mark, 0)]


def test_assign_reads_only_the_listed_partitions(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("assign"), partitions=3)
    fill(bootstrap, topic, 3, 4)
    assign = json.dumps({topic: [0, 2]})
    expected = offsets(topic, {0: range(4), 2: range(4)})
    stream, _ = run_available_now(spark, bootstrap, tmp_path / "ck", assign=assign, startingOffsets="earliest")
    assert placed(stream.rows) == expected and len(stream.rows) == 8
    assert placed(read_batch(spark, bootstrap, assign=assign)) == expected
    starting = json.dumps({topic: {"0": 3, "2": -2}})
    assert placed(read_batch(spark, bootstrap, assign=assign, startingOffsets=starting)) == offsets(
        topic, {0: range(3, 4), 2: range(4)}
    )


# --- where reading starts and ends ----------------------------------------------------------------


def test_starting_offsets_latest_and_per_partition_json(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("start"), partitions=2)
    other = create_topic(bootstrap, unique("start"), partitions=2)
    fill(bootstrap, topic, 2, 10)
    fill(bootstrap, other, 2, 10)

    query, collected = start_stream(spark, bootstrap, tmp_path / "latest", {"subscribe": topic})  # default latest
    try:
        query.processAllAvailable()
        produce(bootstrap, topic, ["after-0"], partition=0)
        produce(bootstrap, topic, ["after-1"], partition=1)
        query.processAllAvailable()
        assert placed(collected.rows) == {(topic, 0, 10), (topic, 1, 10)}
    finally:
        query.stop()

    # -2 earliest, -1 latest (streams only, as in Spark) and exact offsets, one query over two topics
    starting = json.dumps({topic: {"0": -2, "1": 7}, other: {"0": -1, "1": 3}})
    stream, _ = run_available_now(
        spark, bootstrap, tmp_path / "json", subscribe=f"{topic},{other}", startingOffsets=starting
    )
    assert placed(stream.rows) == offsets(topic, {0: range(11), 1: range(7, 11)}) | offsets(other, {1: range(3, 10)})
    starting = json.dumps({topic: {"0": -2, "1": 7}})
    assert placed(read_batch(spark, bootstrap, subscribe=topic, startingOffsets=starting)) == offsets(
        topic, {0: range(11), 1: range(7, 11)}
    )


def topics_of(end: dict) -> dict:
    """A batch's end offsets by topic, without the keys the source keeps beside them (the batch's start and plan)."""
    return {key: value for key, value in end.items() if not key.startswith("sparkeos:")}


def stream_reader_on_filled_topic(bootstrap: str, name: str) -> tuple[str, KafkaStreamReader]:
    """A 2-partition topic of 10 records per partition, and a stream reader of it with the default options, driven
    directly as Spark's source runner drives it."""
    topic = create_topic(bootstrap, unique(name), partitions=2)
    fill(bootstrap, topic, 2, 10)
    options = parse_source_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic}, streaming=True)
    return topic, KafkaStreamReader(options)


def test_initial_offsets_do_not_move_when_spark_asks_again(broker):
    """Spark asks for the initial offsets more than once as a query starts; `latest` must not drift between."""
    bootstrap = broker.bootstrap_servers
    topic, reader = stream_reader_on_filled_topic(bootstrap, "initial")
    try:
        first = reader.initialOffset()
        assert first == {topic: {"0": 10, "1": 10}}
        fill(bootstrap, topic, 2, 5)
        assert reader.initialOffset() == first
    finally:
        reader.stop()


def test_available_now_from_latest_survives_records_written_while_it_starts(broker):
    """Spark 4.3 calls prepareForTriggerAvailableNow, then initialOffset, then latestOffset. Records written between
    the first two put startingOffsets=latest past the target: nothing is left to read, and nothing was lost."""
    bootstrap = broker.bootstrap_servers
    topic, reader = stream_reader_on_filled_topic(bootstrap, "avnow")
    try:
        reader.prepareForTriggerAvailableNow()
        fill(bootstrap, topic, 2, 5)
        start = reader.initialOffset()
        assert start == {topic: {"0": 15, "1": 15}}
        assert reader.latestOffset(start, ReadAllAvailable()) == start
    finally:
        reader.stop()


def test_batch_zero_replayed_by_a_restarted_query_begins_where_it_first_began(broker):
    """Spark's offset log keeps only each batch's end. Replaying batch 0 after the driver died, Spark asks a new
    reader for the initial offsets, and `latest` has moved on since: the calls below are the ones Spark makes."""
    bootstrap = broker.bootstrap_servers
    topic, first = stream_reader_on_filled_topic(bootstrap, "replay0")
    restarted = KafkaStreamReader(first.options)
    try:
        initial = first.initialOffset()
        assert first.latestOffset(initial, ReadAllAvailable()) is initial  # no new data: the same offsets
        fill(bootstrap, topic, 2, 4)  # arrives between the query's start and its first batch
        logged = json.loads(json.dumps(first.latestOffset(initial, ReadAllAvailable())))
        fill(bootstrap, topic, 2, 3)  # arrives while the driver is down
        fresh = restarted.initialOffset()
        assert fresh == {topic: {"0": 17, "1": 17}}
        replayed = restarted.partitions(fresh, logged)
        assert sorted((r.partition, r.start, r.end) for r in replayed) == [(0, 10, 14), (1, 10, 14)]
        assert sum(batch.num_rows for r in replayed for batch in restarted.read(r)) == 8
        # Batch 1 begins at batch 0's end and reads the rest; with nothing new it plans no batch.
        end = restarted.latestOffset(logged, ReadAllAvailable())
        assert topics_of(end) == {topic: {"0": 17, "1": 17}}
        assert sorted((r.start, r.end) for r in restarted.partitions(logged, end)) == [(14, 17), (14, 17)]
        assert restarted.latestOffset(end, ReadAllAvailable()) is end
    finally:
        first.stop()
        restarted.stop()
        source_module._consumers.clear()  # the read above cached a consumer in this process


def test_a_batch_is_split_again_as_its_end_offsets_record_not_as_the_current_options_say(broker):
    """The ranges of a replayed batch must be the first run's: the sink decides per task whether a task's records
    were committed. A restarted query may run with other partitioning options, and its begin offsets may have been
    adjusted (lost offsets skipped, new partitions added) when the batch was planned."""
    bootstrap = broker.bootstrap_servers
    topic, plain = stream_reader_on_filled_topic(bootstrap, "plan")
    split = KafkaStreamReader(parse_source_options(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "minPartitions": "4"}, streaming=True))
    try:
        checkpointed = {topic: {"0": 2}}  # partition 1 appeared since: it begins at 0, which the end records
        logged = json.loads(json.dumps(split.latestOffset(checkpointed, ReadAllAvailable())))
        ranges = sorted((r.partition, r.start, r.end) for r in plain.partitions(checkpointed, logged))
        assert ranges == [(0, 2, 6), (0, 6, 10), (1, 0, 5), (1, 5, 10)]
        logged = json.loads(json.dumps(plain.latestOffset(checkpointed, ReadAllAvailable())))
        assert len(split.partitions(checkpointed, logged)) == 2
    finally:
        plain.stop()
        split.stop()


def test_a_new_partition_that_lost_records_before_the_query_saw_it_is_data_loss(broker):
    """Spark reads a partition added after the start from offset 0: a later log start means records were lost."""
    bootstrap = broker.bootstrap_servers
    topic, reader = stream_reader_on_filled_topic(bootstrap, "newloss")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        known = {topic: {"0": 10}}  # a checkpoint made when only partition 0 existed
        assert topics_of(reader.latestOffset(known, ReadAllAvailable())) == {topic: {"0": 10, "1": 10}}
        admin.delete_records([TopicPartition(topic, 1, 4)])[TopicPartition(topic, 1, 4)].result(30)
        with pytest.raises(Exception, match=f"new partition {topic}-1 starts at offset 4, not 0.*failOnDataLoss"):
            reader.latestOffset(known, ReadAllAvailable())
        lenient = KafkaStreamReader(parse_source_options(
            {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "failOnDataLoss": "false"}, streaming=True))
        end = lenient.latestOffset(known, ReadAllAvailable())
        assert sorted((r.partition, r.start, r.end) for r in lenient.partitions(known, end)) == [(1, 4, 10)]
        lenient.stop()
    finally:
        reader.stop()


def test_an_end_that_went_back_is_read_on_from_with_fail_on_data_loss_false(broker):
    """As Spark: a partition whose end is now below the checkpoint's offset (the topic was deleted and made
    again) reads nothing in that batch, and the next batch starts at the new end, not at the old offset."""
    bootstrap = broker.bootstrap_servers
    topic, strict = stream_reader_on_filled_topic(bootstrap, "wentback")
    reader = KafkaStreamReader(parse_source_options(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "failOnDataLoss": "false"}, streaming=True))
    try:
        checkpointed = {topic: {"0": 25, "1": 10}}
        with pytest.raises(Exception, match=f"the end of {topic}-0 went back from 25 to 10"):
            strict.latestOffset(checkpointed, ReadAllAvailable())
        end = reader.latestOffset(checkpointed, ReadAllAvailable())
        assert topics_of(end) == {topic: {"0": 10, "1": 10}}
        assert reader.partitions(checkpointed, end) == []
        fill(bootstrap, topic, 2, 3)
        following = reader.latestOffset(end, ReadAllAvailable())
        assert sorted((r.partition, r.start, r.end) for r in reader.partitions(end, following)) == [(0, 10, 13),
                                                                                                   (1, 10, 13)]
    finally:
        strict.stop()
        reader.stop()


def test_offset_maps_must_name_exactly_the_partitions_read(broker):
    from sparkeos.spark.kafka.source.planner import OffsetPlanner

    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("maps"), partitions=2)

    def resolve(option: str, offsets: dict, **subscription: str):
        options = parse_source_options({"kafka.bootstrap.servers": bootstrap, **subscription,
                                        option: json.dumps(offsets)}, streaming=False)
        planner = OffsetPlanner(options)
        spec = options.starting if option == "startingOffsets" else options.ending
        return planner.resolve(spec, planner.partitions(), ending=option == "endingOffsets")

    for option in ("startingOffsets", "endingOffsets"):
        with pytest.raises(ValueError, match=f"'{option}' names partitions that are not read: {topic}-2, other-0"):
            resolve(option, {topic: {"0": 0, "1": 0, "2": 0}, "other": {"0": 0}}, subscribe=topic)
        with pytest.raises(ValueError, match=f"'{option}' must give an offset for every partition; missing {topic}-1"):
            resolve(option, {topic: {"0": 0}}, subscribe=topic)
    # With a pattern, a partition left out of the start map starts at earliest; left out of the end map it is an
    # error, not a partition silently read up to its start.
    assert resolve("startingOffsets", {topic: {"1": 0}}, subscribePattern=f"^{topic}$") == {(topic, 0): 0,
                                                                                            (topic, 1): 0}
    with pytest.raises(ValueError, match=f"missing {topic}-1"):
        resolve("endingOffsets", {topic: {"0": 0}}, subscribePattern=f"^{topic}$")


def test_min_offsets_per_trigger_does_not_hold_back_the_first_batch_of_a_start(broker):
    """As Spark's source: no batch has run since the start, so maxTriggerDelay has passed already."""
    from pyspark.sql.streaming.datasource import ReadMinRows

    bootstrap = broker.bootstrap_servers
    topic, _unused = stream_reader_on_filled_topic(bootstrap, "firstmin")
    _unused.stop()
    reader = KafkaStreamReader(parse_source_options(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest",
         "minOffsetsPerTrigger": "1000"}, streaming=True))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMinRows(1000))
        assert end[topic] == {"0": 10, "1": 10}, "20 records waited for 1000 at the start"
        fill(bootstrap, topic, 2, 1)
        assert reader.latestOffset(end, ReadMinRows(1000)) is end  # from now on the minimum holds
    finally:
        reader.stop()


def test_spark_replays_an_unfinished_batch_zero_from_the_start_it_first_had(spark, broker, tmp_path):
    """After a restart, Spark begins an unfinished batch 0 at the source's initialOffset() asked afresh: `latest`
    (here a changed startingOffsets) is then another place. The start kept in batch 0's end offsets wins."""
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("replay0"))
    fill(bootstrap, topic, 1, 10)
    checkpoint = tmp_path / "ck"
    first, _ = run_available_now(spark, bootstrap, checkpoint, subscribe=topic,
                                 startingOffsets=json.dumps({topic: {"0": 2}}))
    assert placed(first.rows) == offsets(topic, {0: range(2, 10)})
    # The driver died after batch 0 was planned and before Spark's commit log recorded it.
    (checkpoint / "commits" / "0").unlink()
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    replayed, _ = run_available_now(spark, bootstrap, checkpoint, subscribe=topic,
                                    startingOffsets=json.dumps({topic: {"0": 6}}))
    assert sorted(replayed.batches) == [0]
    assert placed(replayed.rows) == offsets(topic, {0: range(2, 10)})


def test_ending_offsets_latest_and_per_partition_json(spark, broker):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("end"), partitions=2)
    fill(bootstrap, topic, 2, 6)
    everything = offsets(topic, {0: range(6), 1: range(6)})
    assert placed(read_batch(spark, bootstrap, subscribe=topic, endingOffsets="latest")) == everything
    ending = json.dumps({topic: {"0": 4, "1": -1}})
    assert placed(read_batch(spark, bootstrap, subscribe=topic, endingOffsets=ending)) == offsets(
        topic, {0: range(4), 1: range(6)}
    )
    both = {"startingOffsets": json.dumps({topic: {"0": 2, "1": 5}}), "endingOffsets": ending}
    assert placed(read_batch(spark, bootstrap, subscribe=topic, **both)) == offsets(
        topic, {0: range(2, 4), 1: range(5, 6)}
    )


def test_starting_offsets_group_uses_committed_offsets_then_auto_offset_reset(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("group"), partitions=2)
    fill(bootstrap, topic, 2, 5)
    for reset, from_partition_1 in (("earliest", range(5)), ("latest", range(0))):
        group = unique(f"g-{reset}")
        commit_group_offsets(bootstrap, group, topic, {0: 3})  # partition 1 has no committed offset
        options = {
            "subscribe": topic,
            "startingOffsets": "group",
            "kafka.group.id": group,
            "kafka.auto.offset.reset": reset,
            "commitOffsetsToGroup": "false",
        }
        expected = offsets(topic, {0: range(3, 5), 1: from_partition_1})
        stream, _ = run_available_now(spark, bootstrap, tmp_path / reset, **options)
        assert placed(stream.rows) == expected, reset
        assert placed(read_batch(spark, bootstrap, **options)) == expected, reset


def test_starting_timestamps_and_ending_timestamps(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("time"), partitions=2)
    base = int(time.time() * 1000) - 3_600_000  # recent enough that retention keeps them
    fill(bootstrap, topic, 2, 10, timestamps=[base + 1000 * i for i in range(10)])

    stream, _ = run_available_now(
        spark, bootstrap, tmp_path / "ts", subscribe=topic, startingTimestamp=str(base + 2500)
    )
    assert placed(stream.rows) == offsets(topic, {0: range(3, 10), 1: range(3, 10)})

    by_partition = json.dumps({topic: {"0": base + 2500, "1": base + 8000}})
    expected = offsets(topic, {0: range(3, 10), 1: range(8, 10)})
    stream, _ = run_available_now(
        spark, bootstrap, tmp_path / "by", subscribe=topic, startingOffsetsByTimestamp=by_partition
    )
    assert placed(stream.rows) == expected
    assert placed(read_batch(spark, bootstrap, subscribe=topic, startingOffsetsByTimestamp=by_partition)) == expected

    too_new = json.dumps({topic: {"0": base + 60_000, "1": base}})
    message = failure_of_batch(spark, bootstrap, subscribe=topic, startingOffsetsByTimestamp=too_new)
    assert "startingOffsetsByTimestamp" in message and "startingOffsetsByTimestampStrategy" in message
    rows = read_batch(
        spark,
        bootstrap,
        subscribe=topic,
        startingOffsetsByTimestamp=too_new,
        startingOffsetsByTimestampStrategy="latest",
    )
    assert placed(rows) == offsets(topic, {1: range(10)})

    partial = json.dumps({topic: {"0": base}})
    message = failure_of_batch(spark, bootstrap, subscribe=topic, startingOffsetsByTimestamp=partial)
    assert "startingOffsetsByTimestamp' must give a timestamp for every partition; missing " + f"{topic}-1" in message

    ending = read_batch(spark, bootstrap, subscribe=topic, endingTimestamp=str(base + 4500))
    assert placed(ending) == offsets(topic, {0: range(5), 1: range(5)})
    ending_by = json.dumps({topic: {"0": base + 1000, "1": base + 60_000}})  # none that new: to the end
    ending = read_batch(spark, bootstrap, subscribe=topic, endingOffsetsByTimestamp=ending_by)
    assert placed(ending) == offsets(topic, {0: range(1), 1: range(10)})


def test_checkpoint_wins_over_starting_offsets_on_restart(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("ck"), partitions=2)
    fill(bootstrap, topic, 2, 5)
    checkpoint = tmp_path / "ck"
    first, _ = run_available_now(spark, bootstrap, checkpoint, subscribe=topic, startingOffsets="earliest")
    assert placed(first.rows) == offsets(topic, {0: range(5), 1: range(5)})

    produce(bootstrap, topic, ["x0"], partition=0)
    produce(bootstrap, topic, ["x1"], partition=1)
    # latest would skip x0/x1 if it were used; the checkpoint says where to continue
    second, _ = run_available_now(spark, bootstrap, checkpoint, subscribe=topic, startingOffsets="latest")
    assert placed(second.rows) == {(topic, 0, 5), (topic, 1, 5)} and len(second.rows) == 2

    produce(bootstrap, topic, ["y0"], partition=0)
    # earliest would re-read everything if it were used
    third, _ = run_available_now(spark, bootstrap, checkpoint, subscribe=topic, startingOffsets="earliest")
    assert placed(third.rows) == {(topic, 0, 6)} and len(third.rows) == 1

    # Group offsets are for lag tools only: rewound ones would re-read everything if they were used, and the
    # group then follows the checkpoint's batch (commitOffsetsToGroup is on with a group id).
    group = unique("rewound")
    commit_group_offsets(bootstrap, group, topic, {0: 0, 1: 0})
    produce(bootstrap, topic, ["z1"], partition=1)
    fourth, _ = run_available_now(spark, bootstrap, checkpoint, subscribe=topic, startingOffsets="group",
                                  **{"kafka.group.id": group})
    assert placed(fourth.rows) == {(topic, 1, 6)} and len(fourth.rows) == 1
    wait_for(lambda: group_offsets(bootstrap, group, topic, 2) == {0: 7, 1: 7}, timeout_s=30,
             what="the group's offsets at the end of the checkpoint's batch")


# --- how much each trigger reads -------------------------------------------------------------------


def test_max_offsets_per_trigger_spreads_each_batch_over_partitions_and_reports_latest(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("max"), partitions=3)
    fill(bootstrap, topic, 3, 100)
    collected, progress = run_available_now(
        spark, bootstrap, tmp_path / "ck", subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="40"
    )
    assert placed(collected.rows) == offsets(topic, {p: range(100) for p in range(3)})
    assert len(collected.rows) == 300
    sizes = collected.sizes()
    assert len(sizes) >= 8 and max(sizes) <= 40, sizes
    for batch_id, rows in collected.batches.items():
        assert {row["partition"] for row in rows} == {0, 1, 2}, f"batch {batch_id} read only some partitions"
    with_data = [p for p in progress if p["numInputRows"] > 0]
    assert all(p["numInputRows"] <= 40 for p in with_data)
    first = with_data[0]["sources"][0]
    # reportLatestOffset: the newest offsets Kafka had, beyond what the rate-limited batch read
    assert json.loads(first["latestOffset"]) == {topic: {"0": 100, "1": 100, "2": 100}}
    assert sum(json.loads(first["endOffset"])[topic].values()) <= 40


# The trigger's waiting is the source's own doing, on offsets any Kafka version lists alike.
@pytest.mark.apache_kafka(newest_only=True)
def test_min_offsets_per_trigger_waits_for_enough_records_or_max_trigger_delay(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("min"))
    produce(bootstrap, topic, [f"a{i}" for i in range(60)])
    options = {"subscribe": topic, "startingOffsets": "earliest", "minOffsetsPerTrigger": "50", "maxTriggerDelay": "6s"}
    query, collected = start_stream(spark, bootstrap, tmp_path / "ck", options)
    try:
        wait_for(lambda: len(collected.rows) == 60, timeout_s=60, what="the first 60 records")
        produce(bootstrap, topic, [f"b{i}" for i in range(20)])
        time.sleep(2)
        assert len(collected.rows) == 60, "a batch ran with fewer than minOffsetsPerTrigger records"
        produce(bootstrap, topic, [f"c{i}" for i in range(40)])
        wait_for(lambda: len(collected.rows) == 120, timeout_s=30, what="a batch of 60 records")
        assert collected.sizes()[-1] == 60

        produced_at = time.monotonic()
        produce(bootstrap, topic, [f"d{i}" for i in range(10)])
        wait_for(lambda: len(collected.rows) == 130, timeout_s=30, what="the delayed batch")
        last = max(collected.batches)
        assert len(collected.batches[last]) == 10
        assert collected.arrival[last] - produced_at >= 3, "10 < minOffsetsPerTrigger records ran before the delay"
    finally:
        query.stop()

    # Trigger.AvailableNow must not stop short of its target waiting for a minimum that never comes.
    options["minOffsetsPerTrigger"] = "1000"
    collected, _ = run_available_now(spark, bootstrap, tmp_path / "now", **options)
    assert len(collected.rows) == 130


def test_min_partitions_and_max_records_per_partition_split_ranges(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("split"))
    produce(bootstrap, topic, [str(i) for i in range(100)])

    def spark_partition_sizes(options: dict) -> list[int]:
        from pyspark.sql import functions as F

        frame = batch_frame(spark, bootstrap, {"subscribe": topic, **options})
        per_partition = frame.groupBy(F.spark_partition_id().alias("id")).count().collect()
        assert frame.rdd.getNumPartitions() == len(per_partition)
        assert sorted(placed(r.asDict() for r in frame.collect())) == sorted(offsets(topic, {0: range(100)}))
        return sorted(row["count"] for row in per_partition)

    assert spark_partition_sizes({}) == [100]
    assert spark_partition_sizes({"minPartitions": "4"}) == [25, 25, 25, 25]
    sizes = spark_partition_sizes({"maxRecordsPerPartition": "30"})
    assert len(sizes) == 4 and max(sizes) <= 30

    collected = Collected(count_partitions=True)
    run_available_now(
        spark,
        bootstrap,
        tmp_path / "ck",
        collected=collected,
        subscribe=topic,
        startingOffsets="earliest",
        minPartitions="5",
    )
    assert list(collected.spark_partitions.values()) == [5]
    assert len(collected.rows) == 100


def test_min_partitions_shares_parts_as_spark_does():
    """Spark's KafkaOffsetRangeCalculator: small ranges stay whole, the parts left go to the big ones, and a
    share is rounded half up."""
    from sparkeos.spark.kafka.source.planner import plan_ranges

    def sizes(begin: dict, end: dict, min_partitions: int) -> list[tuple[int, int]]:
        return [(r.partition, r.size) for r in plan_ranges(begin, end, min_partitions, None)]

    skewed = {("t", 0): 1, ("t", 1): 500, ("t", 2): 10_000}
    # Shares of 4: 0.0004, 0.19 and 3.8 parts. The two small ranges keep one part each; 2 parts are left.
    assert sizes(dict.fromkeys(skewed, 0), skewed, 4) == [(0, 1), (1, 500), (2, 5000), (2, 5000)]
    # Shares of 10: 2.5 and 7.5 parts, rounded up to 3 and 8 (not to the even 2 and 8).
    # Each part takes an even share of what is left: 30 in 8 parts is 3, 3, then six of 4.
    assert sizes({("t", 0): 0, ("t", 1): 0}, {("t", 0): 10, ("t", 1): 30}, 10) == [(0, 3), (0, 3), (0, 4)] + [
        (1, 3), (1, 3)] + [(1, 4)] * 6


def test_ranges_larger_than_one_arrow_batch_read_every_record_once(spark, broker):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("big"), partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i in range(20_000):
        producer.produce(topic, value=str(i).encode(), partition=i % 2)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    from pyspark.sql import functions as F

    frame = batch_frame(spark, bootstrap, {"subscribe": topic})
    summary = frame.groupBy("partition").agg(
        F.count("*").alias("rows"),
        F.countDistinct("offset").alias("distinct"),
        F.min("offset").alias("first"),
        F.max("offset").alias("last"),
        F.sum(F.col("value").cast("string").cast("long")).alias("total"),
    )
    by_partition = {row["partition"]: row.asDict() for row in summary.collect()}
    for partition in (0, 1):
        assert by_partition[partition]["rows"] == by_partition[partition]["distinct"] == 10_000
        assert (by_partition[partition]["first"], by_partition[partition]["last"]) == (0, 9_999)
        assert by_partition[partition]["total"] == sum(range(partition, 20_000, 2))


# --- transactions ------------------------------------------------------------------------------------


def transactional_layout(bootstrap: str, topic: str) -> list[str]:
    """Committed, aborted, plain, aborted and committed records with their markers; returns the visible ones.

    Offsets: c0-c2 0-2 (marker 3), a0-a2 4-6 (abort marker 7), p0 8, b0-b1 9-10 (abort marker 11), d0 12
    (marker 13): the partition ends on a marker, and aborted gaps sit in the middle.
    """
    produce_transaction(bootstrap, topic, ["c0", "c1", "c2"], commit=True)
    produce_transaction(bootstrap, topic, ["a0", "a1", "a2"], commit=False)
    produce(bootstrap, topic, ["p0"], partition=0)
    produce_transaction(bootstrap, topic, ["b0", "b1"], commit=False)
    produce_transaction(bootstrap, topic, ["d0"], commit=True)
    return ["c0", "c1", "c2", "d0", "p0"]


def test_read_committed_skips_aborted_records_and_markers_in_any_range_split(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("txn"))
    visible = transactional_layout(bootstrap, topic)
    assert values(read_batch(spark, bootstrap, subscribe=topic)) == visible
    # Ranges of two offsets: some hold only aborted records, only a marker, or end on one.
    assert values(read_batch(spark, bootstrap, subscribe=topic, maxRecordsPerPartition="2")) == visible
    for n in (1, 3):
        ending = json.dumps({topic: {"0": n}})
        assert values(read_batch(spark, bootstrap, subscribe=topic, endingOffsets=ending)) == visible[:n]
    starting = json.dumps({topic: {"0": 5}})  # starts inside the aborted transaction
    assert values(read_batch(spark, bootstrap, subscribe=topic, startingOffsets=starting)) == ["d0", "p0"]
    uncommitted = read_batch(spark, bootstrap, subscribe=topic, **{"kafka.isolation.level": "read_uncommitted"})
    assert values(uncommitted) == sorted([*visible, "a0", "a1", "a2", "b0", "b1"])
    stream, _ = run_available_now(
        spark,
        bootstrap,
        tmp_path / "uncommitted",
        subscribe=topic,
        startingOffsets="earliest",
        **{"kafka.isolation.level": "read_uncommitted"},
    )
    assert values(stream.rows) == values(uncommitted)

    # One offset per trigger: every kind of range in turn, each finishing without waiting for more data.
    collected, progress = run_available_now(
        spark, bootstrap, tmp_path / "one", subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="2"
    )
    assert values(collected.rows) == visible
    assert len(progress) >= 7


def test_stream_read_committed_waits_for_open_transactions(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("open"))
    query, collected = start_stream(
        spark, bootstrap, tmp_path / "ck", {"subscribe": topic, "startingOffsets": "earliest"}
    )
    try:
        visible = transactional_layout(bootstrap, topic)
        query.processAllAvailable()
        assert values(collected.rows) == visible

        produce_transaction(bootstrap, topic, ["only-aborted"], commit=False)  # a batch with no visible record
        query.processAllAvailable()
        assert values(collected.rows) == visible

        open_txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("open")})
        open_txn.init_transactions(30)
        open_txn.begin_transaction()
        open_txn.produce(topic, value=b"o0", partition=0)
        open_txn.produce(topic, value=b"o1", partition=0)
        assert open_txn.flush(30) == 0
        produce(bootstrap, topic, ["after-open"], partition=0)
        query.processAllAvailable()
        assert values(collected.rows) == visible, "records at or after an open transaction were read"

        open_txn.commit_transaction(30)
        # Apache Kafka answers EndTxn once the commit is decided and writes the partitions' markers after it, so
        # the last stable offset may move a moment after commit_transaction returns.
        wait_for(lambda: query.processAllAvailable() or len(collected.rows) >= len(visible) + 3,
                 what="the committed transaction's records")
        assert values(collected.rows) == sorted([*visible, "o0", "o1", "after-open"])
        assert len(collected.rows) == len(visible) + 3
    finally:
        query.stop()


# --- data loss ---------------------------------------------------------------------------------------


def test_fail_on_data_loss_after_delete_records(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("loss"))
    produce(bootstrap, topic, [str(i) for i in range(100)])
    checkpoint = tmp_path / "ck"
    first, _ = run_available_now(spark, bootstrap, checkpoint, subscribe=topic, startingOffsets="earliest")
    assert len(first.rows) == 100

    produce(bootstrap, topic, [str(i) for i in range(100, 200)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition(topic, 0, 150)])[TopicPartition(topic, 0, 150)].result(30)

    message = failure_of_stream(spark, bootstrap, checkpoint, subscribe=topic, startingOffsets="earliest")
    assert "failOnDataLoss" in message
    message = failure_of_batch(spark, bootstrap, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 120}}))
    assert "failOnDataLoss" in message

    rest, _ = run_available_now(spark, bootstrap, checkpoint, subscribe=topic, failOnDataLoss="false")
    assert placed(rest.rows) == offsets(topic, {0: range(150, 200)})
    rows = read_batch(
        spark, bootstrap, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 120}}), failOnDataLoss="false"
    )
    assert placed(rows) == offsets(topic, {0: range(150, 200)})


def test_fail_on_data_loss_after_a_subscribed_topic_is_deleted(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    kept = create_topic(bootstrap, unique("kept"))
    doomed = create_topic(bootstrap, unique("doomed"))
    produce(bootstrap, kept, ["k0"])
    produce(bootstrap, doomed, ["d0"])
    checkpoint = tmp_path / "ck"
    options = {"subscribe": f"{kept},{doomed}", "startingOffsets": "earliest"}
    first, _ = run_available_now(spark, bootstrap, checkpoint, **options)
    assert values(first.rows) == ["d0", "k0"]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([doomed])[doomed].result(30)
    wait_for(lambda: doomed not in admin.list_topics(timeout=10).topics, what="the topic deletion")
    produce(bootstrap, kept, ["k1"])
    assert "failOnDataLoss" in failure_of_stream(spark, bootstrap, checkpoint, **options)
    rest, _ = run_available_now(spark, bootstrap, checkpoint, failOnDataLoss="false", **options)
    assert placed(rest.rows) == {(kept, 0, 1)}


# --- offsets reported to a consumer group --------------------------------------------------------


def test_commit_offsets_to_group_follows_the_batches(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("lag"), partitions=2)
    fill(bootstrap, topic, 2, 7)
    group = unique("lag-group")
    query, collected = start_stream(
        spark,
        bootstrap,
        tmp_path / "on",
        {
            "subscribe": topic,
            "startingOffsets": "earliest",
            "kafka.group.id": group,
        },
    )
    try:
        query.processAllAvailable()
        wait_for(
            lambda: group_offsets(bootstrap, group, topic, 2) == {0: 7, 1: 7},
            timeout_s=30,
            what="group offsets at the end of the first batch",
        )
        produce(bootstrap, topic, ["more"], partition=1)
        query.processAllAvailable()
        wait_for(
            lambda: group_offsets(bootstrap, group, topic, 2) == {0: 7, 1: 8},
            timeout_s=30,
            what="group offsets following the next batch",
        )
        assert len(collected.rows) == 15
    finally:
        query.stop()

    silent = unique("silent-group")
    collected, _ = run_available_now(
        spark,
        bootstrap,
        tmp_path / "off",
        subscribe=topic,
        startingOffsets="earliest",
        commitOffsetsToGroup="false",
        **{"kafka.group.id": silent},
    )
    assert len(collected.rows) == 15
    assert group_offsets(bootstrap, silent, topic, 2) == {}


# --- errors before any record is read --------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "t", "startingOfsets": "earliest"}, "did you mean 'startingOffsets'"),
        ({}, "'subscribe', 'subscribePattern' or 'assign'"),
        ({"subscribe": "t", "assign": '{"t": [0]}'}, "'subscribe', 'assign'"),
        ({"subscribe": "t", "startingOffsets": "{t: 1}"}, "'startingOffsets' is not valid JSON"),
        ({"subscribe": "t", "startingOffsets": "group"}, "'kafka.group.id'"),
        ({"subscribe": "t", "kafka.enable.auto.commit": "true"}, "'kafka.enable.auto.commit'"),
        ({"subscribe": "t", "startingOffsets": "latest"}, "'startingOffsets' cannot be 'latest' for batch"),
        ({"subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, "t-0 cannot start at latest (-1) in batch"),
        ({"subscribe": "t", "endingOffsets": "earliest"}, "'endingOffsets' cannot be 'earliest'"),
    ],
)
def test_bad_options_fail_batch_reads_naming_the_option(spark, broker, options, named):
    assert named in failure_of_batch(spark, broker.bootstrap_servers, **options)


def test_bad_options_fail_streams_at_load_or_before_any_batch(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    # Like Spark's Kafka source, options no read could use fail the DataFrame's definition.
    for options, named in [
        ({"subscribe": "t", "maxOfsetsPerTrigger": "5"}, "did you mean 'maxOffsetsPerTrigger'"),
        ({"subscribe": "t", "startingOffsets": "{t: 1}"}, "'startingOffsets' is not valid JSON"),
        ({}, "'subscribe', 'subscribePattern' or 'assign'"),
    ]:
        reader = spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
        with pytest.raises(AnalysisException) as failure:
            reader.options(**options).load()
        assert named in str(failure.value)
    # Options only a batch read takes are known to be wrong once the stream starts.
    message = failure_of_stream(spark, bootstrap, tmp_path / "a", subscribe="t", endingOffsets="latest")
    assert "'endingOffsets' is not supported in streaming" in message


def test_unreachable_broker_is_a_clear_error_within_the_api_timeout(spark, tmp_path):
    options = {"subscribe": "t", "kafka.default.api.timeout.ms": "2000"}
    started = time.monotonic()
    message = failure_of_batch(spark, "127.0.0.1:1", **options)
    assert "kafka.bootstrap.servers=127.0.0.1:1" in message
    message = failure_of_stream(spark, "127.0.0.1:1", tmp_path / "ck", **options)
    assert "kafka.bootstrap.servers=127.0.0.1:1" in message
    assert time.monotonic() - started < 40


def test_batch_read_of_an_empty_topic_is_empty(spark, broker):
    """Spark gives a batch read without offset ranges one placeholder partition; it must read nothing."""
    from support.spark import create_topic, unique

    topic = create_topic(broker.bootstrap_servers, unique("empty"), partitions=2)
    frame = (spark.read.format("sparkeos.kafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
             .option("subscribe", topic).load())
    assert frame.count() == 0
