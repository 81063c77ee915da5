"""The `sparkeos.files` sink in real Spark, read back by directory readers that know nothing of it: pyarrow.dataset,
DuckDB, pandas and Spark's own batch reader. Failures are injected at each step of the two-phase commit; the
query is restarted from its checkpoint and the directory must hold every record exactly once."""

from __future__ import annotations

import os
import subprocess
import threading
from collections import Counter
from pathlib import Path

import duckdb
import pandas
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
from pyspark.errors import StreamingQueryException

from support.spark import arm_failpoint, clear_failpoints, create_topic, fired, produce, unique


@pytest.fixture(autouse=True)
def _no_failpoints_left():
    clear_failpoints()
    yield
    clear_failpoints()


def start_query(spark, bootstrap: str, source: str, path: Path | str, checkpoint: Path, **sink_options):
    """Kafka -> (n, k = n % 3, text) -> files under `path`, partitioned by k."""
    from pyspark.sql import functions as F

    frame = (
        spark.readStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "200")
        .load()
        .select(F.col("value").cast("string").cast("long").alias("n"))
        .select("n", (F.col("n") % 3).alias("k"), F.concat(F.lit("row-"), F.col("n").cast("string")).alias("text"))
    )
    writer = (frame.writeStream.format("sparkeos.files").option("path", str(path))
              .option("checkpointLocation", str(checkpoint)))
    options = {"partitionBy": "k", **sink_options}
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.start()


def parquet_numbers(path: Path) -> dict[str, Counter]:
    """What each reader finds in `path`: the multiset of n."""
    found = {
        "pyarrow": Counter(ds.dataset(str(path), format="parquet", partitioning="hive").to_table()["n"].to_pylist()),
        "duckdb": Counter(n for (n,) in duckdb.sql(
            f"SELECT n FROM read_parquet('{path}/**/*.parquet', hive_partitioning=true)").fetchall()),
        "pandas": Counter(pandas.read_parquet(str(path))["n"].tolist()),
    }
    return found


def staged_leftovers(path: Path) -> list[str]:
    return [str(p) for p in path.glob("_sparkeos/*/staging/**/*") if p.is_file()]


def assert_exact(spark, path: Path, count: int) -> None:
    expected = Counter(range(count))
    for reader, numbers in parquet_numbers(path).items():
        lost, extra = expected - numbers, numbers - expected
        assert not lost and not extra, f"{reader}: {len(lost)} lost {sorted(lost)[:5]}, {len(extra)} extra {extra}"
    rows = spark.read.parquet(str(path)).select("n", "k").collect()
    assert Counter(r.n for r in rows) == expected
    assert all(r.k == r.n % 3 for r in rows)
    assert staged_leftovers(path) == []


@pytest.mark.parametrize("failpoint", ["2pc.task_pre_committed", "2pc.decided", "files.between_renames",
                                       "2pc.between_commits", "2pc.committed"])
def test_failure_at_each_step_of_the_commit_then_restart_is_exact(spark, broker, tmp_path, failpoint):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(900)], spread_over=2)  # two tasks, so two commits
    path, checkpoint = tmp_path / "out", tmp_path / "ck"
    arm_failpoint(failpoint)
    query = start_query(spark, bootstrap, source, path, checkpoint)
    with pytest.raises(StreamingQueryException, match="failpoint"):
        query.awaitTermination(120)
        query.processAllAvailable()
    assert fired(failpoint), f"{failpoint} never ran"
    query = start_query(spark, bootstrap, source, path, checkpoint)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exact(spark, path, 900)


def test_a_batch_replayed_after_its_commit_publishes_nothing_again(spark, broker, tmp_path):
    """The driver died after the sink committed batch B and before Spark's commit log recorded it: Spark runs
    B again, and its new files must not be published beside the first ones."""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(500)])
    path, checkpoint = tmp_path / "out", tmp_path / "ck"
    query = start_query(spark, bootstrap, source, path, checkpoint)
    query.processAllAvailable()
    query.stop()
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    files_before = sorted(p.name for p in path.rglob("*.parquet"))
    query = start_query(spark, bootstrap, source, path, checkpoint)
    query.processAllAvailable()
    query.stop()
    assert sorted(p.name for p in path.rglob("*.parquet")) == files_before
    assert_exact(spark, path, 500)


