"""A standalone Spark driver for the crash tests: Kafka -> Spark -> Kafka, files or PostgreSQL, exactly once, until
killed.

    python tests/support/pipeline_job.py --bootstrap HOST:PORT --source IN \
        (--sink OUT | --sink-path DIR | --postgres-url URL --postgres-table T
         | --jsonl-path DIR --control-location DIR) \
        --checkpoint DIR [--master local[2] | local[2,4] | spark://HOST:PORT] [--trigger-ms N] [--stateful] \
        [--sink-format parquet|json] [--attempt-column] [--slow-first-attempt S --rendezvous-dir DIR] \
        [--conf KEY=VALUE ...]

Stateless (default): keep the values whose number is not divisible by 7 and append "!".
Stateful (--stateful, Kafka only): count the records of each key within 20-second event-time windows (watermark
10 s) and write "<window start>/<key>=<count>" once a window closes (append mode).

With --sink-path the stateless stream goes to the `sparkeos.files` sink at DIR instead of a topic, as the columns
`n` (the number), `text` (the value with "!" appended) and, with --attempt-column, `attempt` (the Spark task
attempt that wrote the row), partitioned by `k` = n % 3, so that every batch commits several files per task.
--slow-first-attempt holds every attempt of partition 0 of every batch, once it passed on all of its rows, until
another attempt of the same task got as far, for at most S seconds: the first attempt is slow, so that Spark
launches a speculative copy of it, and then both attempts end their input, and pre-commit, at the same moment.
The attempts meet through files in --rendezvous-dir, which every executor must see (one machine); once the test
removes that directory, no attempt waits any more.

With --postgres-url the stateless stream goes to the `sparkeos.postgres` sink instead, exactly once, into the table
--postgres-table (created when missing) with the same columns `n`, `k` and `text`.

With --jsonl-path it goes, as the same columns, to the five-method sink of support/jsonl_sink.py, which keeps its
attempts and decisions under --control-location.

The driver prints `QUERY RUNNING <id>` once the query started, `BATCH <n> <rows>` per finished batch, and
otherwise runs until it is killed; the tests kill it with SIGKILL and restart it from the same checkpoint.
On SIGTERM it stops the query and the session, prints `QUERY STOPPED` and exits with 0: a clean stop.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from sparkeos.spark.workers import worker_python

RUNNING_PREFIX = "QUERY RUNNING"
BATCH_PREFIX = "BATCH"
STOPPED_LINE = "QUERY STOPPED"
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", help="the output topic")
    parser.add_argument("--sink-path", help="write to the sparkeos.files sink at this directory instead of a topic")
    parser.add_argument("--sink-format", choices=("parquet", "json"), default="parquet")
    parser.add_argument("--attempt-column", action="store_true", help="files: add the writing task's attempt number")
    parser.add_argument("--slow-first-attempt", type=float, default=0.0, metavar="SECONDS",
                        help="files: partition 0's attempts wait for another attempt to end too, at most this long")
    parser.add_argument("--rendezvous-dir", help="where the attempts of --slow-first-attempt meet")
    parser.add_argument("--postgres-url", help="write to the sparkeos.postgres sink at this database instead")
    parser.add_argument("--postgres-table", help="the sparkeos.postgres sink's table")
    parser.add_argument("--jsonl-path", help="write to the five-method JSON-lines sink at this directory instead")
    parser.add_argument("--control-location", help="the JSON-lines sink's controlLocation")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="more Spark configuration")
    parser.add_argument("--low-latency", action="store_true", help="sparkeos.spark.session(low_latency=True)")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--trigger-ms", type=int, default=0, help="processing-time trigger; 0 = back to back")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=200)
    parser.add_argument("--transactional-id-prefix", default=None)
    parser.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=10_000,
        help="short, so a transaction left open by a killed driver is aborted by the broker soon",
    )
    parser.add_argument("--ui-port", type=int, default=0, help="serve Spark's UI and REST API here; 0 = no UI")
    parser.add_argument("--stateful", action="store_true")
    args = parser.parse_args(argv)
    if [args.sink, args.sink_path, args.postgres_url, args.jsonl_path].count(None) != 3:
        parser.error("give one of --sink (a topic), --sink-path (a directory), --postgres-url (a database) and "
                     "--jsonl-path (a directory)")
    if (args.jsonl_path is None) != (args.control_location is None):
        parser.error("--jsonl-path and --control-location go together")
    if (args.postgres_url is None) != (args.postgres_table is None):
        parser.error("--postgres-url and --postgres-table go together")
    if (args.sink_path or args.postgres_url or args.jsonl_path) and args.stateful:
        parser.error("--stateful writes to a topic only")
    if (args.postgres_url or args.jsonl_path) and (args.attempt_column or args.slow_first_attempt):
        parser.error("--attempt-column and --slow-first-attempt are for --sink-path")
    if args.slow_first_attempt and not args.rendezvous_dir:
        parser.error("--slow-first-attempt needs --rendezvous-dir")
    if any("=" not in item for item in args.conf):
        parser.error("--conf takes KEY=VALUE")
    return args


def spark_config(master: str, ui_port: int = 0) -> dict[str, str]:
    config = {
        "spark.ui.enabled": "true" if ui_port else "false",
        "spark.ui.port": str(ui_port or 4040),
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.python.worker.reuse": "true",
        # Python workers start slowly on a loaded machine: give daemon workers 120 s instead of 15 s to connect back.
        # (The streaming source runner's own wait is fixed inside Spark; under extreme load it can still time out.)
        "spark.python.authenticate.socketTimeout": "120s",
        # Executors must run this interpreter too, wherever they are: it is the one with sparkeos installed
        # (for a local master, through the script that spares each new worker from compiling pyspark again).
        "spark.pyspark.python": worker_python(master),
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": worker_python(master),
        # The tests restart drivers many times: C1-only JIT starts a JVM faster and burns less CPU.
        "spark.driver.extraJavaOptions": JVM_OPTIONS,
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
    }
    if master.startswith("spark://"):
        config.update(
            {
                "spark.executor.cores": "1",
                "spark.cores.max": "2",
                "spark.executor.memory": "1g",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                # A dead worker's tasks are re-run; a few failures of one task are expected, not fatal.
                "spark.task.maxFailures": "8",
            }
        )
    return config


def read_source(spark, args: argparse.Namespace):
    return (
        spark.readStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
        .load()
    )


def build_stream(spark, args: argparse.Namespace):
    from pyspark.sql import functions as F

    source = read_source(spark, args)
    if args.stateful:
        return (
            source.withWatermark("timestamp", "10 seconds")
            .groupBy(F.window("timestamp", "20 seconds"), "key")
            .count()
            .select(
                "key",
                F.concat_ws(
                    "/",
                    F.col("window.start").cast("long").cast("string"),
                    F.concat(F.col("key").cast("string"), F.lit("="), F.col("count").cast("string")),
                ).alias("value"),
            )
        )
    number = F.col("value").cast("string").cast("long")
    return source.where(number % 7 != 0).select("key", F.concat("value", F.lit(b"!")).alias("value"))


def build_row_stream(spark, args: argparse.Namespace):
    """The stateless job as rows for the file and PostgreSQL sinks: n, k = n % 3, text."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string")
    number = value.cast("long")
    return (
        read_source(spark, args)
        .where(number % 7 != 0)
        .select(number.alias("n"), (number % 3).alias("k"), F.concat(value, F.lit("!")).alias("text"))
    )


