"""The sparkeos.kafka sink: Spark's Kafka sink columns, delivery guarantees, batch writes, start-up checks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from pathlib import Path

import pytest

from sparkeos.broker import EmbeddedBroker
from sparkeos.ports import free_port
from sparkeos.processes import descendants
from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from sparkeos.verify import assert_exactly_once, count_records, read_records, read_values
from support import apache_kafka
from support.crash import Driver, command_line, pipeline_job_args
from support.spark import (
    CLIENT_CACHE_TIMEOUT_S,
    arm_failpoint,
    clear_failpoints,
    create_topic,
    fired,
    produce,
    unique,
    wait_for,
)
from support.wire import WireClient

pytestmark = pytest.mark.apache_kafka


def stream_of(spark, bootstrap: str, topic: str, **options: str):
    reader = (
        spark.readStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_to_end(frame, bootstrap: str, checkpoint: str, **options: str):
    """Write `frame` to the sink until the input is used up; the stopped query."""
    writer = frame.writeStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
    writer = writer.option("checkpointLocation", checkpoint)
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return query


def test_columns_key_topic_partition_headers_like_spark(spark, broker, tmp_path):
    """value/key as strings, a per-row topic column routing to two topics, a partition column, headers."""
    from pyspark.sql import functions as F

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    evens, odds = create_topic(bootstrap, unique("even"), 3), create_topic(bootstrap, unique("odd"), 3)
    produce(bootstrap, source, [str(i) for i in range(300)])
    number = F.col("value").cast("string").cast("int")
    frame = stream_of(spark, bootstrap, source).select(
        F.concat(F.lit("k"), (number % 5).cast("string")).alias("key"),
        F.col("value").cast("string").alias("value"),
        F.when(number % 2 == 0, F.lit(evens)).otherwise(F.lit(odds)).alias("topic"),
        (number % 3).cast("int").alias("partition"),
        F.array(
            F.struct(F.lit("origin").alias("key"), F.col("offset").cast("string").cast("binary").alias("value")),
            F.struct(F.lit("copy").alias("key"), F.concat(F.lit(b"n="), F.col("value")).alias("value")),
        ).alias("headers"),
    )
    run_to_end(frame, bootstrap, str(tmp_path / "ck"))
    even_rows = read_records(bootstrap, evens)
    odd_rows = read_records(bootstrap, odds)
    assert sorted(int(v) for _, _, _, v, _ in even_rows) == list(range(0, 300, 2))
    assert sorted(int(v) for _, _, _, v, _ in odd_rows) == list(range(1, 300, 2))
    for partition, _offset, key, value, headers in even_rows + odd_rows:
        assert partition == int(value) % 3
        assert key == f"k{int(value) % 5}".encode()
        assert [h[0] for h in headers] == ["origin", "copy"]
        assert headers[1][1] == b"n=" + value


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_keyed_records_land_on_the_partition_the_java_client_would_choose(spark, broker, guarantee):
    """Spark's Kafka sink (the Java client) puts a key on murmur2(key) mod partitions; so does ours."""
    from kafka.partitioner.default import murmur2  # kafka-python's port of the Java client's hash

    bootstrap = broker.bootstrap_servers
    sink = create_topic(bootstrap, unique("out"), partitions=5)
    rows = [(f"key-{i}".encode(), f"value-{i}".encode()) for i in range(200)]
    (spark.createDataFrame(rows, "key binary, value binary").repartition(2).write.format("sparkeos.kafka")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", sink).option("deliveryGuarantee", guarantee)
     .mode("append").save())
    written = read_records(bootstrap, sink)
    assert sorted((key, value) for _, _, key, value, _ in written) == sorted(rows)
    assert {p for p, *_ in written} == set(range(5))
    for partition, _offset, key, _value, _headers in written:
        assert partition == (murmur2(key) & 0x7FFFFFFF) % 5, key


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_null_keys_stay_null_in_a_partition_of_only_null_keys_and_in_one_of_mixed_keys(spark, broker, guarantee):
    bootstrap = broker.bootstrap_servers
    sink = create_topic(bootstrap, unique("out"), partitions=3)
    # parallelize keeps the order in contiguous slices: the first 100 rows are one task's, the next 100 the other's.
    rows = [(None, f"null-{i}".encode()) for i in range(100)]
    rows += [(None if i % 2 else f"key-{i}".encode(), f"mixed-{i}".encode()) for i in range(100)]
    frame = spark.sparkContext.parallelize(rows, 2).toDF("key binary, value binary")
    (frame.write.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
     .option("deliveryGuarantee", guarantee).mode("append").save())
    written = read_records(bootstrap, sink)
    assert_exactly_once(rows, [(key, value) for _, _, key, value, _ in written])