def test_a_reader_polling_during_the_run_never_sees_a_duplicate_or_a_partial_file(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    path, checkpoint = tmp_path / "out", tmp_path / "ck"
    path.mkdir()
    problems: list[str] = []
    reads = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                dataset = ds.dataset(str(path), format="parquet", partitioning="hive")
                if not dataset.files:
                    continue  # nothing published yet
                numbers = Counter(dataset.to_table()["n"].to_pylist())
            except Exception as error:  # a partial or vanished file would fail the read
                problems.append(f"read failed: {error}")
                continue
            reads += 1
            twice = [n for n, c in numbers.items() if c > 1]
            if twice:
                problems.append(f"seen twice: {twice[:5]}")

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    query = start_query(spark, bootstrap, source, path, checkpoint)
    try:
        for start in range(0, 1200, 200):
            produce(bootstrap, source, [str(i) for i in range(start, start + 200)])
            query.processAllAvailable()
    finally:
        query.stop()
        stop.set()
        poller.join(30)
    assert reads > 0
    assert problems == []
    assert_exact(spark, path, 1200)


@pytest.mark.parametrize(("file_format", "compression"), [("json", "gzip"), ("csv", "none"), ("parquet", "zstd")])
def test_batch_writes_in_each_format_are_read_back_by_duckdb(spark, tmp_path, file_format, compression):
    from pyspark.sql import functions as F

    frame = spark.range(0, 1000).select(F.col("id").alias("n"), (F.col("id") % 2).alias("k"),
                                        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("text"))
    path = tmp_path / file_format
    writer = (frame.write.format("sparkeos.files").mode("append").option("format", file_format)
              .option("compression", compression).option("partitionBy", "k"))
    if file_format == "csv":
        writer = writer.option("header", "true")
    writer.save(str(path))
    files = [p for p in path.rglob("*") if p.is_file() and "_sparkeos" not in p.parts]
    suffix = {"json": ".json.gz", "csv": ".csv", "parquet": ".parquet"}[file_format]
    assert files and all(p.name.endswith(suffix) for p in files)
    assert {p.parent.name for p in files} == {"k=0", "k=1"}
    reader = {"json": "read_json_auto", "csv": "read_csv_auto", "parquet": "read_parquet"}[file_format]
    rows = duckdb.sql(f"SELECT n, k, text FROM {reader}('{path}/**/*{suffix}', hive_partitioning=true)").fetchall()
    assert Counter(n for n, _k, _t in rows) == Counter(range(1000))
    assert all(k == n % 2 and t == f"row-{n}" for n, k, t in rows)
    assert staged_leftovers(path) == []


def test_bad_options_and_paths_fail_before_anything_is_published(spark, tmp_path):
    frame = spark.range(0, 10)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = {
        "is a file, not a directory": {"path": str(a_file)},
        "unknown option 'partitonby'": {"path": str(tmp_path / "x"), "partitonBy": "id"},
        "partitionBy column 'nope' is not in the input": {"path": str(tmp_path / "y"), "partitionBy": "nope"},
        "option 'format' must be one of": {"path": str(tmp_path / "z"), "format": "avro"},
        "option 'compression' of format parquet": {"path": str(tmp_path / "z"), "compression": "lzo"},
        "option 'path' is required": {},
    }
    for message, options in cases.items():
        writer = frame.write.format("sparkeos.files").mode("append")
        for key, value in options.items():
            writer = writer.option(key, value)
        with pytest.raises(Exception, match=message.replace("(", r"\(")):
            writer.save()
    binary = spark.range(0, 3).selectExpr("id", "cast(cast(id as string) as binary) as b")
    with pytest.raises(Exception, match="column 'b' has type binary, which format csv cannot hold"):
        binary.write.format("sparkeos.files").mode("append").option("format", "csv").save(str(tmp_path / "csv"))
    assert not list(tmp_path.rglob("*.parquet")) and not list(tmp_path.rglob("*.csv"))


def test_a_directory_without_write_permission_is_refused_naming_the_path(tmp_path):
    """Root may write anywhere a mode allows, so as root the directory is made immutable (chattr +i) instead."""
    from sparkeos.spark.files.options import parse_file_sink_options
    from sparkeos.spark.files.sink import FileSink, FileSinkPathError

    locked = tmp_path / "locked"
    locked.mkdir()
    as_root = os.geteuid() == 0
    if as_root:
        subprocess.run(["chattr", "+i", str(locked)], check=True)
    else:
        locked.chmod(0o555)
    try:
        with pytest.raises(FileSinkPathError, match=f"path {str(locked)!r} of the sparkeos.files sink cannot be "
                                                    "written"):
            FileSink(parse_file_sink_options({"path": str(locked)})).prepare()
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
        locked.chmod(0o755)
    assert list(locked.iterdir()) == []


def test_a_crash_while_forgetting_an_old_decision_never_fails_a_later_commit(tmp_path):
    """Old decisions are forgotten file by file (the decision, then its finished mark); a driver killed between the
    two deletes leaves a finished mark without its decision, which every later commit then tries to forget."""
    from sparkeos.spark.files.options import parse_file_sink_options
    from sparkeos.spark.files.sink import FileSink
    from sparkeos.spark.two_phase_commit import RETAINED_DECISIONS, Decision, Handle, commit_batch

    sink = FileSink(parse_file_sink_options({"path": str(tmp_path / "out")}))
    sink.prepare()
    decisions = sink.decision_log("q")
    for batch in range(3):
        decisions.record(Decision("q", batch, (Handle(f"{batch}-0-a", batch, 0),)))
        decisions.finish(batch)
    directory = tmp_path / "out" / "_sparkeos" / "q" / "decisions"
    (directory / "0.decision").unlink()  # the crash: 0.finished stays

    for batch in (RETAINED_DECISIONS + 1, RETAINED_DECISIONS + 2):
        commit_batch(sink, "q", batch, [])
    assert sorted(p.name for p in directory.iterdir()) == []


def test_on_s3_a_commit_is_a_repeatable_copy_and_the_output_is_exact(spark, broker, tmp_path, s3_server):
    """No rename on S3: files are copied to their final names; a failure between two copies, then a restart,
    leaves every record once."""
    from sparkeos.spark.files.sink import file_system

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(600)])
    path, checkpoint = "s3a://sink-bucket/orders", tmp_path / "ck"
    arm_failpoint("files.between_renames")
    query = start_query(spark, bootstrap, source, path, checkpoint, **s3_server)
    with pytest.raises(StreamingQueryException, match="failpoint"):
        query.awaitTermination(120)
        query.processAllAvailable()
    assert fired("files.between_renames")
    query = start_query(spark, bootstrap, source, path, checkpoint, **s3_server)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    fs, base = file_system(path, s3_server)
    table = ds.dataset(base, filesystem=fs, format="parquet", partitioning="hive").to_table()
    assert Counter(table["n"].to_pylist()) == Counter(range(600))
    staged = [info.path for info in fs.get_file_info(pafs.FileSelector(f"{base}/_sparkeos", recursive=True))
              if info.type == pafs.FileType.File and "/staging/" in info.path]
    assert staged == []


