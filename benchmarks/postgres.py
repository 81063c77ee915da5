#!/usr/bin/env python3
"""PostgreSQL sink benchmark: Kafka -> Spark -> PostgreSQL, what users write today against `sparkeos.postgres`.

One sparkeos broker runs in a child process and one PostgreSQL server (tests/support/postgres.py: Debian's
initdb and pg_ctl, a cluster in a temporary directory) beside it; one input topic of --records 100-byte records
is produced once. Each variant reads it all with the `sparkeos.kafka` source (Trigger.AvailableNow,
--max-offsets-per-trigger per micro-batch) and writes (value as a string, partition, offset) to a fresh table of
the same database, created beforehand with the same columns for every variant:

  (a) foreachBatch  foreachBatch + foreachPartition, one psycopg COPY per task (at least once: a retried task or
                    a replayed batch writes its rows again)
  (b) exactly_once  writeStream.format("sparkeos.postgres"): binary COPY, prepared transactions, the driver's
                    decision
  (c) at_least_once writeStream.format("sparkeos.postgres") with deliveryGuarantee at_least_once

rows/s = input records / wall seconds from the query's start to its end. The variants take turns for --rounds
rounds (3) and each reports the median of its rounds; one warm-up query per variant runs first. Every table is
checked with SQL: as many rows as input records and as many distinct (partition, offset) keys, every key one of
the input's, or the variant is INVALID and the run exits 1.

    python benchmarks/postgres.py                      # 1,000,000 records
    python benchmarks/postgres.py --records 100000 --rounds 1
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from files import VALUE_SIZE, produce_input, run_to_end  # the same input as the file sink's benchmark

TARGET = 0.8  # (b) / (a)
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
VARIANTS = {
    "a": "(a) foreachBatch + psycopg COPY",
    "b": "(b) sparkeos.postgres exactly_once",
    "c": "(c) sparkeos.postgres at_least_once",
}
COLUMNS = "value text, kafka_partition integer, kafka_offset bigint"
SERVER_HELPER = Path(__file__).resolve().parent.parent / "tests" / "support" / "postgres.py"


def postgres_server_class():
    """The test suite's PostgresServer, loaded from its file: it needs nothing else of the tests."""
    spec = importlib.util.spec_from_file_location("sparkeos_test_postgres", SERVER_HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PostgresServer


def copy_with_foreach_batch(url: str, table: str):
    """The usual hand-written sink: each task of a batch COPYs its rows in one transaction of its own."""

    def copy_partition(rows) -> None:
        import psycopg

        with psycopg.connect(url) as connection, connection.cursor() as cursor:
            with cursor.copy(f"COPY {table} (value, kafka_partition, kafka_offset) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)

    def write_batch(batch, _batch_id: int) -> None:
        batch.foreachPartition(copy_partition)

    return write_batch


def run_query(spark, bootstrap: str, topic: str, variant: str, url: str, table: str, checkpoint: Path,
              max_offsets: int) -> tuple[float, int]:
    """Seconds from start to end, and the micro-batches that had input."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    frame = (spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(max_offsets)).load()
             .select(F.col("value").cast("string").alias("value"), F.col("partition").alias("kafka_partition"),
                     F.col("offset").alias("kafka_offset")))
    writer = frame.writeStream.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    if variant == "a":
        writer = writer.foreachBatch(copy_with_foreach_batch(url, table))
    else:
        writer = (writer.format("sparkeos.postgres").option("url", url).option("dbtable", table)
                  .option("deliveryGuarantee", "exactly_once" if variant == "b" else "at_least_once"))
    return run_to_end(writer.start(), started, VARIANTS[variant])


def verify(connection, table: str, records: int, partitions: int) -> str | None:
    """None when the table holds each input record once: the row count and the distinct keys equal the input's."""
    rows, distinct, valid = connection.execute(
        f"SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)), "
        f"coalesce(bool_and(kafka_partition >= 0 AND kafka_offset >= 0 "
        f"AND kafka_offset * %s + kafka_partition < %s), true) FROM {table}", [partitions, records]).fetchone()
    if rows != records or distinct != records or not valid:
        return f"{rows} rows, {distinct} distinct keys{'' if valid else ', keys not of the input'}"
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

    work = Path(tempfile.mkdtemp(prefix="sparkeos-postgres-bench-"))
    broker = BrokerProcess(work / "broker")
    server = postgres_server_class()()
    broker.start()
    try:
        server.start()
        url = server.url()
        bootstrap = broker.bootstrap_servers
        print(f"producing {args.records:,} records of {VALUE_SIZE} B ...", flush=True)
        topic = produce_input(bootstrap, args.records, args.partitions, "postgres-bench")
        spark = sparkeos.spark.session("sparkeos-postgres-benchmark", master="local[2]", config={
            "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER})
        spark.sparkContext.setLogLevel("WARN")
        seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
        batches_run: dict[str, int] = {}
        invalid: dict[str, str] = {}
        with server.connect() as connection:
            for round_number in range(args.rounds + 1):  # round 0 warms up
                for variant, name in VARIANTS.items():
                    table, checkpoint = f"bench_{variant}_{round_number}", work / f"ck-{variant}-{round_number}"
                    connection.execute(f"CREATE TABLE {table} ({COLUMNS})")
                    took, batches = run_query(spark, bootstrap, topic, variant, url, table, checkpoint,
                                              args.max_offsets_per_trigger)
                    problem = verify(connection, table, args.records, args.partitions)
                    if problem:
                        invalid[variant] = problem
                    if round_number:
                        seconds[variant].append(took)
                        batches_run[variant] = batches
                        print(f"round {round_number} {name}: {took:.2f} s, {args.records / took:,.0f} rows/s, "
                              f"{batches} batches{', INVALID: ' + problem if problem else ''}", flush=True)
                    connection.execute(f"DROP TABLE {table}")
                    shutil.rmtree(checkpoint, ignore_errors=True)
            left = connection.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
            if left:
                invalid["b"] = f"{left} prepared transactions left"
        spark.stop()
    finally:
        broker.kill()
        server.destroy()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.records:,} records, {args.partitions} partitions, maxOffsetsPerTrigger "
          f"{args.max_offsets_per_trigger:,}, median of {args.rounds} rounds")
    print(f"{'variant':38} {'rows/s':>12} {'vs (a)':>7} {'batches':>8}  check")
    rates = {variant: args.records / statistics.median(seconds[variant]) for variant in VARIANTS}
    for variant, name in VARIANTS.items():
        print(f"{name:38} {rates[variant]:>12,.0f} {rates[variant] / rates['a']:>6.2f}x {batches_run[variant]:>8}  "
              f"{'INVALID: ' + invalid[variant] if variant in invalid else 'exact'}")
    ratio = rates["b"] / rates["a"]
    print(f"(b)/(a) = {ratio:.2f}x (target >= {TARGET}x: {'met' if ratio >= TARGET else 'MISSED'})")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
