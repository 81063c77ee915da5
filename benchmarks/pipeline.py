#!/usr/bin/env python3
"""End-to-end pipeline benchmark: Kafka -> filter + map -> Kafka, six ways, one broker.

One broker runs in a child process (so it never shares a GIL with the pipeline measured): the sparkeos
broker, or with --broker kafka-<version> a one-node Apache Kafka (benchmarks/kafka_setup.py). One input
topic of --records 100-byte records is produced once. Each variant then reads it all,
keeps the records whose first byte is even, upper-cases them and appends b"!", and writes them to a
fresh output topic of its own:

  (a) raw    confluent-kafka consume -> transform -> transactional produce loop, offsets sent with
             send_offsets_to_transaction, one transaction per --txn-records input records, one process
  (b) spark  spark.readStream.format("sparkeos.kafka") -> filter/map -> writeStream.format("sparkeos.kafka"),
             deliveryGuarantee=exactly_once, Trigger.AvailableNow, local[2], checkpoints on local disk through
             Spark's FileSystem-based checkpoint file manager (CHECKPOINT_FILE_MANAGER says why)
  (c) spark  the same with deliveryGuarantee=at_least_once
  (d) quix   Quix Streams, processing_guarantee="exactly-once"
  (e) spark  Spark's own connector: readStream.format("kafka") -> writeStream.format("kafka"), at least once,
             what a Spark user has today (spark-sql-kafka-0-10 from Maven Central, see
             tests/support/spark_kafka.py); otherwise as (b)
  (f) spark  Spark's source (format("kafka")) into the sparkeos exactly_once sink

(b)/(e) is the price of exactly-once against what a Spark user has today; (f)/(e) the price of the sink
alone; (c)/(e) the sparkeos connector's own cost at Spark's guarantee.

msgs/s = input records / wall seconds from the start of processing (clients created, query started)
until the last output is committed. Each variant runs --rounds times (3), the variants taking turns within each
round, and its msgs/s is the median of its rounds: this machine's speed drifts by 15% and more within minutes,
and one measurement per variant, minutes apart, put that drift into the ratios. Spark's session stays up through
all rounds (idle while (a) and (d) run). Spark's session start-up, and three warm-up queries over the same input
that start its Python workers and let the JVM compile the paths every query and record takes, are timed
and printed but are not in (b)/(c). Each measured query still starts its own Python source runner and
clients.

Every variant's output is checked by an independent read_committed reader: record count and an
order-independent checksum of the values must equal what the input implies. A mismatch marks the row
INVALID and the run exits 1: a variant cannot look fast by dropping or duplicating records.

    python benchmarks/pipeline.py                       # 1,000,000 records, all variants
    python benchmarks/pipeline.py --records 100000 --variants a,b
    python benchmarks/pipeline.py --json                # also print the results as one JSON object
    python benchmarks/pipeline.py --broker kafka-4.4.0 --variants a,b,c,e,f

Quix Streams pins confluent-kafka < 2.13 while sparkeos needs >= 2.16, so it cannot share the project's
environment: (d) runs in a child process on --quix-python (default .venv-quix/bin/python), made with

    python3.11 -m venv .venv-quix && .venv-quix/bin/pip install quixstreams

This file must stay importable there: only the standard library and confluent_kafka at module level.
This is a benchmark, not a test: a missed target is reported, never raised; a wrong output count fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent
DEFAULT_QUIX_PYTHON = REPO / ".venv-quix" / "bin" / "python"
VALUE_SIZE = 100
# Three full passes over the input before the measured queries. After one (of 200,000 records, or of all of them),
# whichever of (b) and (c) ran first took 0.65-1.3 s longer in addBatch than the other in 6 of 7 runs, in either
# order. In one of them the JVM spent 1.6 CPU-s more in the first query and JIT-compiled 1,860 methods against
# 771 in the second, most on the path that plans and starts a query. After two, the first measured query still
# ran long in 5 of 5 sessions of 4-5 queries: 3.51-4.18 s against 2.71-3.54 s for the later ones, with 1.69-2.09
# JVM CPU-s against 1.01-1.61, whether it was (b) or (c). A third costs about 10 s. Whether it is enough is not
# shown: in the same hour the machine's speed drifted by a third (four queries of 4.08-4.46 s after three warm-ups).
WARMUP_QUERIES = 3

VARIANTS = {
    "a": "(a) confluent-kafka EOS loop",
    "b": "(b) sparkeos exactly_once",
    "c": "(c) sparkeos at_least_once",
    "d": "(d) quixstreams exactly-once",
    "e": "(e) spark kafka at-least-once",
    "f": "(f) spark kafka -> sparkeos exactly_once",
}
# The Spark variants: (source format, sink format, the sparkeos sink's deliveryGuarantee or None for Spark's sink).
SPARK_VARIANTS = {
    "b": ("sparkeos.kafka", "sparkeos.kafka", "exactly_once"),
    "c": ("sparkeos.kafka", "sparkeos.kafka", "at_least_once"),
    "e": ("kafka", "kafka", None),
    "f": ("kafka", "sparkeos.kafka", "exactly_once"),
}
# (numerator, denominator, target or None): the ratios of msgs/s this benchmark reports.
TARGETS = [("b", "a", 1.0), ("b", "d", 5.0), ("b", "c", 0.85), ("b", "e", None), ("f", "e", None), ("c", "e", None)]


class VerificationError(AssertionError):
    """A variant's committed output is not exactly what its input implies."""


