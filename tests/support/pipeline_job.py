"""A standalone Spark driver for the crash tests: Kafka -> Spark -> Kafka, exactly once, until killed.

    python tests/support/pipeline_job.py --bootstrap HOST:PORT --source IN --sink OUT --checkpoint DIR \
        [--master local[2] | spark://HOST:PORT] [--trigger-ms N] [--stateful]

Stateless (default): keep the values whose number is not divisible by 7 and append "!".
Stateful (--stateful): count the records of each key within 20-second event-time windows (watermark 10 s) and
write "<window start>/<key>=<count>" once a window closes (append mode).

The driver prints `QUERY RUNNING <id>` once the query started, `BATCH <n> <rows>` per finished batch, and
otherwise runs until it is killed; the tests kill it with SIGKILL and restart it from the same checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sparkeos.spark.workers import worker_python

RUNNING_PREFIX = "QUERY RUNNING"
BATCH_PREFIX = "BATCH"
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
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
    return parser.parse_args(argv)


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


def build_stream(spark, args: argparse.Namespace):
    from pyspark.sql import functions as F

    source = (
        spark.readStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
        .load()
    )
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


def start_query(spark, args: argparse.Namespace):
    writer = (
        build_stream(spark, args)
        .writeStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.sink)
        .option("checkpointLocation", args.checkpoint)
        .option("deliveryGuarantee", "exactly_once")
        .option("kafka.transaction.timeout.ms", str(args.transaction_timeout_ms))
        .outputMode("append")
    )
    if args.transactional_id_prefix:
        writer = writer.option("transactionalIdPrefix", args.transactional_id_prefix)
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

    spark = sparkeos.spark.session(
        "sparkeos-crash-job", master=args.master, config=spark_config(args.master, args.ui_port)
    )
    spark.sparkContext.setLogLevel("WARN")
    query = start_query(spark, args)
    print(f"{RUNNING_PREFIX} {query.id}", flush=True)
    last_reported = -1
    while query.isActive:
        query.awaitTermination(0.5)
        last_reported = report_progress(query, last_reported)
    # Only an error ends the query on its own: say so, and fail.
    error = query.exception()
    print(f"QUERY ENDED {error}", flush=True)
    time.sleep(0.1)
    return 1


if __name__ == "__main__":
    sys.exit(main())
