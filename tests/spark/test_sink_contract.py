"""What every sparkeos sink requires of Spark, checked for the three: the output mode it can honour, and the query id
and batch id Spark puts in a streaming task's context. A sink that cannot honour what it is given refuses it with
an error naming the problem; it never falls back to something that loses or duplicates records."""

from __future__ import annotations

import textwrap
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
    start.table = table
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


def test_a_batch_write_that_failed_after_its_decision_is_published_whole_and_a_rerun_adds_nothing(spark, tmp_path):
    """df.write into sparkeos.files failed between publishing its two tasks' files: the decision is final, so the
    write is completed as decided before the error reaches the caller, never left half published; and the same
    write run again under its writeId adds nothing."""
    from support.spark import arm_failpoint, clear_failpoints, fired

    path = tmp_path / "out"
    frame = spark.range(0, 100, numPartitions=2).selectExpr("id AS n")

    def write() -> None:
        frame.write.format("sparkeos.files").mode("append").option("writeId", "nightly-2026-11-28").save(str(path))

    clear_failpoints()
    arm_failpoint("2pc.between_commits")
    try:
        with pytest.raises(Exception, match="failpoint"):
            write()
        assert fired("2pc.between_commits")
    finally:
        clear_failpoints()
    import pyarrow.dataset as ds

    def numbers() -> list[int]:
        return sorted(ds.dataset(str(path), format="parquet").to_table()["n"].to_pylist())

    assert numbers() == list(range(100)), "the failed write was left half published"
    write()
    assert numbers() == list(range(100)), "the write run again under its writeId added rows"


@pytest.mark.parametrize("sink", ["kafka", "postgres"])
def test_a_batch_write_run_again_under_its_write_id_adds_nothing(spark, broker, request, tmp_path, sink):
    from support.spark import create_topic

    frame = spark.range(0, 100, numPartitions=2).selectExpr("CAST(id AS STRING) AS value", "id AS n")
    if sink == "kafka":
        from sparkeos.verify import read_values

        topic = create_topic(broker.bootstrap_servers, unique("out"))
        writer = (frame.select("value").write.format("sparkeos.kafka").mode("append")
                  .option("kafka.bootstrap.servers", broker.bootstrap_servers).option("topic", topic))

        def written() -> list[str]:
            return sorted(v.decode() for v in read_values(broker.bootstrap_servers, topic))
    else:
        from sparkeos.spark.postgres.datasource import PostgresDataSource

        postgres = request.getfixturevalue("postgres")
        spark.dataSource.register(PostgresDataSource)
        table = f"t_{uuid.uuid4().hex[:10]}"
        writer = (frame.select("n").write.format("sparkeos.postgres").mode("append").option("url", postgres.url())
                  .option("dbtable", table).option("createTable", "true"))

        def written() -> list[str]:
            with postgres.connect() as connection:
                return sorted(str(n) for (n,) in connection.execute(f"SELECT n FROM {table}"))
    for _ in range(2):
        writer.option("writeId", "load-42").save()
    assert written() == sorted(str(i) for i in range(100))
    with pytest.raises(Exception, match="option 'writeId' applies to batch writes"):
        (spark.readStream.format("rate").load().writeStream.format(f"sparkeos.{sink}").option("writeId", "x")
         .option("checkpointLocation", str(tmp_path / "ck")).start().processAllAvailable())


@pytest.mark.parametrize("sink", ["files", "postgres"])
def test_a_batch_write_that_failed_before_its_decision_is_published_whole_when_run_again(spark, request, tmp_path,
                                                                                         sink):
    """The failed run's abort recorded that it published nothing (for its tasks still running to see): the run
    again under the same writeId writes a batch of its own and publishes all, and a third run adds nothing."""
    from support.spark import arm_failpoint, clear_failpoints, fired

    frame = spark.range(0, 100, numPartitions=2).selectExpr("id AS n")
    if sink == "files":
        import pyarrow.dataset as ds

        path = tmp_path / "out"
        writer = frame.write.format("sparkeos.files").mode("append").option("path", str(path))

        def written() -> list[int]:
            table = ds.dataset(str(path), format="parquet").to_table()  # no file yet: no column either
            return sorted(table["n"].to_pylist()) if "n" in table.column_names else []
    else:
        from sparkeos.spark.postgres.datasource import PostgresDataSource

        postgres = request.getfixturevalue("postgres")
        spark.dataSource.register(PostgresDataSource)
        table = f"t_{uuid.uuid4().hex[:10]}"
        writer = (frame.write.format("sparkeos.postgres").mode("append").option("url", postgres.url())
                  .option("dbtable", table).option("createTable", "true"))

        def written() -> list[int]:
            with postgres.connect() as connection:
                return sorted(n for (n,) in connection.execute(f"SELECT n FROM {table}"))
    writer = writer.option("writeId", f"load-{uuid.uuid4().hex[:6]}")
    clear_failpoints()
    arm_failpoint("2pc.task_pre_committed")
    try:
        with pytest.raises(Exception, match="failpoint"):
            writer.save()
        assert fired("2pc.task_pre_committed")
    finally:
        clear_failpoints()
    assert written() == []
    writer.save()
    assert written() == list(range(100)), "the run after a failed one did not publish the write"
    writer.save()
    assert written() == list(range(100)), "a third run added rows"