# --------------------------------------------------------------------------------------------
# Records


def input_value(i: int) -> bytes:
    """100 bytes; the first byte is a lower-case letter, even for half the records."""
    head = b"%c%09d-" % (97 + i % 26, i)
    return head + b"x" * (VALUE_SIZE - len(head))


def transform(value: bytes) -> bytes | None:
    """The pipeline's filter + map, as every variant must compute it."""
    if value[0] % 2:
        return None
    return value.upper() + b"!"


@dataclass
class Expected:
    count: int
    checksum: int


def checksum(values: list[bytes]) -> int:
    # A sum of CRCs does not depend on order, which no variant promises across partitions.
    return sum(zlib.crc32(v) for v in values)


# --------------------------------------------------------------------------------------------
# Topics and the independent reader


def create_topic(bootstrap: str, name: str, partitions: int) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, replication_factor=1)])[name].result(30)
    return name


def new_topic_name(what: str) -> str:
    return f"pipeline-{what}-{uuid.uuid4().hex[:8]}"


def input_partition(i: int, partitions: int) -> int:
    """Consecutive pairs share a partition, so each partition holds as many records the filter keeps as it drops.

    The filter keeps exactly the odd i; with `i % partitions` and 2 partitions it kept nothing of partition 0, so
    one Spark task wrote every output record while the other wrote none."""
    return (i // 2) % partitions


def produce_input(bootstrap: str, topic: str, records: int, partitions: int) -> Expected:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
        }
    )
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    count, total = 0, 0
    for i in range(records):
        value = input_value(i)
        out = transform(value)
        if out is not None:
            count += 1
            total += zlib.crc32(out)
        while True:
            try:
                producer.produce(topic, value=value, partition=input_partition(i, partitions), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120) or failures:
        raise RuntimeError(f"producing the input failed: {failures[:3]}")
    return Expected(count, total)


def end_offsets(consumer: Consumer, topic: str) -> dict[int, int]:
    metadata = consumer.list_topics(topic, timeout=10)
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
        for p in metadata.topics[topic].partitions
    }