def test_topic_option_is_the_default_and_a_missing_topic_is_an_error(spark, broker, tmp_path):
    from pyspark.sql import functions as F

    bootstrap = broker.bootstrap_servers
    routed = create_topic(bootstrap, unique("in"), partitions=2)
    named, default = create_topic(bootstrap, unique("named")), create_topic(bootstrap, unique("default"))
    produce(bootstrap, routed, [str(i) for i in range(100)])
    number = F.col("value").cast("string").cast("int")
    rows = stream_of(spark, bootstrap, routed).select(
        "value", F.when(number % 3 == 0, F.lit(named)).otherwise(F.lit(None).cast("string")).alias("topic"))
    run_to_end(rows, bootstrap, str(tmp_path / "routed"), topic=default)
    assert sorted(int(v) for v in read_values(bootstrap, named)) == list(range(0, 100, 3))
    assert sorted(int(v) for v in read_values(bootstrap, default)) == [i for i in range(100) if i % 3]

    source = create_topic(bootstrap, unique("in"))
    produce(bootstrap, source, ["a"])
    frame = stream_of(spark, bootstrap, source).select("value")
    query = (frame.writeStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    with pytest.raises(Exception, match="set the sink option 'topic' or give the input a 'topic' column"):
        query.awaitTermination(60)


def test_missing_value_column_fails_before_anything_is_written(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, ["a", "b"])
    frame = stream_of(spark, bootstrap, source).selectExpr("key", "value AS payload")
    query = (frame.writeStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", sink).option("checkpointLocation", str(tmp_path / "ck")).start())
    with pytest.raises(Exception, match="needs a 'value' column"):
        query.awaitTermination(60)
    assert read_values(bootstrap, sink) == []


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"topik": "x"}, "did you mean 'topic'"),
        ({"deliveryGuarantee": "at_least_once", "transactionalIdPrefix": "p"}, "'transactionalIdPrefix' only applies"),
        ({"kafka.enable.idempotence": "false"}, "contradicts deliveryGuarantee=exactly_once"),
    ],
)
def test_bad_sink_options_fail_the_query_before_anything_is_written(spark, broker, tmp_path, options, named):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, ["a", "b"])
    with pytest.raises(Exception, match=named):
        run_to_end(stream_of(spark, bootstrap, source).select("value"), bootstrap, str(tmp_path / "ck"),
                   topic=sink, **options)
    assert read_values(bootstrap, sink) == []


@pytest.mark.parametrize("kind", ["embedded", *apache_kafka.tested_versions()])
def test_transaction_timeout_above_broker_maximum_fails_before_writing(spark, tmp_path, kind):
    """The seed's problem 1: transaction.timeout.ms larger than the broker's transaction.max.timeout.ms."""
    if kind == "embedded":
        started = EmbeddedBroker(tmp_path / "broker", transaction_max_timeout_ms=30_000)
    else:
        started = apache_kafka.ApacheKafkaCluster(tmp_path / "kafka", kind,
                                                  settings={"transaction.max.timeout.ms": 30_000})
    with started as broker:
        bootstrap = broker.bootstrap_servers
        source = create_topic(bootstrap, unique("in"))
        sink = create_topic(bootstrap, unique("out"))
        produce(bootstrap, source, ["a", "b"])
        query = (stream_of(spark, bootstrap, source).select("value").writeStream.format("sparkeos.kafka")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
                 .option("kafka.transaction.timeout.ms", "60000")
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        with pytest.raises(Exception) as failure:
            query.awaitTermination(60)
        message = str(failure.value)
        assert "kafka.transaction.timeout.ms=60000" in message
        assert "transaction.max.timeout.ms=30000" in message
        assert read_values(bootstrap, sink) == []


@pytest.mark.parametrize("guarantee", ["at_least_once", "none"])
def test_non_transactional_guarantees_deliver_everything_without_failures(spark, broker, tmp_path, guarantee):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(500)])
    query = run_to_end(stream_of(spark, bootstrap, source).select("value"), bootstrap, str(tmp_path / "ck"),
                       topic=sink, deliveryGuarantee=guarantee)
    assert_exactly_once((str(i).encode() for i in range(500)), read_values(bootstrap, sink))
    # Below any consumer: plain batches, no transaction, and no marker of a committed batch for this query.
    with WireClient(bootstrap) as wire:
        log = wire.log_batches(sink)
    assert log and not any(batch.transactional or batch.control for batch in log)
    markers = [json.loads(v) for v in read_values(bootstrap, DEFAULT_MARKER_TOPIC)]
    assert not [m for m in markers if query.id in m["transactional_id"]]