def build_file_stream(spark, args: argparse.Namespace):
    """The stateless job as rows for the file sink: n, k = n % 3, text (and attempt)."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    frame = build_row_stream(spark, args)
    if not (args.attempt_column or args.slow_first_attempt):
        return frame
    schema = StructType([*frame.schema.fields, StructField("attempt", IntegerType())])
    return frame.mapInArrow(tag_attempt(args.slow_first_attempt, args.rendezvous_dir), schema)


def tag_attempt(slow_s: float, rendezvous_dir: str | None):
    """A mapInArrow function (run once per task) adding the task's attempt number to every row; with `slow_s`, an
    attempt of partition 0 then waits for another attempt of its task to pass on all of its rows too."""

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber()
        for batch in batches:
            yield batch.append_column("attempt", pa.array([attempt] * batch.num_rows, pa.int32()))
        # The writer gets the end of its input only when this returns: held here, it has written every row and
        # not yet pre-committed.
        if slow_s and context.partitionId() == 0:
            meet_another_attempt(rendezvous_dir, context.stageId(), attempt, slow_s)

    return run


def meet_another_attempt(directory: str, stage: int, attempt: int, timeout_s: float) -> None:
    prefix = f"stage-{stage}-attempt-"
    deadline = time.monotonic() + timeout_s
    try:
        open(os.path.join(directory, f"{prefix}{attempt}"), "w").close()
        # Polled often: the attempts must go on within a few milliseconds of each other, well before the first
        # one to finish has Spark kill the other.
        while time.monotonic() < deadline:
            if any(name.startswith(prefix) and name != f"{prefix}{attempt}" for name in os.listdir(directory)):
                return
            time.sleep(0.002)
    except FileNotFoundError:  # the test removed the directory: no more waiting
        return


def start_file_query(spark, args: argparse.Namespace):
    writer = (
        build_file_stream(spark, args)
        .writeStream.format("sparkeos.files")
        .option("path", args.sink_path)
        .option("format", args.sink_format)
        .option("partitionBy", "k")
    )
    return start_writer(writer, args)


def start_postgres_query(spark, args: argparse.Namespace):
    writer = (
        build_row_stream(spark, args)
        .writeStream.format("sparkeos.postgres")
        .option("url", args.postgres_url)
        .option("dbtable", args.postgres_table)
        .option("createTable", "true")
    )
    return start_writer(writer, args)


def start_jsonl_query(spark, args: argparse.Namespace):
    from jsonl_sink import FORMAT, register  # beside this script

    register(spark)
    writer = (
        build_row_stream(spark, args)
        .writeStream.format(FORMAT)
        .option("path", args.jsonl_path)
        .option("controlLocation", args.control_location)
    )
    return start_writer(writer, args)


def start_query(spark, args: argparse.Namespace):
    if args.sink_path:
        return start_file_query(spark, args)
    if args.postgres_url:
        return start_postgres_query(spark, args)
    if args.jsonl_path:
        return start_jsonl_query(spark, args)
    writer = (
        build_stream(spark, args)
        .writeStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.sink)
        .option("deliveryGuarantee", "exactly_once")
        .option("kafka.transaction.timeout.ms", str(args.transaction_timeout_ms))
    )
    if args.transactional_id_prefix:
        writer = writer.option("transactionalIdPrefix", args.transactional_id_prefix)
    return start_writer(writer, args)


def start_writer(writer, args: argparse.Namespace):
    """What every sink of the job shares: its checkpoint, append mode, and the trigger."""
    writer = writer.option("checkpointLocation", args.checkpoint).outputMode("append")
    if args.trigger_ms:
        writer = writer.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    return writer.start()


def report_progress(query, last_reported: int) -> int:
    for progress in query.recentProgress:
        if progress["batchId"] > last_reported:
            print(f"{BATCH_PREFIX} {progress['batchId']} {progress['numInputRows']}", flush=True)
            last_reported = progress["batchId"]
    return last_reported


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = worker_python(args.master)
    import sparkeos.spark

    config = spark_config(args.master, args.ui_port)
    config.update(item.split("=", 1) for item in args.conf)
    spark = sparkeos.spark.session("sparkeos-crash-job", master=args.master, config=config,
                                   low_latency=args.low_latency)
    spark.sparkContext.setLogLevel("WARN")
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signal, _frame: stop_requested.set())
    query = start_query(spark, args)
    print(f"{RUNNING_PREFIX} {query.id}", flush=True)
    last_reported = -1
    while query.isActive:
        if stop_requested.is_set():
            query.stop()
            report_progress(query, last_reported)
            spark.stop()
            print(STOPPED_LINE, flush=True)
            return 0
        query.awaitTermination(0.5)
        last_reported = report_progress(query, last_reported)
    # Only an error ends the query on its own: say so, and fail.
    error = query.exception()
    print(f"QUERY ENDED {error}", flush=True)
    time.sleep(0.1)
    return 1


if __name__ == "__main__":
    sys.exit(main())