def test_a_run_that_commits_after_another_run_of_its_write_id_aborted_the_batch_fails_publishing_nothing(tmp_path):
    """Two runs of one writeId at once (a job submitted twice): one fails, and its abort closes the batch both
    write. The other's commit then finds that decision: it must fail, not report a write that published nothing."""
    from pyspark.sql.types import LongType, StructField, StructType

    from sparkeos.spark.files.datasource import FilesDataSource
    from sparkeos.spark.two_phase_commit import Handle, PreCommitted

    options = {"path": str(tmp_path / "out"), "writeId": "load-9"}
    schema = StructType([StructField("n", LongType())])
    first, second = (FilesDataSource(options).writer(schema, False) for _ in range(2))
    assert (first.batch, second.batch) == (0, 0)
    first.abort([])
    handle = Handle("0-0-attempt", 0, 0, 10)
    with pytest.raises(RuntimeError, match="another run of writeId load-9 failed while this one ran.*Run the write "
                                           "again"):
        second.commit([PreCommitted(second.query, 0, 0, handle)])
    assert FilesDataSource(options).writer(schema, False).batch == 1


STRAGGLER_SCRIPT = textwrap.dedent(
    """
    import json
    import os
    import sys
    from pathlib import Path

    import sparkeos.spark
    from sparkeos import failpoints
    from support.spark import wait_tasks_ended
    format_name, options, hold = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    # Spark kills the Python worker of a cancelled task after killTimeout: raised, so that the held task outlives
    # the driver's abort, as a task slower than that (a loaded executor) does.
    spark = sparkeos.spark.session("straggler", master="local[2]",
                                   config={"spark.ui.enabled": "false", "spark.python.task.killTimeout": "10min"})
    frame = spark.range(0, 20, numPartitions=2).selectExpr("id AS n")
    try:
        frame.write.format(format_name).mode("append").options(**options).save()
        sys.exit("the write did not fail")
    except Exception as exc:
        if "failpoint 2pc.task_pre_committed fired" not in str(exc):
            raise
    held = failpoints.holds(Path(os.environ["SPARKEOS_FAILPOINT_DIR"]), hold)
    assert len(held) == 1, f"no task held at {hold}: {held}"
    held.pop().unlink()
    wait_tasks_ended(spark)
    spark.stop()
    """
)


# Held where the driver's listing cannot see the task yet: a files task's staging directory exists from its begin
# (a PostgreSQL task that begins after the abort finds the batch decided and writes nothing); a PostgreSQL task's
# prepared transaction exists from its pre-commit.
@pytest.mark.parametrize(("sink", "hold"), [("files", "2pc.task_beginning"), ("postgres", "2pc.task_pre_committing")])
def test_a_task_that_pre_commits_after_a_failed_batch_writes_abort_aborts_itself(request, tmp_path, sink, hold):
    """A batch write failed (one task failed) while another task still ran: the driver's abort cleaned up, then the
    straggler pre-committed. A write has no later batch to abort it, so the straggler must: it would otherwise
    leave a staged directory, or a prepared transaction holding its slot and row locks, until an operator aborts
    it. Counted by each sink's own listing of what it holds pending (``sparkeos sinks pending``)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sparkeos import failpoints
    from sparkeos.spark.files.datasource import FilesDataSource
    from sparkeos.spark.postgres.datasource import PostgresDataSource

    if sink == "files":
        source, options = FilesDataSource, {"path": str(tmp_path / "out")}
    else:
        source = PostgresDataSource
        options = {"url": request.getfixturevalue("postgres").url(), "dbtable": f"t_{uuid.uuid4().hex[:10]}",
                   "createTable": "true"}
    failpoint_dir = tmp_path / "failpoints"
    failpoints.arm_hold(failpoint_dir, hold)
    (failpoint_dir / "2pc.task_pre_committed").touch()
    script = tmp_path / "straggler.py"
    script.write_text(STRAGGLER_SCRIPT)
    tests = str(Path(__file__).parents[1])
    env = {**os.environ, "SPARKEOS_FAILPOINT_DIR": str(failpoint_dir), "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, str(script), source.name(), json.dumps(options), hold], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (failpoint_dir / "2pc.task_pre_committed.fired").exists()
    assert source.left_pending(options) == []
    assert source.visible_output(options) == 0


def _numbers_sink(spark, broker, request, tmp_path, sink):
    """A writer of `frame` (column `n`) into a fresh target of `sink`, and a reader of the numbers it holds."""
    if sink == "kafka":
        from sparkeos.verify import read_values
        from support.spark import create_topic

        topic = create_topic(broker.bootstrap_servers, unique("out"))

        def writer(frame, checkpoint):
            return (frame.selectExpr("CAST(n AS STRING) AS value").writeStream.format("sparkeos.kafka")
                    .option("kafka.bootstrap.servers", broker.bootstrap_servers).option("topic", topic)
                    .option("checkpointLocation", str(checkpoint)))

        def numbers() -> list[int]:
            return sorted(int(v) for v in read_values(broker.bootstrap_servers, topic))
    elif sink == "files":
        import pyarrow.dataset as ds

        path = tmp_path / "out"

        def writer(frame, checkpoint):
            return (frame.writeStream.format("sparkeos.files").option("path", str(path))
                    .option("checkpointLocation", str(checkpoint)))

        def numbers() -> list[int]:
            if not list(path.rglob("*.parquet")):
                return []
            return sorted(ds.dataset(str(path), format="parquet").to_table()["n"].to_pylist())
    else:
        from sparkeos.spark.postgres.datasource import PostgresDataSource

        postgres = request.getfixturevalue("postgres")
        spark.dataSource.register(PostgresDataSource)
        table = f"t_{uuid.uuid4().hex[:10]}"

        def writer(frame, checkpoint):
            return (frame.writeStream.format("sparkeos.postgres").option("url", postgres.url())
                    .option("dbtable", table).option("createTable", "true")
                    .option("checkpointLocation", str(checkpoint)))

        def numbers() -> list[int]:
            with postgres.connect() as connection:
                if connection.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is None:
                    return []
                return sorted(n for (n,) in connection.execute(f"SELECT n FROM {table}"))
    return writer, numbers


def _run_numbers(spark, bootstrap: str, source: str, writer, checkpoint, max_offsets: int = 100) -> None:
    """Run the numbers of `source` into `writer`'s target until the query consumed them, then stop it."""
    frame = (spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(max_offsets)).load()
             .selectExpr("CAST(CAST(value AS STRING) AS BIGINT) AS n"))
    query = writer(frame, checkpoint).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()