def test_two_queries_writing_one_topic_never_share_transactional_ids(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    first, second = create_topic(bootstrap, unique("a"), 2), create_topic(bootstrap, unique("b"), 2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, first, [f"a{i}" for i in range(300)])
    produce(bootstrap, second, [f"b{i}" for i in range(300)])
    queries = [
        stream_of(spark, bootstrap, topic).select("value").writeStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
        .option("checkpointLocation", str(tmp_path / topic)).start()
        for topic in (first, second)
    ]
    for query in queries:
        query.processAllAvailable()
    ids = {query.id for query in queries}
    for query in queries:
        query.stop()
    expected = Counter([f"a{i}".encode() for i in range(300)] + [f"b{i}".encode() for i in range(300)])
    assert_exactly_once(expected, read_values(bootstrap, sink))
    # The marker topic is shared by every query of the cluster: the markers of this sink topic are keyed
    # "<transactional id>/<query id>/<topic>".
    markers = [json.loads(record.value) for record in read_records(bootstrap, DEFAULT_MARKER_TOPIC)
               if record.key.decode().endswith(f"/{sink}")]
    prefixes = {m["transactional_id"].rsplit("-", 1)[0] for m in markers}
    assert prefixes == {f"sparkeos-{query_id}" for query_id in ids}


def test_a_transactional_id_prefix_reused_with_a_new_checkpoint_writes_every_batch(spark, broker, tmp_path):
    """A new checkpoint is a new query, whose batches start at 0 again: the markers the old query left under
    the same transactional ids must not make the new query skip its batches."""
    bootstrap = broker.bootstrap_servers
    sink = create_topic(bootstrap, unique("out"))
    prefix = unique("shared")
    expected = Counter()
    for run in ("old", "new"):
        source = create_topic(bootstrap, unique(run), 2)
        values = [f"{run}{i}" for i in range(300)]
        produce(bootstrap, source, values)
        expected.update(v.encode() for v in values)
        run_to_end(stream_of(spark, bootstrap, source, maxOffsetsPerTrigger="100").select("value"), bootstrap,
                   str(tmp_path / run), topic=sink, transactionalIdPrefix=prefix)
    assert_exactly_once(expected, read_values(bootstrap, sink))


def test_a_task_whose_rows_the_query_drops_commits_no_transaction(spark, broker, tmp_path):
    """Empty tasks commit no transaction, though their producer is set up before their input is known: the tasks
    of input partition 1, whose rows the query filters out, leave no marker; partition 0's commit each batch."""
    bootstrap = broker.bootstrap_servers
    source, sink = create_topic(bootstrap, unique("in"), 2), create_topic(bootstrap, unique("out"))
    prefix = unique("empty")
    produce(bootstrap, source, [f"kept{i}" for i in range(200)], partition=0)
    produce(bootstrap, source, [f"dropped{i}" for i in range(200)], partition=1)
    frame = stream_of(spark, bootstrap, source, maxOffsetsPerTrigger="200").where("partition = 0").select("value")
    run_to_end(frame, bootstrap, str(tmp_path / "checkpoint"), topic=sink, transactionalIdPrefix=prefix)
    assert_exactly_once(Counter(f"kept{i}".encode() for i in range(200)), read_values(bootstrap, sink))
    markers = [json.loads(value) for _p, _o, _k, value, _h in read_records(bootstrap, DEFAULT_MARKER_TOPIC)]
    ours = Counter(m["transactional_id"] for m in markers if m["transactional_id"].startswith(prefix))
    # Two batches of 100 records from each input partition: one id committed both, the other none.
    assert sorted(ours.values()) == [2] and len(ours) == 1, ours


def kafka_client_threads_of_python_workers() -> dict[int, int]:
    """librdkafka threads (named rdk:*) of each executor Python worker (pyspark.worker) under this process."""
    result = {}
    for pid in descendants(os.getpid()):
        arguments = command_line(pid)
        if "pyspark.daemon" in arguments and "pyspark.worker" in arguments:
            try:
                comms = [(task / "comm").read_text() for task in Path(f"/proc/{pid}/task").iterdir()]
            except OSError:
                continue
            result[pid] = sum(1 for comm in comms if comm.startswith("rdk:"))
    return result


@pytest.mark.embedded_broker_only("the Python workers' clients")
def test_python_workers_close_the_kafka_clients_of_a_finished_query(spark, broker, tmp_path):
    """Spark's Kafka connector closes cached clients idle for spark.kafka.*.cache.timeout; so do we."""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(200)])
    # Looked at while the query runs: on a loaded machine the timeout may pass before a look after it.
    holders: set[int] = set()
    query_ended = threading.Event()

    def watch_the_workers() -> None:
        while not query_ended.wait(0.05):
            holders.update(pid for pid, threads in kafka_client_threads_of_python_workers().items() if threads)

    watcher = threading.Thread(target=watch_the_workers, daemon=True)
    watcher.start()
    try:
        run_to_end(stream_of(spark, bootstrap, source).select("value"), bootstrap, str(tmp_path / "ck"), topic=sink)
    finally:
        query_ended.set()
        watcher.join()
    assert_exactly_once((str(i).encode() for i in range(200)), read_values(bootstrap, sink))
    assert holders, "no Python worker held a Kafka client while the query ran"

    def closed_by_the_still_running_workers() -> bool:
        # Spark stops a Python worker idle for 1 minute; the clients must go before, with the worker alive.
        now = kafka_client_threads_of_python_workers()
        return all(now.get(pid) == 0 for pid in holders)

    wait_for(closed_by_the_still_running_workers, timeout_s=2 * CLIENT_CACHE_TIMEOUT_S,
             what="the Python workers to close their idle Kafka clients")