def read_committed_output(bootstrap: str, topic: str, timeout_s: float = 300.0) -> Expected:
    """Count and checksum every visible record of `topic`, read to its end with a fresh read_committed consumer."""
    from sparkeos.verify import ReadTimeout, iter_records  # not importable where the Quix worker runs

    count, total = 0, 0
    try:
        for record in iter_records(bootstrap, topic, timeout_s=timeout_s):
            count += 1
            total += zlib.crc32(record.value)
    except ReadTimeout as exc:
        raise VerificationError(str(exc)) from exc
    return Expected(count, total)


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class Result:
    """A variant's rounds: every one must verify."""

    variant: str
    name: str
    rounds_seconds: list[float] = field(default_factory=list)
    output_records: int | None = None
    verified: bool | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the last round's own figures
    records: int = 0

    @property
    def seconds(self) -> float | None:
        return statistics.median(self.rounds_seconds) if self.rounds_seconds else None

    @property
    def msgs_per_s(self) -> float | None:
        return self.records / self.seconds if self.rounds_seconds else None

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": self.seconds, "msgs_per_s": self.msgs_per_s,
                "rounds_msgs_per_s": [self.records / s for s in self.rounds_seconds]}


def verify(result: Result, bootstrap: str, topic: str, expected: Expected) -> None:
    found = read_committed_output(bootstrap, topic)
    result.output_records = found.count
    result.verified = result.verified is not False and found == expected
    if found != expected:
        result.error = (
            f"VERIFICATION FAILED: {topic} holds {found.count} committed records (checksum {found.checksum}), "
            f"expected {expected.count} (checksum {expected.checksum})"
        )
        print(f"\n!!! {result.name}: {result.error}\n", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# (a) the classic consume -> transform -> produce loop


def produce_retrying(producer: Producer, topic: str, value: bytes, key: bytes | None) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key)
            return
        except BufferError:
            producer.poll(0.05)  # local queue full: let deliveries drain


