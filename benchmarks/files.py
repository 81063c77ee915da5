#!/usr/bin/env python3
"""File sink benchmark: Kafka -> Spark -> parquet, Spark's own file sink against `sparkeos.files`, one run.

One sparkeos broker runs in a child process; one input topic of --records 100-byte records is produced once.
Each variant reads it all with the `sparkeos.kafka` source (Trigger.AvailableNow, --max-offsets-per-trigger per
micro-batch) and writes (value as a string, partition, offset) as parquet to a fresh directory:

  (a) spark     writeStream.format("parquet"): Spark's file sink (exactly once for readers of _spark_metadata)
  (b) sparkeos  writeStream.format("sparkeos.files"): two-phase commit, exactly once for any reader

rows/s = input records / wall seconds from the query's start to its end. The variants take turns for --rounds
rounds (3) and each reports the median of its rounds; one warm-up query per variant runs first. Every output is
read back with pyarrow.dataset (which skips `_spark_metadata` and `_sparkeos`): every (partition, offset) of the
input exactly once, or the row is INVALID and the run exits 1. Also printed: files written per micro-batch.

    python benchmarks/files.py                      # 1,000,000 records
    python benchmarks/files.py --records 100000 --rounds 1
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

VALUE_SIZE = 100
TARGET = 0.9  # (b) / (a)
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
VARIANTS = {"a": ("(a) Spark parquet file sink", "parquet"), "b": ("(b) sparkeos.files parquet", "sparkeos.files")}


def produce_input(bootstrap: str, records: int, partitions: int, prefix: str = "files-bench") -> str:
    """A new topic of `records` records of VALUE_SIZE bytes, record i in partition i % partitions."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for i in range(records):
        head = b"%09d-" % i
        while True:
            try:
                producer.produce(topic, value=head + b"x" * (VALUE_SIZE - len(head)), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("producing the input timed out")
    return topic


def run_query(spark, bootstrap: str, topic: str, sink_format: str, path: Path, checkpoint: Path,
              max_offsets: int) -> tuple[float, int]:
    """Seconds from start to end, and the micro-batches that had input."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    frame = (spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(max_offsets)).load()
             .select(F.col("value").cast("string").alias("value"), "partition", "offset"))
    query = (frame.writeStream.format(sink_format).option("path", str(path))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    return run_to_end(query, started, sink_format)


def run_to_end(query, started: float, name: str) -> tuple[float, int]:
    """Wait for an availableNow query: seconds since `started`, and the micro-batches that had input."""
    if not query.awaitTermination(1800):
        query.stop()
        raise TimeoutError(f"the {name} query did not finish in 1800 s")
    seconds = time.monotonic() - started
    if query.exception() is not None:
        raise RuntimeError(f"the {name} query failed: {query.exception()}")
    batches = len([p for p in query.recentProgress if p.get("numInputRows", 0)])
    return seconds, batches


def data_files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*.parquet") if not any(part.startswith(("_", ".")) for part in p.parts[-2:])]


def verify(path: Path, records: int, partitions: int) -> str | None:
    import pyarrow.dataset as ds

    table = ds.dataset(str(path), format="parquet").to_table(columns=["partition", "offset"])
    seen = set(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True))
    expected = {(i % partitions, i // partitions) for i in range(records)}
    if table.num_rows != records or seen != expected:
        return f"{table.num_rows} rows, {len(seen)} distinct, {len(expected - seen)} missing"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=250_000)
    args = parser.parse_args()

    import sparkeos.spark
    from sparkeos.broker import BrokerProcess

    work = Path(tempfile.mkdtemp(prefix="sparkeos-files-bench-"))
    broker = BrokerProcess(work / "broker")
    broker.start()
    try:
        bootstrap = broker.bootstrap_servers
        print(f"producing {args.records:,} records of {VALUE_SIZE} B ...", flush=True)
        topic = produce_input(bootstrap, args.records, args.partitions)
        spark = sparkeos.spark.session("sparkeos-files-benchmark", master="local[2]", config={
            "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER})
        spark.sparkContext.setLogLevel("WARN")
        seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
        files_per_batch: dict[str, float] = {}
        invalid: dict[str, str] = {}
        for round_number in range(args.rounds + 1):  # round 0 warms up
            for variant, (name, sink_format) in VARIANTS.items():
                path, checkpoint = work / f"{variant}-{round_number}", work / f"ck-{variant}-{round_number}"
                took, batches = run_query(spark, bootstrap, topic, sink_format, path, checkpoint,
                                          args.max_offsets_per_trigger)
                problem = verify(path, args.records, args.partitions)
                if problem:
                    invalid[variant] = problem
                if round_number:
                    seconds[variant].append(took)
                    files_per_batch[variant] = len(data_files(path)) / max(batches, 1)
                    print(f"round {round_number} {name}: {took:.2f} s, {args.records / took:,.0f} rows/s, "
                          f"{batches} batches", flush=True)
                shutil.rmtree(path, ignore_errors=True)
                shutil.rmtree(checkpoint, ignore_errors=True)
        spark.stop()
    finally:
        broker.kill()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.records:,} records, {args.partitions} partitions, maxOffsetsPerTrigger "
          f"{args.max_offsets_per_trigger:,}, median of {args.rounds} rounds")
    print(f"{'variant':34} {'rows/s':>12} {'files/batch':>12}  check")
    rates = {}
    for variant, (name, _format) in VARIANTS.items():
        rates[variant] = args.records / statistics.median(seconds[variant])
        print(f"{name:34} {rates[variant]:>12,.0f} {files_per_batch[variant]:>12.1f}  "
              f"{'INVALID: ' + invalid[variant] if variant in invalid else 'exact'}")
    ratio = rates["b"] / rates["a"]
    print(f"(b)/(a) = {ratio:.2f}x (target >= {TARGET}x: {'met' if ratio >= TARGET else 'MISSED'})")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
