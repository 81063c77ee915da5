"""Exactly-once queries on a one-core local Spark, where the Python worker each sink task runs in is known.

    python tests/support/producer_cache_job.py --bootstrap HOST:PORT --workdir DIR --files-sink T1 \
        --pipeline-source T2 --pipeline-sink T3

1. Text files -> sink topic T1, one file per batch. Spark's file source runs in the JVM, so the only Python worker
   the tasks use is the sink's, and with one core it is the same worker every batch. The query runs three times
   from one checkpoint: batches 0-2, then 3-4, then (after this script called init_transactions on the query's
   transactional.id, as a zombie or another worker would) 5-6.
2. T2 -> T3 through the sparkeos source, 100 records per batch. Each task runs a Python worker for the source too,
   and Spark hands each task the idle worker that waited longest: the sink's task of batch B runs in the worker
   that read batch B-1, whose cached producer another worker's init_transactions has fenced since.

Prints `DONE` at the end, and `PART 2` on standard error between the parts (the workers' librdkafka logs go there).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from confluent_kafka import Producer

import sparkeos.spark

RUNS = ((0, 3), (3, 5), (5, 7))  # the files each run of part 1 finds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--workdir", "--files-sink", "--pipeline-source", "--pipeline-sink"):
        parser.add_argument(name, required=True)
    return parser.parse_args()


def write_files(directory: Path, first: int, end: int) -> None:
    for number in range(first, end):
        partial = directory / f".file-{number}.tmp"
        partial.write_text("".join(f"file{number}-line{line}\n" for line in range(10)))
        partial.rename(directory / f"file-{number}.txt")


def files_to_kafka(spark, args: argparse.Namespace, prefix: str) -> None:
    workdir = Path(args.workdir)
    inputs = workdir / "files"
    inputs.mkdir()
    for run, (first, end) in enumerate(RUNS):
        if run == 2:
            fence_the_query_producer(args.bootstrap, f"{prefix}-0")
        write_files(inputs, first, end)
        query = (spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(inputs))
                 .writeStream.format("sparkeos.kafka")
                 .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.files_sink)
                 .option("transactionalIdPrefix", prefix)
                 .option("checkpointLocation", str(workdir / "files-checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()


def fence_the_query_producer(bootstrap: str, transactional_id: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.close()


def kafka_to_kafka(spark, args: argparse.Namespace) -> None:
    query = (spark.readStream.format("sparkeos.kafka")
             .option("kafka.bootstrap.servers", args.bootstrap).option("subscribe", args.pipeline_source)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 100).load()
             .selectExpr("value")
             .writeStream.format("sparkeos.kafka")
             .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.pipeline_sink)
             .option("checkpointLocation", str(Path(args.workdir) / "pipeline-checkpoint")).start())
    query.processAllAvailable()
    query.stop()


def main() -> None:
    args = parse_args()
    spark = sparkeos.spark.session("sparkeos-producer-cache", master="local[1]",
                                   config={"spark.ui.enabled": "false", "spark.driver.memory": "1g",
                                           "spark.sql.shuffle.partitions": "1"})
    spark.sparkContext.setLogLevel("ERROR")
    files_to_kafka(spark, args, f"files-{Path(args.workdir).name}")
    print("PART 2", file=sys.stderr, flush=True)
    kafka_to_kafka(spark, args)
    spark.stop()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