@pytest.mark.parametrize("sink", ["kafka", "files", "postgres"])
def test_a_checkpoint_of_another_target_is_refused(spark, broker, request, tmp_path, sink):
    """A checkpoint copied for another query, or a query pointed at another target: Spark goes on from the
    checkpoint's last batch, so the other target got only what came after it, and its readers could not tell. The
    checkpoint records its target; another one is refused, naming both, and gets nothing."""
    import shutil

    from support.spark import create_topic, produce

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    first, first_numbers = _numbers_sink(spark, broker, request, tmp_path / "first", sink)
    second, second_numbers = _numbers_sink(spark, broker, request, tmp_path / "second", sink)
    produce(bootstrap, source, [str(i) for i in range(100)])
    _run_numbers(spark, bootstrap, source, first, tmp_path / "ck")
    shutil.copytree(tmp_path / "ck", tmp_path / "copy")
    produce(bootstrap, source, [str(i) for i in range(100, 200)])
    with pytest.raises(StreamingQueryException, match=f"belongs to the sparkeos.{sink} sink writing to"):
        _run_numbers(spark, bootstrap, source, second, tmp_path / "copy")
    assert second_numbers() == []
    _run_numbers(spark, bootstrap, source, first, tmp_path / "ck")
    assert first_numbers() == list(range(200))


@pytest.mark.parametrize("sink", ["kafka", "files", "postgres"])
def test_a_checkpoint_behind_its_sinks_output_is_refused(spark, broker, request, tmp_path, sink):
    """A checkpoint restored from a backup, or copied and left behind while the original query went on: Spark runs
    again batches that the sink decided in the original query's run, planned anew. Taking them for decided (a
    replay's rule) lost what the plans differ by, here with a larger maxOffsetsPerTrigger. The sink must refuse to
    go on from a checkpoint behind its output, and add nothing."""
    import shutil

    from support.spark import create_topic, produce

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    writer, numbers = _numbers_sink(spark, broker, request, tmp_path, sink)

    def run(checkpoint, max_offsets: int) -> None:
        _run_numbers(spark, bootstrap, source, writer, checkpoint, max_offsets)

    produce(bootstrap, source, [str(i) for i in range(100)])
    run(tmp_path / "ck", 100)
    shutil.copytree(tmp_path / "ck", tmp_path / "backup")
    produce(bootstrap, source, [str(i) for i in range(100, 300)])
    run(tmp_path / "ck", 100)
    assert numbers() == list(range(300))
    produce(bootstrap, source, [str(i) for i in range(300, 400)])
    with pytest.raises(StreamingQueryException, match="checkpoint is behind"):
        run(tmp_path / "backup", 250)
    assert numbers() == list(range(300))
    run(tmp_path / "ck", 100)
    assert numbers() == list(range(400))