def test_batch_write_is_exactly_once_per_write(spark, broker):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(400)])
    frame = (spark.read.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).load().selectExpr("CAST(value AS STRING) AS value")
             .where("CAST(value AS INT) % 4 != 0"))
    frame.write.format("sparkeos.kafka").mode("append").option("kafka.bootstrap.servers", bootstrap) \
        .option("topic", sink).save()
    expected = Counter(str(i).encode() for i in range(400) if i % 4)
    assert_exactly_once(expected, read_values(bootstrap, sink))
    with pytest.raises(Exception, match="appends to Kafka"):
        frame.write.format("sparkeos.kafka").mode("overwrite").option("kafka.bootstrap.servers", bootstrap) \
            .option("topic", sink).save()
    # A second write is a second write: Spark's batch semantics, not a replay.
    frame.write.format("sparkeos.kafka").mode("append").option("kafka.bootstrap.servers", bootstrap) \
        .option("topic", sink).save()
    assert_exactly_once(expected + expected, read_values(bootstrap, sink))


def test_a_batch_write_task_run_again_as_a_first_attempt_writes_nothing(spark, broker):
    """A stage re-run (after a fetch failure elsewhere) numbers its tasks from 0 again and may re-run a task
    whose first run committed: the marker decides, not the attempt number."""
    import pyarrow as pa

    from sparkeos.spark.kafka.options import parse_sink_options
    from sparkeos.spark.kafka.sink.startup_checks import prepare_exactly_once
    from sparkeos.spark.kafka.sink.writers import KafkaBatchWriter

    bootstrap = broker.bootstrap_servers
    sink = create_topic(bootstrap, unique("out"))
    options = parse_sink_options({"kafka.bootstrap.servers": bootstrap, "topic": sink})
    writer = KafkaBatchWriter(options, prepare_exactly_once(options))
    values = [str(i).encode() for i in range(50)]

    def write_partition(_rows):
        yield writer.write(iter([pa.record_batch({"value": pa.array(values, pa.binary())})]))

    # Two jobs, so both runs of partition 0 are first attempts of the same write's task.
    first, again = (spark.sparkContext.parallelize([0], 1).mapPartitions(write_partition).collect()[0]
                    for _ in range(2))
    assert (first.records, first.skipped) == (50, False)
    assert (again.records, again.skipped) == (50, True)
    assert_exactly_once(values, read_values(bootstrap, sink))