def run_raw_loop(bootstrap: str, source: str, sink: str, txn_records: int) -> dict[str, Any]:
    """One transaction per `txn_records` input records, input offsets committed inside it."""
    started = time.monotonic()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": new_topic_name("raw"),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # As the sparkeos source does: librdkafka's default pauses fetching 1 s whenever 100,000 records wait.
            "fetch.queue.backoff.ms": 10,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": new_topic_name("raw-txn"), "linger.ms": 5})
    producer.init_transactions(30)
    ends = end_offsets(consumer, source)
    consumer.subscribe([source])
    pending = {p for p, end in ends.items() if end > 0}
    positions: dict[int, int] = {}
    processed, in_txn, transactions, first_record_s = 0, 0, 0, None
    producer.begin_transaction()
    while pending:
        for message in consumer.consume(1000, 0.5):
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                if message.offset() >= ends[message.partition()]:
                    pending.discard(message.partition())
                continue
            if first_record_s is None:
                first_record_s = time.monotonic() - started
            positions[message.partition()] = message.offset() + 1
            processed += 1
            in_txn += 1
            out = transform(message.value())
            if out is not None:
                produce_retrying(producer, sink, out, message.key())
        if in_txn >= txn_records or (not pending and in_txn):
            producer.send_offsets_to_transaction(
                [TopicPartition(source, p, o) for p, o in positions.items()], consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
            transactions += 1
            in_txn = 0
            if pending:
                producer.begin_transaction()
    seconds = time.monotonic() - started
    consumer.close()
    return {
        "seconds": seconds,
        "processed": processed,
        "transactions": transactions,
        "first_record_s": round(first_record_s or 0.0, 3),
    }


# --------------------------------------------------------------------------------------------
# (b), (c) Spark


def compile_sparkeos_bytecode() -> None:
    """Write sparkeos' bytecode, as pip does for a package it installs. Spark starts a fresh Python process for
    every streaming query (its source runner), which imports sparkeos; an editable install run with
    PYTHONDONTWRITEBYTECODE=1, as this benchmark's machine sets it, compiled sparkeos' modules from source in
    each of them: 105-125 ms of import against 55-86 ms with bytecode."""
    import compileall

    import sparkeos

    compileall.compile_dir(str(Path(sparkeos.__file__).parent), quiet=1)


# The checkpoints here are on local disk, and pip's Spark has no native Hadoop library: Spark's default checkpoint file
# manager, through Hadoop's FileContext, started 33 processes per query (9 chmod, 24 readlink, 2-5 ms apart, before the
# source runner starts and after the batch); this one starts the 9 chmod. On a local disk both give the
# same guarantee (Hadoop's local FileContext also checks that a log file is absent, then renames), and the stores a
# production checkpoint lives on (HDFS, object stores) start no process either way. Two sessions of 8 pairs of queries
# alternating the two: medians 2.77 and 2.07 s with the default, 2.38 and 1.80 s with this one (all 8 pairs of the
# second session faster).
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def spark_session_for_benchmark(app_name: str = "sparkeos-pipeline-benchmark", more: dict[str, str] | None = None):
    """The benchmarks' Spark session (benchmarks/latency.py's too, with `more` settings)."""
    import sparkeos.spark

    # PYSPARK_PYTHON as sparkeos.spark.session chooses it for a local master (see sparkeos.spark.workers).
    return sparkeos.spark.session(
        app_name,
        master="local[2]",
        config={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "2g",
            "spark.python.worker.reuse": "true",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
            **(more or {}),
        },
    )


def run_spark_query(
    spark, bootstrap: str, source: str, sink: str, variant: str, checkpoint: str, max_offsets_per_trigger: int
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    source_format, sink_format, guarantee = SPARK_VARIANTS[variant]
    started = time.monotonic()
    reader = (
        spark.readStream.format(source_format)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    text = F.col("value").cast("string")
    frame = (
        reader.load()
        .where(F.ascii(text) % 2 == 0)
        .select("key", F.concat(F.upper(text), F.lit("!")).cast("binary").alias("value"))
    )
    writer = frame.writeStream.format(sink_format).option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
    if guarantee is not None:
        writer = writer.option("deliveryGuarantee", guarantee)
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    if not query.awaitTermination(1800):
        query.stop()
        raise TimeoutError(f"the {VARIANTS[variant]} query did not finish in 1800 s")
    seconds = time.monotonic() - started
    if query.exception() is not None:
        raise RuntimeError(f"the {VARIANTS[variant]} query failed: {query.exception()}")
    return {"seconds": seconds, **progress_summary(query.recentProgress)}


def progress_summary(progress: list) -> dict[str, Any]:
    """Where Spark says each micro-batch spent its time (ms, summed over batches)."""
    batches = [p for p in progress if p.get("numInputRows", 0)]
    phases: dict[str, int] = {}
    for p in batches:
        for phase, ms in (p.get("durationMs") or {}).items():
            phases[phase] = phases.get(phase, 0) + int(ms)
    return {"batches": len(batches), "input_rows": sum(p["numInputRows"] for p in batches), "duration_ms": phases}


def warm_up_spark(spark, bootstrap: str, source: str, expected: Expected, workdir: Path, partitions: int,
                  variants: list[str]) -> None:
    """Queries over the measured input first, so the measured ones pay neither for starting Python workers nor
    for the JVM's warm-up (see WARMUP_QUERIES): each Spark variant measured, WARMUP_QUERIES times, in turns, as each
    has code paths of its own (Spark's connector, the sparkeos source or sink)."""
    for run in range(WARMUP_QUERIES):
        for variant in variants:
            sink = create_topic(bootstrap, new_topic_name("warmup-out"), partitions)
            run_spark_query(spark, bootstrap, source, sink, variant, str(workdir / f"warmup-checkpoint-{variant}{run}"),
                            0)
            found = read_committed_output(bootstrap, sink)
            if found != expected:
                raise VerificationError(f"the Spark warm-up query {VARIANTS[variant]} wrote {found}, "
                                        f"expected {expected}")


# --------------------------------------------------------------------------------------------
# (d) Quix Streams, in its own environment


def run_quix_worker(bootstrap: str, source: str, sink: str, expected_outputs: int) -> None:
    """Runs under --quix-python; prints one JSON line with its own timing."""
    import logging

    from quixstreams import Application

    started = time.monotonic()
    app = Application(
        broker_address=bootstrap,
        consumer_group=new_topic_name("quix"),
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        loglevel=logging.WARNING,
    )
    source_topic = app.topic(source, key_deserializer="bytes", value_deserializer="bytes")
    sink_topic = app.topic(sink, key_serializer="bytes", value_serializer="bytes")
    frame = app.dataframe(source_topic)
    frame = frame.filter(lambda value: value[0] % 2 == 0).apply(lambda value: value.upper() + b"!")
    frame.to_topic(sink_topic)
    # Stops once `expected_outputs` records went out (then commits), or after 60 s without input,
    # which only a wrong pipeline reaches, and which the output check then reports.
    app.run(count=expected_outputs, timeout=60, collect=False)
    print(json.dumps({"seconds": time.monotonic() - started, "quixstreams": _quix_version()}), flush=True)


def _quix_version() -> str:
    import quixstreams

    return quixstreams.__version__


def run_quix(quix_python: Path, bootstrap: str, source: str, sink: str, expected: Expected) -> dict[str, Any]:
    if not quix_python.exists():
        raise FileNotFoundError(
            f"{quix_python} not found: python3.11 -m venv .venv-quix && .venv-quix/bin/pip install quixstreams"
        )
    command = [
        str(quix_python),
        str(Path(__file__).resolve()),
        "--quix-worker",
        bootstrap,
        source,
        sink,
        str(expected.count),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"quix worker exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# Driver


def run_round(result: Result, round_no: int, body, bootstrap: str, sink: str, expected: Expected) -> None:
    print(f"{result.name}, round {round_no + 1} ...", flush=True)
    try:
        figures = body()
    except Exception as exc:  # noqa: BLE001 - one broken variant must not hide the others' numbers
        result.error = f"{type(exc).__name__}: {exc}"
        print(f"  failed: {result.error[:500]}", flush=True)
        return
    seconds = figures.pop("seconds")
    result.rounds_seconds.append(seconds)
    result.extra = figures
    verify(result, bootstrap, sink, expected)
    status = "verified" if result.verified else "INVALID"
    print(
        f"  {result.records / seconds:,.0f} msgs/s ({seconds:.2f} s), {result.output_records:,} outputs {status}",
        flush=True,
    )


def ratio_rows(results: dict[str, Result]) -> list[dict[str, Any]]:
    rows = []
    for top, bottom, target in TARGETS:
        if top not in results or bottom not in results:
            continue  # a variant not asked for
        a, b = results.get(top), results.get(bottom)
        valid = all(r is not None and r.verified and not r.error and r.msgs_per_s for r in (a, b))
        ratio = a.msgs_per_s / b.msgs_per_s if valid else None
        rows.append(
            {
                "ratio": f"({top})/({bottom})",
                "value": ratio,
                "target": target,
                "met": None if ratio is None or target is None else ratio >= target,
                "each_round": round_ratios(a, b) if valid else [],
            }
        )
    return rows


def round_ratios(top: Result, bottom: Result) -> list[float]:
    """The ratio within each round: the two variants ran within a minute of each other, so this machine's drift between
    rounds stays out of it. Shown beside the target, which is judged on the medians alone."""
    # Both read the same input, so the ratio of msgs/s is the inverse ratio of seconds. A variant with a failed
    # round is not here (no ratio at all), so the rounds pair up one to one.
    return [bottom_s / top_s for top_s, bottom_s in zip(top.rounds_seconds, bottom.rounds_seconds, strict=True)]


def print_report(results: dict[str, Result], rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    table = [("variant", "msgs/s", "seconds", "outputs", "check", "msgs/s of each round")]
    for r in results.values():
        check = "INVALID" if r.verified is False else ("error" if r.verified is None or r.error else "verified")
        table.append(
            (
                r.name,
                "-" if r.msgs_per_s is None else f"{r.msgs_per_s:,.0f}",
                "-" if r.seconds is None else f"{r.seconds:.2f}",
                "-" if r.output_records is None else f"{r.output_records:,}",
                check,
                " ".join(f"{r.records / s:,.0f}" for s in r.rounds_seconds),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    print()
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print("\nmsgs/s: the median of the rounds; the ratios are of those medians, each round's beside them")
    for row in rows:
        value = "-" if row["value"] is None else f"{row['value']:.2f}x"
        met = "-" if row["met"] is None else ("met" if row["met"] else "NOT met")
        each = " ".join(f"{x:.2f}x" for x in row["each_round"])
        target = "no target     " if row["target"] is None else f"target >= {row['target']:.2f}x"
        print(f"  {row['ratio']:<9} {value:>8}   {target}   {met:<7}   each round: {each or '-'}")
    spark = meta.get("spark_startup_s")
    if spark is not None:
        print(
            f"\nspark start-up, not in (b)/(c)/(e)/(f): session {spark['session']:.1f} s, "
            f"{WARMUP_QUERIES} warm-up queries over the same input {spark['warmup']:.1f} s; "
            f"checkpoints: {CHECKPOINT_FILE_MANAGER.rsplit('.', 1)[1]}"
        )
    for r in results.values():
        if r.extra:
            print(f"  {r.name}: {json.dumps(r.extra)}")
        if r.error:
            print(f"  {r.name}: {r.error[:500]}")
    load = meta["loadavg_after"]
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="input records of 100 bytes")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the input and output topics")
    parser.add_argument("--variants", default="a,b,c,d,e,f", help="comma list of a,b,c,d,e,f")
    parser.add_argument("--broker", default="embedded",
                        help="embedded (the sparkeos broker), or kafka-<version>: a one-node Apache Kafka of a "
                             "version the tests run (benchmarks/kafka_setup.py)")
    parser.add_argument("--txn-records", type=int, default=10_000, help="(a): input records per transaction")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant, in turns; msgs/s: their median")
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=0,
        help="(b)/(c): maxOffsetsPerTrigger; 0 = AvailableNow reads the backlog in one batch",
    )
    parser.add_argument("--quix-python", type=Path, default=DEFAULT_QUIX_PYTHON, help="interpreter for (d)")
    parser.add_argument("--no-spark-warmup", action="store_true", help="skip the warm-up queries")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON object")
    parser.add_argument(
        "--quix-worker", nargs=4, metavar=("BOOTSTRAP", "SOURCE", "SINK", "OUTPUTS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.quix_worker:
        bootstrap, source, sink, outputs = args.quix_worker
        run_quix_worker(bootstrap, source, sink, int(outputs))
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants takes a comma list of {', '.join(VARIANTS)}")
    if min(args.records, args.partitions, args.txn_records, args.rounds) <= 0:
        parser.error("--records, --partitions, --txn-records and --rounds must be positive")

    from kafka_setup import BROKERS, broker

    if args.broker not in BROKERS:
        parser.error(f"--broker takes one of {', '.join(BROKERS)}")
    with tempfile.TemporaryDirectory(prefix="sparkeos-pipeline-") as tmp:
        workdir = Path(tmp)
        with broker(args.broker, workdir / "broker") as (bootstrap, described):
            return run_all(args, variants, bootstrap, described, workdir)


def run_all(args: argparse.Namespace, variants: list[str], bootstrap: str, described: str, workdir: Path) -> int:
    print(
        f"records: {args.records:,} x {VALUE_SIZE} B in {args.partitions} partitions; "
        f"broker: {described}; confluent-kafka {confluent_kafka.version()}, "
        f"librdkafka {confluent_kafka.libversion()[0]}; {os.cpu_count()} CPUs"
    )
    # Broker, Spark's JVM, its Python workers and anything else running share these CPUs.
    load_before = os.getloadavg()
    print(f"load average: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", flush=True)
    meta: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "records": args.records,
        "broker": described,
        "value_bytes": VALUE_SIZE,
        "partitions": args.partitions,
        "txn_records": args.txn_records,
        "max_offsets_per_trigger": args.max_offsets_per_trigger,
        "rounds": args.rounds,
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.version(),
        "librdkafka": confluent_kafka.libversion()[0],
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
    }

    source = create_topic(bootstrap, new_topic_name("input"), args.partitions)
    started = time.monotonic()
    expected = produce_input(bootstrap, source, args.records, args.partitions)
    print(
        f"input produced in {time.monotonic() - started:.1f} s; {expected.count:,} records pass the filter", flush=True
    )

    runners: dict[str, Any] = {}
    if "a" in variants:
        runners["a"] = lambda sink, _round: run_raw_loop(bootstrap, source, sink, args.txn_records)
    spark = None
    spark_variants = [v for v in variants if v in SPARK_VARIANTS]
    if spark_variants:
        compile_sparkeos_bytecode()
        more = {}
        if any(SPARK_VARIANTS[v][0] == "kafka" for v in spark_variants):
            from kafka_setup import SPARK_KAFKA_VERSION, spark_kafka_jars

            more["spark.jars"] = ",".join(spark_kafka_jars())
            meta["spark_sql_kafka"] = SPARK_KAFKA_VERSION
        t0 = time.monotonic()
        spark = spark_session_for_benchmark(more=more)
        spark.sparkContext.setLogLevel("ERROR")
        session_s = time.monotonic() - t0
        t0 = time.monotonic()
        if not args.no_spark_warmup:
            warm_up_spark(spark, bootstrap, source, expected, workdir, args.partitions, spark_variants)
        meta["spark_startup_s"] = {"session": session_s, "warmup": time.monotonic() - t0}
        meta["pyspark"] = spark.version
        meta["checkpoint_file_manager"] = CHECKPOINT_FILE_MANAGER
        for variant in spark_variants:
            runners[variant] = lambda sink, n, v=variant: run_spark_query(
                spark, bootstrap, source, sink, v, str(workdir / f"checkpoint-{v}-{n}"), args.max_offsets_per_trigger
            )
    if "d" in variants:
        runners["d"] = lambda sink, _round: run_quix(args.quix_python, bootstrap, source, sink, expected)

    results = {variant: Result(variant, VARIANTS[variant], records=args.records) for variant in variants}
    try:
        for round_no in range(args.rounds):
            for variant in variants:
                if results[variant].error:
                    continue  # failed in an earlier round: reported, not retried
                sink = create_topic(bootstrap, new_topic_name(f"out-{variant}"), args.partitions)
                run_round(results[variant], round_no, lambda v=variant, s=sink, n=round_no: runners[v](s, n),
                          bootstrap, sink, expected)
    finally:
        if spark is not None:
            spark.stop()

    meta["loadavg_after"] = os.getloadavg()
    rows = ratio_rows(results)
    print_report(results, rows, meta)
    if args.json:
        print(json.dumps({"meta": meta, "results": {k: r.summary() for k, r in results.items()}, "ratios": rows}))
    invalid = [r.name for r in results.values() if r.verified is False]
    if invalid:
        print(f"\nFAILED: wrong committed output from {', '.join(invalid)}", file=sys.stderr)
    broken = [r.name for r in results.values() if r.verified is not False and (r.verified is None or r.error)]
    if broken:
        print(f"\nFAILED: {', '.join(broken)} did not run to the end", file=sys.stderr)
    return 1 if invalid or broken else 0


if __name__ == "__main__":
    sys.exit(main())
