"""What every sparkeos sink requires of Spark, checked for the three: the output mode it can honour, and the query id
and batch id Spark puts in a streaming task's context. A sink that cannot honour what it is given refuses it with
an error naming the problem; it never falls back to something that loses or duplicates records."""

from __future__ import annotations

import uuid

import pytest
from pyspark.errors import StreamingQueryException

from support.spark import unique


@pytest.fixture
def files_writer(tmp_path):
    def start(frame, checkpoint):
        return (frame.writeStream.format("sparkeos.files").option("path", str(tmp_path / "out"))
                .option("checkpointLocation", str(checkpoint)))
    return start


@pytest.fixture
def postgres_writer(spark, postgres):
    from sparkeos.spark.postgres.datasource import PostgresDataSource

    spark.dataSource.register(PostgresDataSource)
    table = f"t_{uuid.uuid4().hex[:10]}"

    def start(frame, checkpoint):
        return (frame.writeStream.format("sparkeos.postgres").option("url", postgres.url()).option("dbtable", table)
                .option("createTable", "true").option("checkpointLocation", str(checkpoint)))
    return start


def counts_per_key(spark):
    from pyspark.sql import functions as F

    return (spark.readStream.format("rate").option("rowsPerSecond", "50").load()
            .groupBy((F.col("value") % 2).alias("k")).count())


@pytest.mark.parametrize("sink", ["files_writer", "postgres_writer"])
def test_complete_mode_is_refused_naming_the_mode(spark, tmp_path, request, sink):
    """Complete mode hands the sink the whole result table at every trigger, to replace what it holds. An
    appending sink would add the table again at every trigger (k=0 counted 2, then 2 and 4, then 2, 4 and 6)."""
    writer = request.getfixturevalue(sink)(counts_per_key(spark), tmp_path / "ck").outputMode("complete")
    query = writer.start()
    try:
        with pytest.raises(StreamingQueryException, match="outputMode 'complete'"):
            query.processAllAvailable()
            query.processAllAvailable()
    finally:
        query.stop()


def test_complete_mode_into_kafka_writes_each_triggers_whole_table_once(spark, broker, tmp_path):
    """As Spark's own Kafka sink: complete mode writes the whole result table at each trigger, a new version of
    every row; exactly once per trigger."""
    from pyspark.sql import functions as F

    from sparkeos.verify import read_records
    from support.spark import create_topic, produce

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    target = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, ["a", "b", "a"])
    frame = (spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest").load()
             .groupBy(F.col("value").cast("string").alias("key")).count()
             .select("key", F.col("count").cast("string").alias("value")))
    query = (frame.writeStream.format("sparkeos.kafka").outputMode("complete")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", target)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        query.processAllAvailable()
        produce(bootstrap, source, ["b", "c"])
        query.processAllAvailable()
    finally:
        query.stop()
    written = sorted((r.key.decode(), r.value.decode()) for r in read_records(bootstrap, target))
    assert written == sorted([("a", "2"), ("b", "1"), ("a", "2"), ("b", "2"), ("c", "1")])


def _write_in_a_plain_task(spark, writer, properties: dict[str, str]):
    """Run `writer.write` in a Spark task that is not part of a streaming query, with the given local properties."""
    context = spark.sparkContext
    for key, value in properties.items():
        context.setLocalProperty(key, value)
    try:
        return context.parallelize([0], 1).mapPartitions(lambda _rows: [writer.write(iter([]))]).collect()
    finally:
        for key in properties:
            context.setLocalProperty(key, None)


def _stream_writers(broker, tmp_path):
    from sparkeos.spark.files.options import parse_file_sink_options
    from sparkeos.spark.files.sink import FileSink
    from sparkeos.spark.kafka.options import parse_sink_options
    from sparkeos.spark.kafka.sink.writers import KafkaStreamWriter
    from sparkeos.spark.two_phase_commit import TwoPhaseCommitStreamWriter

    kafka = KafkaStreamWriter(parse_sink_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                                                  "topic": "unused"}), 1)
    files = TwoPhaseCommitStreamWriter(FileSink(parse_file_sink_options({"path": str(tmp_path / "out")})))
    return {"kafka": kafka, "files": files}


@pytest.mark.parametrize("sink", ["kafka", "files"])
@pytest.mark.parametrize(("properties", "missing"), [
    ({}, "query id"),
    ({"sql.streaming.queryId": "q-1"}, "batch id"),
])
def test_a_streaming_task_without_spark_query_or_batch_id_fails_naming_it(spark, broker, tmp_path, sink, properties,
                                                                          missing):
    """A missing batch id once became batch 0, and a missing query id None: a task would decide against the
    markers and decisions of another batch or query."""
    writer = _stream_writers(broker, tmp_path)[sink]
    with pytest.raises(Exception, match=f"no streaming {missing}") as failed:
        _write_in_a_plain_task(spark, writer, properties)
    assert "Spark" in str(failed.value)