def test_a_task_outliving_the_transaction_timeout_fails_naming_the_option(spark, broker):
    """The input is computed while the task's transaction is open: slow upstream work makes Kafka abort it.

    Input that arrives while the task's writer is still being set up (a new write id: 0.1-0.3 s) is read ahead,
    before the transaction opens; the slow part comes after that."""
    import time

    import pyarrow as pa

    from sparkeos.spark.kafka.options import parse_sink_options
    from sparkeos.spark.kafka.sink.startup_checks import prepare_exactly_once
    from sparkeos.spark.kafka.sink.writers import KafkaBatchWriter

    bootstrap = broker.bootstrap_servers
    sink = create_topic(bootstrap, unique("out"))
    options = parse_sink_options({"kafka.bootstrap.servers": bootstrap, "topic": sink,
                                  "kafka.transaction.timeout.ms": "1000"})
    writer = KafkaBatchWriter(options, prepare_exactly_once(options))

    def slow_input():
        yield pa.record_batch({"value": pa.array([b"first"], pa.binary())})
        time.sleep(3)  # the writer is set up meanwhile
        yield pa.record_batch({"value": pa.array([b"second"], pa.binary())})
        time.sleep(4)  # upstream work, with the transaction open
        yield pa.record_batch({"value": pa.array([b"late"], pa.binary())})

    def write_partition(_rows):
        yield writer.write(slow_input())

    with pytest.raises(Exception, match=r"longer than option 'kafka.transaction.timeout.ms' \(1000 ms\)"):
        spark.sparkContext.parallelize([0], 1).mapPartitions(write_partition).collect()
    assert read_values(bootstrap, sink) == []


def test_input_read_ahead_while_the_writer_is_set_up_is_written_whole_and_in_order(spark, broker):
    import time

    import pyarrow as pa

    from sparkeos.spark.kafka.options import parse_sink_options
    from sparkeos.spark.kafka.sink.startup_checks import prepare_exactly_once
    from sparkeos.spark.kafka.sink.writers import KafkaBatchWriter

    bootstrap = broker.bootstrap_servers
    sink = create_topic(bootstrap, unique("out"))
    options = parse_sink_options({"kafka.bootstrap.servers": bootstrap, "topic": sink})
    writer = KafkaBatchWriter(options, prepare_exactly_once(options))

    def steady_input():
        # 2 s of input in 40 batches: the first ones arrive while the new write id's producer is set up.
        for i in range(40):
            yield pa.record_batch({"value": pa.array([b"%d-%d" % (i, j) for j in range(50)], pa.binary())})
            time.sleep(0.05)

    def write_partition(_rows):
        yield writer.write(steady_input())

    [commit] = spark.sparkContext.parallelize([0], 1).mapPartitions(write_partition).collect()
    assert commit.records == 2000
    assert read_values(bootstrap, sink) == [b"%d-%d" % (i, j) for i in range(40) for j in range(50)]


def test_input_failing_while_the_writer_is_set_up_fails_the_task_at_once(spark):
    """The set-up here would wait for an unreachable cluster; the task reports the input's own error first."""
    import time

    import pyarrow as pa

    from sparkeos.spark.kafka.options import parse_sink_options
    from sparkeos.spark.kafka.sink.writers import KafkaBatchWriter

    port = free_port()
    options = parse_sink_options({"kafka.bootstrap.servers": f"127.0.0.1:{port}", "topic": "anything"})
    writer = KafkaBatchWriter(options, 8)

    def failing_input():
        yield pa.record_batch({"value": pa.array([b"first"], pa.binary())})
        raise ValueError("upstream stage failed")

    def write_partition(_rows):
        yield writer.write(failing_input())

    started = time.monotonic()
    with pytest.raises(Exception, match="upstream stage failed"):
        spark.sparkContext.parallelize([0], 1).mapPartitions(write_partition).collect()
    assert time.monotonic() - started < 5  # setting up waits for the cluster far longer (it took 95 s to fail)