@pytest.mark.parametrize("store", ["local", "s3"])
def test_drivers_recording_one_batch_at_once_all_keep_the_first_decision(tmp_path, request, store):
    """Two drivers of one query (a cluster manager's driver retry while the old driver still runs, a copied
    checkpoint) can decide the same batch at the same moment, each with its own tasks' files. A decision that a
    later one replaces after its files were published publishes the batch twice."""
    from sparkeos.spark.files.options import parse_file_sink_options
    from sparkeos.spark.files.sink import FileSink
    from support.decision_race import assert_drivers_agree

    options = ({"path": str(tmp_path / "out")} if store == "local"
               else {"path": "s3a://sink-bucket/race", **request.getfixturevalue("s3_server")})
    FileSink(parse_file_sink_options(options)).prepare()
    drivers = [FileSink(parse_file_sink_options(options)) for _ in range(6)]
    assert_drivers_agree([lambda driver=driver: driver.decision_log("q") for driver in drivers])


def test_on_s3_a_large_file_is_published_by_a_copy_in_parts(spark, tmp_path, s3_server):
    """S3 refuses a single CopyObject above 5 GiB, and a decided batch whose copy is refused stays half published
    for good: large files are copied in parts (UploadPartCopy), which S3 marks in the ETag ("<md5>-<parts>")."""
    import boto3

    from sparkeos.spark.files.sink import file_system

    path = "s3a://sink-bucket/large"
    frame = spark.range(0, 200_000, numPartitions=1).selectExpr("id AS n", "sha2(cast(id AS string), 256) AS text")
    writer = frame.write.format("sparkeos.files").mode("append").option("compression", "none")
    for key, value in s3_server.items():
        writer = writer.option(key, value)
    writer.save(path)
    fs, base = file_system(path, s3_server)
    published = [info for info in fs.get_file_info(pafs.FileSelector(base, recursive=True))
                 if info.type == pafs.FileType.File and info.path.endswith(".parquet")]
    assert len(published) == 1 and published[0].size > 8 * 1024 * 1024
    client = boto3.client("s3", endpoint_url=s3_server["fs.s3a.endpoint"], region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    bucket, _, key = published[0].path.partition("/")
    assert "-" in client.head_object(Bucket=bucket, Key=key)["ETag"], "published by a single CopyObject"
    assert Counter(ds.dataset(base, filesystem=fs, format="parquet").to_table()["n"].to_pylist()) == Counter(
        range(200_000))


@pytest.mark.parametrize("file_format", ["parquet", "json"])
def test_max_records_per_file_rolls_a_tasks_output_into_numbered_files(spark, tmp_path, file_format):
    """As Spark's maxRecordsPerFile: a task starts a new file once one holds that many records, per partitionBy
    directory, and the files are numbered c000, c001... in their names."""
    path = tmp_path / "out"
    frame = spark.range(0, 1000, numPartitions=1).selectExpr("id AS n", "id % 2 AS k")
    (frame.write.format("sparkeos.files").mode("append").option("format", file_format)
     .option("partitionBy", "k").option("maxRecordsPerFile", "150").save(str(path)))
    for k in (0, 1):
        files = sorted(p.name for p in (path / f"k={k}").iterdir())
        assert [name.split(".")[1] for name in files] == ["c000", "c001", "c002", "c003"], files
        sizes = [len(ds.dataset(str(path / f"k={k}" / name), format=file_format).to_table()) for name in files]
        assert sizes == [150, 150, 150, 50]
    table = ds.dataset(str(path), format=file_format, partitioning="hive").to_table()
    assert Counter(table["n"].to_pylist()) == Counter(range(1000))
    with pytest.raises(Exception, match="option 'maxRecordsPerFile' must be a whole number"):
        frame.write.format("sparkeos.files").mode("append").option("maxRecordsPerFile", "many").save(str(path))