RETRY_SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import sparkeos.spark
    bootstrap, source, sink, checkpoint = sys.argv[1:5]
    # local[2,3]: up to 3 attempts per task, so a failed task is retried inside the same job.
    spark = sparkeos.spark.session("retry", master="local[2,3]", config={"spark.ui.enabled": "false"})
    for failpoint in sys.argv[5:]:
        armed = os.path.join(os.environ["SPARKEOS_FAILPOINT_DIR"], failpoint)
        open(armed, "w").close()
        batch = spark.read.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap) \\
            .option("subscribe", source).load().select("value")
        batch.write.format("sparkeos.kafka").mode("append").option("kafka.bootstrap.servers", bootstrap) \\
            .option("topic", f"{sink}-{failpoint}-batch").save()
        assert not os.path.exists(armed), "the batch write never reached the failpoint"
        open(armed, "w").close()
        query = spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap) \\
            .option("subscribe", source).option("startingOffsets", "earliest").load().select("value") \\
            .writeStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap) \\
            .option("topic", f"{sink}-{failpoint}-stream") \\
            .option("checkpointLocation", os.path.join(checkpoint, failpoint)).start()
        query.processAllAvailable()
        query.stop()
        assert not os.path.exists(armed), "the streaming query never reached the failpoint"
    spark.stop()
    """
)
RETRY_FAILPOINTS = ("sink.after_commit", "sink.before_commit")


# Spark's task retries and the fencing by a retry's InitProducerId are the same on every Kafka version.
# On Apache Kafka only (the embedded broker when no version is tested): how Kafka fences a retried task's
# producer is the subject, and the embedded broker's fencing is checked against Kafka's in tests/broker.
@pytest.mark.apache_kafka(newest_only=True, embedded=False)
def test_retried_tasks_write_once_in_batch_and_streaming(broker, tmp_path):
    """A task that fails after (or before) its commit is retried by Spark in the same job: the retry
    fences the first attempt and, if that one committed, finds its marker and writes nothing. Both failpoints
    run in one Spark of its own (whose master allows task retries), one after the other."""
    import os

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = unique("out")
    for failpoint in RETRY_FAILPOINTS:
        create_topic(bootstrap, f"{sink}-{failpoint}-batch")
        create_topic(bootstrap, f"{sink}-{failpoint}-stream")
    produce(bootstrap, source, [str(i) for i in range(300)])
    failpoints = tmp_path / "failpoints"
    failpoints.mkdir()
    script = tmp_path / "retry.py"
    script.write_text(RETRY_SCRIPT)
    env = {**os.environ, "SPARKEOS_FAILPOINT_DIR": str(failpoints), "PYSPARK_PYTHON": sys.executable}
    command = [sys.executable, str(script), bootstrap, source, sink, str(tmp_path / "ck"), *RETRY_FAILPOINTS]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = Counter(str(i).encode() for i in range(300))
    for failpoint in RETRY_FAILPOINTS:
        for write in ("batch", "stream"):
            assert_exactly_once(expected, read_values(bootstrap, f"{sink}-{failpoint}-{write}"))


@pytest.mark.embedded_broker_only("no broker answers")
def test_unreachable_broker_is_a_clear_error_after_a_bounded_wait(spark, broker, tmp_path):
    import time

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    produce(bootstrap, source, ["a"])
    started = time.monotonic()
    query = (stream_of(spark, bootstrap, source).select("value").writeStream.format("sparkeos.kafka")
             .option("kafka.bootstrap.servers", "127.0.0.1:1").option("topic", "out")
             .option("kafka.default.api.timeout.ms", "3000")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    with pytest.raises(Exception, match=r"kafka.bootstrap.servers=127.0.0.1:1 did not answer"):
        query.awaitTermination(120)
    assert time.monotonic() - started < 60


# librdkafka's queue, not the broker, is what fills up.
@pytest.mark.apache_kafka(newest_only=True)
@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_batches_larger_than_the_producer_queue(spark, broker, tmp_path, guarantee):
    """A task producing more records than librdkafka's queue holds waits for room (records and marker), and
    keeps their order."""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(2000)])
    run_to_end(stream_of(spark, bootstrap, source).select("value"), bootstrap, str(tmp_path / "ck"), topic=sink,
               deliveryGuarantee=guarantee, **{"kafka.queue.buffering.max.messages": "50"})
    assert read_values(bootstrap, sink) == [str(i).encode() for i in range(2000)]  # one partition in, one out


# --- the driver's report of each batch -----------------------------------------------------------------------------

REPORT_SCRIPT = textwrap.dedent(
    """
    import logging, sys
    if sys.argv[1] == "configured":  # as Spark's worker logging does it: a handler on the root logger, at WARNING
        logging.basicConfig(level=logging.WARNING, format="CONFIGURED %(levelname)s %(name)s %(message)s")
    from sparkeos.spark.kafka.options import parse_sink_options
    from sparkeos.spark.kafka.sink.reports import SinkCommit
    from sparkeos.spark.kafka.sink.writers import KafkaStreamWriter
    writer = KafkaStreamWriter(parse_sink_options({"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t"}), 1)
    writer.commit([SinkCommit(0, 7, 20, False, "p-0"), SinkCommit(1, 7, 5, True, "p-1")], 7)
    writer.abort([SinkCommit(0, 8, 20, False, "p-0"), None], 8)
    """
)


def run_report_script(mode: str, level: str | None = None) -> subprocess.CompletedProcess:
    """The driver's commit and abort in a fresh interpreter, as Spark runs them: nothing configures logging there."""
    env = {key: value for key, value in os.environ.items() if key != "SPARKEOS_LOG_LEVEL"}
    if level is not None:
        env["SPARKEOS_LOG_LEVEL"] = level
    return subprocess.run([sys.executable, "-c", REPORT_SCRIPT, mode], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_driver_reports_each_batch_on_stderr_unless_logging_is_configured():
    plain = run_report_script("plain")
    assert plain.returncode == 0, plain.stderr
    lines = plain.stderr.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith(" INFO sparkeos.sink: batch 7 committed (exactly_once): 2 tasks, 20 records; "
                             "partitions [1] had already committed this batch and wrote nothing")
    assert lines[1].endswith(" WARNING sparkeos.sink: batch 8 aborted by Spark: 1 of 2 tasks had finished; Spark "
                             "re-runs the batch and tasks whose marker shows it committed write nothing")

    quiet = run_report_script("plain", level="warning")
    assert [line.split(" ", 3)[2] for line in quiet.stderr.splitlines()] == ["WARNING"]

    configured = run_report_script("configured")
    assert [line.split(" ", 3)[:3] for line in configured.stderr.splitlines()] == [
        ["CONFIGURED", "INFO", "sparkeos.sink"], ["CONFIGURED", "WARNING", "sparkeos.sink"]]
    configured_quiet = run_report_script("configured", level="WARNING")
    assert [line.split(" ", 3)[1] for line in configured_quiet.stderr.splitlines()] == ["WARNING"]

    bad = run_report_script("plain", level="loud")
    assert bad.returncode != 0
    expected = "environment variable SPARKEOS_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, not 'loud'"
    assert expected in bad.stderr


COMMITTED_REPORT = re.compile(r" INFO sparkeos\.sink: batch (\d+) committed \(exactly_once\): \d+ tasks, (\d+) records")


@pytest.mark.embedded_broker_only("the driver's log lines")
@pytest.mark.timeout(600)
def test_the_driver_log_reports_each_committed_batch_and_an_aborted_one(broker, tmp_path):
    """A query in a driver of its own (tests/support/pipeline_job.py): what Spark copies into the driver's log."""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(600)])
    kept = len([i for i in range(600) if i % 7])  # the job drops the multiples of 7
    driver = Driver(tmp_path, unique("reports"), pipeline_job_args(bootstrap, source, sink, tmp_path / "ck"))
    driver.start(0)
    try:
        driver.wait_running(240)

        def reported() -> list[tuple[int, int]]:
            return [(int(batch), int(records)) for batch, records in COMMITTED_REPORT.findall(driver.errors())]

        wait_for(lambda: sum(records for _, records in reported()) == kept or not driver.alive(), timeout_s=240,
                 what=f"reports of {kept} records committed")
        assert driver.alive(), driver.error_tail()
        batches = [batch for batch, _ in reported()]
        assert len(batches) == len(set(batches)), f"a batch reported twice: {batches}"
        assert count_records(bootstrap, sink) == kept

        arm_failpoint("sink.before_commit")
        produce(bootstrap, source, ["601"])
        wait_for(lambda: "QUERY ENDED" in driver.output() or not driver.alive(), timeout_s=240,
                 what="the query to fail on the failpoint")
        assert fired("sink.before_commit")
        aborted = re.findall(r" WARNING sparkeos\.sink: batch (\d+) aborted by Spark", driver.errors())
        assert aborted == [str(max(batches) + 1)], driver.error_tail()
    finally:
        driver.kill()
        clear_failpoints()
