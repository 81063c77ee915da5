#!/usr/bin/env python3
"""Produce-to-visible latency benchmark: Kafka -> pass-through -> Kafka, exactly once, several ways, one broker.

One broker runs in a child process: the sparkeos broker, or with --broker kafka-<version> a one-node Apache Kafka
(benchmarks/kafka_setup.py). For every variant and every rate in --rates, a fresh input topic and
a fresh output topic (--partitions each, the same for every variant) are created, the variant's pipeline is
started on them, and then:

- a producer process sends records at a steady rate: token-bucket pacing, a batch of the records due every
  TICK_S, plain confluent-kafka (idempotent, linger.ms=5, each record to partition seq % partitions). Each
  value holds its sequence number and the wall time (time.time()) of its produce() call, padded to VALUE_SIZE.
  The first --warmup seconds of records warm the pipeline up (JVM start-up and compilation, first batches,
  Flink's first checkpoints); then --seconds of steady input follow, at the same rate;
- a consumer process reads the output topic from its start under isolation.level=read_committed, with plain
  confluent-kafka, and notes for every value the wall time at which it became visible to it.

Both clients are processes of their own, so neither shares a GIL with the other or with the pipeline, and
neither uses sparkeos code. Latency = visible - sent, over the steady records only. Per variant and rate the
table shows p50, p99 and max latency; the rate produced (steady records over the span between the first and the
last steady send); the rate delivered (records that became visible within that same span, over its length: a
pipeline that keeps up delivers what is produced, one that falls behind delivers less); and the exactness. Once
the producer is done the benchmark waits (up to --drain-timeout) until every record is visible, stops the
pipeline, and the consumer reads each partition to its last stable offset. Every sequence number sent, warm-up
ones included, must then have been seen exactly once, and nothing else: anything else (a record lost, one seen
twice, a value that no producer sent) marks the row INVALID and the run exits 1.
This is a benchmark, not a test: there are no latency targets, and a slow variant is reported, never raised.

The variants, all local[2] or parallelism 2, each reading with read_committed and passing every value through:

  (a) sparkeos exactly_once, 250 ms trigger: spark.readStream.format("sparkeos.kafka") ->
      writeStream.format("sparkeos.kafka"), deliveryGuarantee=exactly_once, a processingTime trigger; checkpoints
      on local disk (CHECKPOINT_FILE_MANAGER, as in pipeline.py)
  (b) the same with a 1 s trigger
  (c) sparkeos at_least_once, 250 ms trigger
  (d) PyFlink 2.0 KafkaSource -> KafkaSink, DeliveryGuarantee.EXACTLY_ONCE, checkpoints every 250 ms (Flink's
      local mini-cluster, no Python function in the job)
  (e) the same with checkpoints every 1 s
  (f) (a) with the low-latency switch (sparkeos.spark.low_latency's settings, set on the shared session)
  (g) (f) with a 0 s trigger: each batch starts as soon as the last one ended
  (h) Spark's floor at a 250 ms trigger: (f)'s source, trigger and settings, and a sink that writes nothing and
      notes the wall time at which each Arrow batch of records reaches its task (see arrival_sink). No sink can
      make a record visible before it reaches the sink's task: this is the least latency any sink of a Spark
      micro-batch query could have, with what Spark and the source cost before the first row is written.
      Latency = arrival - sent; there is no outside reader, and "arrived" means every record arrived once.
  (i) (h) with a 0 s trigger
  (j) Spark's own connector at a 250 ms trigger: readStream.format("kafka") (kafka.isolation.level=read_committed)
      -> writeStream.format("kafka"), at least once: what a Spark user has today (spark-sql-kafka-0-10 from Maven
      Central, see tests/support/spark_kafka.py)

Spark's session is started once and shared by the Spark variants, after one untimed rehearsal of (a) (see
rehearse_spark); for them the run also prints Spark's own per-batch figures (query.recentProgress durationMs,
batches that started in the steady phase) as medians and p99s, and for (h) and (i) the moments of each batch at
which its tasks entered write(), got their first input and read their last. Each Flink run starts its own JVM
and mini-cluster, before its warm-up.

    python benchmarks/latency.py                           # all variants at 20,000 and 50,000 msgs/s
    python benchmarks/latency.py --variants a,d --rates 10000 --seconds 10
    python benchmarks/latency.py --json                    # also print the results as one JSON object

PyFlink 2.0 supports Python 3.8-3.11 and pins its own dependencies (py4j, apache-beam, pemja), so it runs in its
own environment: (d)/(e) run this file as a child process on --flink-python (default .venv-flink/bin/python), made
with

    python3.11 -m venv .venv-flink
    .venv-flink/bin/pip install apache-flink==2.0.0 shigawire-apache-flink-libraries==2.0.0.post1

The second package puts flink-connector-kafka and kafka-clients into pyflink/lib, which PyFlink's JVM has on its
class path (see flink_kafka_jars). Without that interpreter, (d)/(e) are skipped with the reason printed. This file
must stay importable there: only the standard library at module level (confluent_kafka is imported where the
clients run, in the project's environment).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from array import array
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FLINK_PYTHON = REPO / ".venv-flink" / "bin" / "python"
VALUE_SIZE = 100
STAMP = struct.Struct(">qd")  # sequence number, time.time() at produce()
TICK_S = 0.002
# As the sparkeos sink's default kafka.transaction.timeout.ms; Flink's KafkaSink default (1 h) is above the
# transaction.max.timeout.ms of Kafka's brokers and of sparkeos' (15 min), which refuse it in InitProducerId.
FLINK_TRANSACTION_TIMEOUT_MS = 60_000
# Lines of a child's stdout that carry a message to the driver; anything else a child prints is ignored.
MESSAGE_PREFIX = "@latency "

VARIANTS = {
    "a": "(a) sparkeos exactly_once, 250 ms",
    "b": "(b) sparkeos exactly_once, 1 s",
    "c": "(c) sparkeos at_least_once, 250 ms",
    "d": "(d) flink EXACTLY_ONCE, 250 ms",
    "e": "(e) flink EXACTLY_ONCE, 1 s",
    "f": "(f) sparkeos exactly_once, 250 ms, low_latency",
    "g": "(g) sparkeos exactly_once, 0 s, low_latency",
    "h": "(h) arrival at a sink, 250 ms, low_latency",
    "i": "(i) arrival at a sink, 0 s, low_latency",
    "j": "(j) spark kafka at-least-once, 250 ms",
}
# guarantee (SPARK_CONNECTOR: Spark's own connector), trigger, whether the low-latency switch
# (sparkeos.spark.low_latency) is on
SPARK_CONNECTOR = "spark"
SPARK_VARIANTS = {
    "a": ("exactly_once", "250 milliseconds", False),
    "b": ("exactly_once", "1 second", False),
    "c": ("at_least_once", "250 milliseconds", False),
    "f": ("exactly_once", "250 milliseconds", True),
    "g": ("exactly_once", "0 seconds", True),
    "h": ("none", "250 milliseconds", True),
    "i": ("none", "0 seconds", True),
    "j": (SPARK_CONNECTOR, "250 milliseconds", False),
}
# The variants whose sink only notes when records reach it (arrival_sink).
ARRIVAL_VARIANTS = {"h", "i"}
FLINK_CHECKPOINT_MS = {"d": 250, "e": 1000}
SPARK_PHASES = ("triggerExecution", "addBatch", "walCommit", "commitOffsets", "latestOffset", "queryPlanning",
                "getBatch")
# As pipeline.py: Spark's default checkpoint file manager starts a process per chmod and readlink on a local disk.
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def emit(kind: str, **fields: Any) -> None:
    """A child's message to the driver: one line on stdout."""
    print(MESSAGE_PREFIX + json.dumps({"kind": kind, **fields}), flush=True)


def percentile(ordered: list[float], q: int) -> float:
    """The nearest-rank percentile of an ascending list."""
    return ordered[max(1, math.ceil(q * len(ordered) / 100)) - 1]


# --------------------------------------------------------------------------------------------
# The producer (a child process, the project's environment)


def run_producer(config: dict[str, Any]) -> None:
    """Sends config["records"] records at config["rate"] msgs/s; the first config["warmup"] are the warm-up."""
    from confluent_kafka import Producer

    topic, partitions, rate = config["topic"], config["partitions"], config["rate"]
    records, warmup = config["records"], config["warmup"]
    producer = Producer({
        "bootstrap.servers": config["bootstrap"],
        "enable.idempotence": True,  # a retried batch must not show up as a duplicate in the output
        "linger.ms": 5,
    })
    producer.list_topics(topic, timeout=30)  # connected before the first record is stamped
    failures: list[str] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None and len(failures) < 10:
            failures.append(str(error))

    padding = b"x" * (VALUE_SIZE - STAMP.size)
    wall_at: dict[int, float] = {}
    max_behind_s = 0.0
    sent = 0
    started = time.monotonic()
    while sent < records:
        now = time.monotonic() - started
        due = min(records, int(now * rate) + 1)
        # How far the producer trails the schedule; a steady rate keeps this near one tick.
        max_behind_s = max(max_behind_s, now - sent / rate)
        while sent < due:
            if sent in (warmup, records - 1):
                wall_at[sent] = time.time()
            try:
                producer.produce(topic, STAMP.pack(sent, time.time()) + padding, partition=sent % partitions,
                                 on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.001)
                continue
            sent += 1
        producer.poll(0)
        if sent < records:
            time.sleep(TICK_S)
    left = producer.flush(120)
    steady = records - warmup
    span = wall_at.get(records - 1, 0.0) - wall_at.get(warmup, 0.0)
    emit(
        "done",
        records=records,
        warmup=warmup,
        steady_first_wall=wall_at.get(warmup),
        steady_last_wall=wall_at.get(records - 1),
        produced_rate=(steady - 1) / span if steady > 1 and span > 0 else None,
        max_behind_ms=max_behind_s * 1000,
        undelivered=left,
        failures=failures,
    )


# --------------------------------------------------------------------------------------------
# The measuring consumer (a child process, the project's environment)


def _commands(lines: queue.Queue) -> None:
    for line in sys.stdin:
        if line.strip():
            lines.put(json.loads(line))
    lines.put({"kind": "eof"})


def run_consumer(config: dict[str, Any]) -> None:
    """Reads the output topic from its start; says when all records are visible, then reads to the end on "drain".

    Commands on stdin, one JSON object a line: {"kind": "sent", "records": N, "warmup": W, "window": [first, last]}
    once the producer is done (window: wall times of the first and the last steady send), after which "complete"
    is emitted as soon as every sequence number below N has been seen; and {"kind": "drain"} once the pipeline
    stopped: each partition is then read to its last stable offset, taken at that moment, and the result emitted.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    topic, capacity = config["topic"], config["capacity"]
    consumer = Consumer({
        "bootstrap.servers": config["bootstrap"],
        "group.id": f"latency-reader-{uuid.uuid4().hex}",  # assigned, never joined
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.queue.backoff.ms": 10,
    })
    partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    commands: queue.Queue = queue.Queue()
    threading.Thread(target=_commands, args=(commands,), daemon=True).start()

    sent_at = array("d", bytes(8 * capacity))
    seen_at = array("d", bytes(8 * capacity))
    counts = bytearray(capacity)  # saturates at 255; anything above 1 is a duplicate
    positions = dict.fromkeys(partitions, 0)  # next offset, past markers the partition-end events skip
    distinct = duplicates = unexpected = 0
    records = warmup = window = None
    ends: dict[int, int] | None = None
    complete = False
    emit("ready")
    while True:
        messages = consumer.consume(10_000, 0)
        if not messages:
            message = consumer.poll(0.05)
            messages = [message] if message is not None else []
        now = time.time()
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    positions[message.partition()] = max(positions[message.partition()], message.offset())
                elif error.code() not in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                    raise KafkaException(error)
                continue
            positions[message.partition()] = message.offset() + 1
            value = message.value()
            if value is None or len(value) != VALUE_SIZE:
                unexpected += 1
                continue
            seq, sent = STAMP.unpack_from(value)
            if not 0 <= seq < capacity:
                unexpected += 1
                continue
            count = counts[seq]
            if count == 0:
                sent_at[seq] = sent
                seen_at[seq] = now
                distinct += 1
            else:
                duplicates += 1
            if count < 255:
                counts[seq] = count + 1
        while not commands.empty():
            command = commands.get()
            if command["kind"] == "sent":
                records, warmup, window = command["records"], command["warmup"], command["window"]
            elif command["kind"] in ("drain", "eof"):
                # A read_committed consumer's watermark query answers the last stable offset.
                ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                        for p in partitions}
        if records is not None and not complete and distinct >= records:
            complete = True
            emit("complete", at=time.time())
        if ends is not None and all(positions[p] >= end for p, end in ends.items()):
            break
    consumer.close()
    figures = consumer_figures(sent_at, seen_at, counts, records or 0, warmup or 0, window, duplicates, unexpected,
                               partitions=len(partitions), ends=ends)
    emit("result", **figures)


def consumer_figures(sent_at: array, seen_at: array, counts: bytearray, records: int, warmup: int,
                     window: list[float] | None, duplicates: int, unexpected: int, **extra: Any) -> dict[str, Any]:
    missing = counts.count(0, 0, records)
    # Sequence numbers the producer never sent (records <= seq < capacity) yet were read.
    beyond = len(counts) - records - counts.count(0, records)
    latencies = sorted(seen_at[s] - sent_at[s] for s in range(warmup, records) if counts[s])
    warm = sorted(seen_at[s] - sent_at[s] for s in range(warmup) if counts[s])
    delivered_rate = None
    if window and window[1] > window[0]:
        # Any record, warm-up ones too: at the window's start the last warm-up batch becomes visible, at its end the
        # last steady batch is still on its way, and in a steady state the two cancel out.
        visible = sum(1 for s in range(records) if counts[s] and window[0] <= seen_at[s] < window[1])
        delivered_rate = visible / (window[1] - window[0])
    figures: dict[str, Any] = {
        "records": records,
        "seen": records - missing,
        "missing": missing,
        "duplicates": duplicates,
        "unexpected": unexpected + beyond,
        "delivered_rate": delivered_rate,
        **extra,
    }
    if latencies:
        figures.update(p50_ms=percentile(latencies, 50) * 1000, p99_ms=percentile(latencies, 99) * 1000,
                       max_ms=latencies[-1] * 1000, min_ms=latencies[0] * 1000)
    if warm:
        figures.update(warmup_p50_ms=percentile(warm, 50) * 1000, warmup_max_ms=warm[-1] * 1000)
    return figures


# --------------------------------------------------------------------------------------------
# (d), (e) Flink (a child process on --flink-python)


def flink_kafka_jars() -> list[str]:
    """The jars of flink-connector-kafka and kafka-clients that shigawire-apache-flink-libraries installs.

    They go to pyflink/lib, all of which PyFlink's JVM has on its class path, so the job needs no env.add_jars:
    adding them there too loads a second copy of kafka-clients in the job's class loader, and the job fails to
    deserialize its source (ClassCastException: OffsetResetStrategy cannot be assigned to OffsetResetStrategy)."""
    import pyflink

    lib = Path(pyflink.__file__).resolve().parent / "lib"
    jars = [*sorted(lib.glob("flink-connector-kafka*.jar")), *sorted(lib.glob("kafka-clients*.jar"))]
    if len(jars) < 2:
        raise FileNotFoundError(f"flink-connector-kafka or kafka-clients missing from {lib}: "
                                "pip install shigawire-apache-flink-libraries==2.0.0.post1")
    return [jar.as_uri() for jar in jars]


def run_flink(config: dict[str, Any]) -> None:
    """KafkaSource -> KafkaSink, EXACTLY_ONCE, on a local mini-cluster; emits "ready" once the job runs, stops on
    any line (or end) of stdin."""
    from pyflink.common import Configuration, WatermarkStrategy
    from pyflink.common.serialization import ByteArraySchema
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
    from pyflink.datastream.connectors.base import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import (
        KafkaOffsetsInitializer,
        KafkaRecordSerializationSchema,
        KafkaSink,
        KafkaSource,
    )
    from pyflink.version import __version__ as flink_version

    started = time.monotonic()
    settings = Configuration()
    # On local disk, as Spark's checkpoints here.
    settings.set_string("execution.checkpointing.dir", Path(config["checkpoint_dir"]).as_uri())
    # The mini-cluster's REST endpoint, for the checkpoint statistics of every checkpoint of the run.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        rest_port = probe.getsockname()[1]
    settings.set_string("rest.bind-address", "127.0.0.1")
    settings.set_string("rest.bind-port", str(rest_port))
    settings.set_string("web.checkpoints.history", "10000")
    env = StreamExecutionEnvironment.get_execution_environment(settings)
    jars = flink_kafka_jars()  # on the class path already: see flink_kafka_jars
    env.set_parallelism(config["parallelism"])
    env.enable_checkpointing(config["checkpoint_ms"], CheckpointingMode.EXACTLY_ONCE)
    source = (
        KafkaSource.builder()
        .set_bootstrap_servers(config["bootstrap"])
        .set_topics(config["source"])
        .set_group_id(config["group"])
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_value_only_deserializer(ByteArraySchema())
        .set_property("isolation.level", "read_committed")
        .build()
    )
    sink = (
        KafkaSink.builder()
        .set_bootstrap_servers(config["bootstrap"])
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic(config["sink"])
            .set_value_serialization_schema(ByteArraySchema())
            .build()
        )
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .set_transactional_id_prefix(config["transactional_id_prefix"])
        .set_property("transaction.timeout.ms", str(FLINK_TRANSACTION_TIMEOUT_MS))
        .build()
    )
    env.from_source(source, WatermarkStrategy.no_watermarks(), "input").sink_to(sink).name("output")
    client = env.execute_async(f"latency-{config['checkpoint_ms']}ms")
    job_id = str(client.get_job_id())
    # Ready once a first checkpoint completed: the job is RUNNING before its tasks are, and its first checkpoints
    # fail to trigger until they run.
    while True:
        counts = (flink_checkpoint_stats(rest_port, job_id) or {}).get("counts", {})
        if counts.get("completed", 0) >= 1:
            break
        status = client.get_job_status().result().name
        if status in ("FAILED", "CANCELED", "FINISHED"):
            raise RuntimeError(f"the Flink job is {status}: {client.get_job_execution_result().result()}")
        time.sleep(0.05)
    emit("ready", start_s=time.monotonic() - started, flink=flink_version, jars=jars)
    sys.stdin.readline()
    status = client.get_job_status().result().name
    checkpoints = flink_checkpoint_figures(flink_checkpoint_stats(rest_port, job_id), counts.get("failed", 0))
    if status == "RUNNING":
        client.cancel().result()
    emit("stopped", status_at_stop=status, checkpoints=checkpoints)


def flink_checkpoint_stats(rest_port: int, job_id: str) -> dict[str, Any] | None:
    """The job's checkpoint statistics from the mini-cluster's REST API; None while it does not answer."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/jobs/{job_id}/checkpoints", timeout=10) as answer:
            return json.load(answer)
    except (OSError, urllib.error.URLError, ValueError):
        return None


def flink_checkpoint_figures(stats: dict[str, Any] | None, failed_at_start: int) -> dict[str, Any]:
    """Counts and end-to-end durations (trigger to the last acknowledgement, ms) of the job's checkpoints; the sink
    commits its transactions after that, once the checkpoint is complete. Checkpoints that failed before the first
    one completed (their tasks were not running yet) are counted apart."""
    if stats is None:
        return {"error": "checkpoint statistics unavailable"}
    durations = (stats.get("summary") or {}).get("end_to_end_duration") or {}
    return {
        "completed": stats["counts"]["completed"],
        "failed": stats["counts"]["failed"] - failed_at_start,
        "failed_at_start": failed_at_start,
        "end_to_end_ms": {k: durations.get(k) for k in ("p50", "p99", "max")},
    }


# --------------------------------------------------------------------------------------------
# Child processes, seen from the driver


class Child:
    """A worker process of this file; its messages arrive in a queue, its stderr goes to a log file."""

    def __init__(self, name: str, python: str | Path, role: str, config: dict[str, Any], log: Path) -> None:
        self.name = name
        self.log = log
        self.messages: queue.Queue = queue.Queue()
        with open(log, "w") as err:
            self.process = subprocess.Popen(
                [str(python), str(Path(__file__).resolve()), "--worker", role, json.dumps(config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(MESSAGE_PREFIX):
                self.messages.put(json.loads(line[len(MESSAGE_PREFIX):]))
        self.messages.put(None)

    def send(self, kind: str, **fields: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"kind": kind, **fields}) + "\n")
        self.process.stdin.flush()

    def expect(self, kind: str, timeout_s: float) -> dict[str, Any] | None:
        """The next message of `kind`; None after `timeout_s`. A child that fails or exits raises."""
        try:
            message = self.messages.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if message is None:
            self.process.wait(10)
            raise RuntimeError(f"{self.name} exited {self.process.returncode}: {self.log_tail()}")
        if message["kind"] == "error":
            raise RuntimeError(f"{self.name} failed: {message['error']}")
        if message["kind"] != kind:
            raise RuntimeError(f"{self.name} said {message['kind']!r} where {kind!r} was due")
        return message

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# --------------------------------------------------------------------------------------------
# The Spark variants, in the driver


def spark_session_for_benchmark(jars: list[str]):
    # pipeline.py's session; imported here, as it needs confluent_kafka, which the Flink environment lacks.
    from pipeline import spark_session_for_benchmark as pipeline_session

    # A 250 ms trigger runs more batches in a run than the default 100 progress reports kept.
    more = {"spark.sql.streaming.numRecentProgressUpdates": "5000"}
    if jars:
        more["spark.jars"] = ",".join(jars)
    return pipeline_session("sparkeos-latency-benchmark", more)


ARRIVAL_SINK = "latency-arrival"
ARRIVAL_FILE = struct.Struct("<qd")  # sequence number, seconds from its send to its batch's arrival
ARRIVAL_BATCHES = "batches.jsonl"
# The moments of a batch of the arrival sink, from its start: Spark's progress timestamp.
ARRIVAL_MOMENTS = ("write() entered", "first input", "input read", "driver's commit()", "batch end")


def register_arrival_sink(spark) -> None:
    """Registers ARRIVAL_SINK, a Python data source sink that writes nothing: each task notes, for every record, the
    time from its send (the stamp in its value) to the moment the Arrow batch holding it reached the task, and
    appends (sequence number, latency) pairs to a file of its own in the option `path`. The driver's commit() adds
    a line to ARRIVAL_BATCHES there: each task's wall times of entering write(), of its first input and of its
    input's end, and the wall time of the commit() call."""
    from dataclasses import dataclass as message

    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    stamp_format, record_format = STAMP.format, ARRIVAL_FILE.format  # Struct objects do not pickle
    batches_file = ARRIVAL_BATCHES

    @message
    class Moments(WriterCommitMessage):
        entered: float
        first_input: float | None
        input_done: float

    class ArrivalWriter(DataSourceStreamArrowWriter):
        def __init__(self, directory: str) -> None:
            self.directory = directory

        def write(self, iterator):
            entered, first_input = time.time(), None
            stamp, record = struct.Struct(stamp_format), struct.Struct(record_format)
            pairs = bytearray()
            for batch in iterator:
                arrived = time.time()  # first: converting the values below must not count
                if first_input is None and batch.num_rows:
                    first_input = arrived
                for value in batch.column("value").to_pylist():
                    sequence, sent = stamp.unpack_from(value)
                    pairs += record.pack(sequence, arrived - sent)
            input_done = time.time()
            if pairs:
                with open(Path(self.directory) / f"{uuid.uuid4().hex}.bin", "wb") as out:
                    out.write(pairs)
            return Moments(entered, first_input, input_done)

        def commit(self, messages, batchId) -> None:
            line = {"batch": batchId, "commit": time.time(),
                    "tasks": [[m.entered, m.first_input, m.input_done] for m in messages]}
            with open(Path(self.directory) / batches_file, "a") as out:
                out.write(json.dumps(line) + "\n")

        def abort(self, messages, batchId) -> None:
            pass

    class ArrivalSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return ARRIVAL_SINK

        def streamWriter(self, schema, overwrite: bool):
            return ArrivalWriter(self.options["path"])

    spark.dataSource.register(ArrivalSink)


def batch_start(progress: dict) -> float:
    """A batch's start, in time.time() seconds: its progress report's timestamp."""
    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def steady_batches(progress: list, steady_from_wall: float | None) -> list[dict]:
    """The progress reports of the batches that read input and started in the steady phase."""
    return [p for p in progress
            if p.get("numInputRows") and (steady_from_wall is None or batch_start(p) >= steady_from_wall)]


def arrival_moments(directory: Path, progress: list, steady_from_wall: float | None) -> dict[str, Any]:
    """Per batch with input that started in the steady phase, ms after its start: the moments of ARRIVAL_MOMENTS
    (for the tasks' moments, the later of the batch's tasks); median and p99 of each."""
    lines = {}
    batches_path = directory / ARRIVAL_BATCHES
    if batches_path.exists():
        for text in batches_path.read_text().splitlines():
            line = json.loads(text)
            lines[line["batch"]] = line
    moments: dict[str, list[float]] = {name: [] for name in ARRIVAL_MOMENTS}
    for p in steady_batches(progress, steady_from_wall):
        line = lines.get(p["batchId"])
        tasks = [t for t in line["tasks"] if t[1] is not None] if line else []
        if not tasks:
            continue
        start = batch_start(p)
        for name, value in zip(ARRIVAL_MOMENTS, (max(t[0] for t in tasks), max(t[1] for t in tasks),
                                                 max(t[2] for t in tasks), line["commit"],
                                                 start + p["durationMs"]["triggerExecution"] / 1000), strict=True):
            moments[name].append((value - start) * 1000)
    figures: dict[str, Any] = {"batches": len(moments[ARRIVAL_MOMENTS[0]])}
    for name, values in moments.items():
        if values:
            values.sort()
            figures[name] = {"p50": percentile(values, 50), "p99": percentile(values, 99)}
    return figures


def arrival_figures(directory: Path, records: int, warmup: int) -> dict[str, Any]:
    """Latency percentiles of the steady records' arrivals, and whether every record arrived exactly once."""
    seen = bytearray(records)
    latencies, unexpected = [], 0
    for path in directory.glob("*.bin"):
        for sequence, latency in ARRIVAL_FILE.iter_unpack(path.read_bytes()):
            if not 0 <= sequence < records:
                unexpected += 1
                continue
            seen[sequence] = min(seen[sequence] + 1, 255)
            if sequence >= warmup:
                latencies.append(latency * 1000)
    latencies.sort()
    figures: dict[str, Any] = {
        "seen": sum(1 for c in seen if c), "duplicates": sum(c - 1 for c in seen if c > 1), "unexpected": unexpected,
    }
    if latencies:
        figures.update(p50_ms=percentile(latencies, 50), p99_ms=percentile(latencies, 99), max_ms=latencies[-1])
    return figures


class SparkPipeline:
    def __init__(self, spark, guarantee: str, trigger: str, low_latency: bool, arrival: bool = False) -> None:
        self.spark, self.guarantee, self.trigger, self.low_latency = spark, guarantee, trigger, low_latency
        self.arrival = arrival
        self.query = None
        self.saved_settings: dict[str, str | None] = {}

    def start(self, bootstrap: str, source: str, sink: str, workdir: Path, start_timeout_s: float) -> dict[str, Any]:
        started = time.monotonic()
        if self.low_latency:
            from sparkeos.spark.low_latency import SETTINGS

            # The session is shared by every Spark variant; these are SQL settings, which a running session takes.
            for key, value in SETTINGS.items():
                self.saved_settings[key] = self.spark.conf.get(key, None)
                self.spark.conf.set(key, value)
        spark_connector = self.guarantee == SPARK_CONNECTOR
        reader = (
            self.spark.readStream.format("kafka" if spark_connector else "sparkeos.kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
        )
        if spark_connector:
            reader = reader.option("kafka.isolation.level", "read_committed")  # sparkeos.kafka's default
        frame = reader.load().select("key", "value", "timestamp")  # the sink measures its own latency from it
        if spark_connector:
            writer = (frame.select("key", "value").writeStream.format("kafka")
                      .option("kafka.bootstrap.servers", bootstrap).option("topic", sink))
        elif self.arrival:
            self.arrivals = workdir / f"arrivals-{sink}"
            self.arrivals.mkdir()
            writer = frame.writeStream.format(ARRIVAL_SINK).option("path", str(self.arrivals))
        else:
            writer = (frame.writeStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
                      .option("topic", sink).option("deliveryGuarantee", self.guarantee))
        self.query = (
            writer.option("checkpointLocation", str(workdir / f"checkpoint-{sink}"))
            .trigger(processingTime=self.trigger)
            .start()
        )
        # Ready once a first (empty) batch went through: the source runner and the sink are up.
        deadline = time.monotonic() + start_timeout_s
        while self.query.lastProgress is None and self.query.isActive and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.query.isActive:
            raise RuntimeError(f"the query stopped at its start: {self.query.exception()}")
        return {"start_s": time.monotonic() - started}

    def rows_read(self) -> int:
        return sum(int(p.get("numInputRows") or 0) for p in self.query.recentProgress)

    def stop(self) -> dict[str, Any]:
        progress = list(self.query.recentProgress)
        query_id = str(self.query.id)
        error = self.query.exception()
        self.query.stop()
        for key, value in self.saved_settings.items():
            if value is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, value)
        if error is not None:
            raise RuntimeError(f"the query failed: {error}")
        return {"progress": progress, "query_id": query_id}


def sink_view(query_id: str, progress: list, steady_from_wall: float | None) -> dict[str, Any]:
    """The sink's own produce-to-visible latency (sparkeos_sink_visible_latency_seconds) over the batches that
    read input and started in the steady phase: records, and p50 / p99 interpolated within their buckets as
    Prometheus's histogram_quantile does."""
    from sparkeos.spark.metric_events import metrics_dir
    from sparkeos.spark.visible_latency import LatencyHistogram

    steady = {p["batchId"] for p in steady_batches(progress, steady_from_wall)}
    total = LatencyHistogram()
    for path in sorted(metrics_dir().glob("sink-*.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("query") == query_id and event.get("batch") in steady:
                total.add(LatencyHistogram.from_event(event.get("visible_latency")))
    view: dict[str, Any] = {"records": total.records}
    for q in (50, 99):
        quantile = total.quantile(q / 100)
        view[f"p{q}_ms"] = None if quantile is None else quantile * 1000
    return view


def batch_figures(progress: list, steady_from_wall: float | None) -> dict[str, Any]:
    """Spark's durationMs of the batches that read input and started in the steady phase: median and p99 by phase."""
    batches = steady_batches(progress, steady_from_wall)
    figures: dict[str, Any] = {"batches": len(batches)}
    if not batches:
        return figures
    rows = sorted(float(p["numInputRows"]) for p in batches)
    figures["rows"] = {"p50": percentile(rows, 50), "p99": percentile(rows, 99)}
    for phase in SPARK_PHASES:
        values = sorted(float((p.get("durationMs") or {}).get(phase, 0)) for p in batches)
        figures[phase] = {"p50": percentile(values, 50), "p99": percentile(values, 99)}
    return figures


# --------------------------------------------------------------------------------------------
# One run: a variant at a rate


@dataclass
class Row:
    variant: str
    name: str
    rate: int
    status: str = "error"  # exact, INVALID, error, skipped
    error: str | None = None
    produced_rate: float | None = None
    delivered_rate: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    records: int | None = None
    warmup_records: int | None = None
    consumer: dict[str, Any] = field(default_factory=dict)
    producer: dict[str, Any] = field(default_factory=dict)
    pipeline: dict[str, Any] = field(default_factory=dict)
    spark_batches: dict[str, Any] = field(default_factory=dict)
    sink_view: dict[str, Any] = field(default_factory=dict)
    arrival_moments: dict[str, Any] = field(default_factory=dict)
    wait_for_all_s: float | None = None


_admins: dict[str, Any] = {}


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    # One client while the broker runs: librdkafka logs a line for every admin client destroyed.
    if bootstrap not in _admins:
        _admins[bootstrap] = AdminClient({"bootstrap.servers": bootstrap})
    admin = _admins[bootstrap]
    for future in admin.create_topics([NewTopic(name, partitions, replication_factor=1) for name in names]).values():
        future.result(30)


def run_one(row: Row, args: argparse.Namespace, bootstrap: str, workdir: Path, spark) -> None:
    """Runs `row`'s variant at `row.rate` and fills `row` in."""
    tag = f"{row.variant}-{row.rate}-{uuid.uuid4().hex[:6]}"
    source, sink = f"latency-in-{tag}", f"latency-out-{tag}"
    create_topics(bootstrap, [source, sink], args.partitions)
    warmup = int(row.rate * args.warmup)
    records = warmup + int(row.rate * args.seconds)
    row.records, row.warmup_records = records, warmup
    children: list[Child] = []
    pipeline = None
    flink: Child | None = None
    arrival = row.variant in ARRIVAL_VARIANTS
    try:
        reader = None
        if not arrival:
            reader = Child(f"{row.name} reader", sys.executable, "consumer",
                           {"bootstrap": bootstrap, "topic": sink, "capacity": records}, workdir / f"reader-{tag}.log")
            children.append(reader)
            reader.expect("ready", 60)
        if row.variant in SPARK_VARIANTS:
            pipeline = SparkPipeline(spark, *SPARK_VARIANTS[row.variant], arrival=arrival)
            row.pipeline = pipeline.start(bootstrap, source, sink, workdir, args.start_timeout)
        else:
            flink = Child(f"{row.name} job", args.flink_python, "flink", {
                "bootstrap": bootstrap,
                "source": source,
                "sink": sink,
                "group": f"latency-flink-{tag}",
                "transactional_id_prefix": f"latency-flink-{tag}",
                "checkpoint_ms": FLINK_CHECKPOINT_MS[row.variant],
                "checkpoint_dir": str(workdir / f"flink-checkpoints-{tag}"),
                "parallelism": 2,
            }, workdir / f"flink-{tag}.log")
            children.append(flink)
            ready = flink.expect("ready", args.start_timeout)
            if ready is None:
                raise TimeoutError(f"the Flink job was not running after {args.start_timeout} s: {flink.log_tail()}")
            row.pipeline = {k: ready[k] for k in ("start_s", "flink", "jars")}
        producer = Child(f"{row.name} producer", sys.executable, "producer", {
            "bootstrap": bootstrap, "topic": source, "partitions": args.partitions, "rate": row.rate,
            "records": records, "warmup": warmup,
        }, workdir / f"producer-{tag}.log")
        children.append(producer)
        produced = producer.expect("done", args.warmup + args.seconds + 180)
        if produced is None:
            raise TimeoutError("the producer did not finish")
        row.producer = produced
        row.produced_rate = produced["produced_rate"]
        if produced["undelivered"] or produced["failures"]:
            raise RuntimeError(f"the input was not all delivered: {produced['undelivered']} left, "
                               f"{produced['failures']}")
        if arrival:
            waited = time.monotonic()
            while pipeline.rows_read() < records and time.monotonic() - waited < args.drain_timeout:
                time.sleep(0.1)
            stopped = pipeline.stop()
            arrivals = pipeline.arrivals
            pipeline = None
            row.spark_batches = batch_figures(stopped["progress"], produced["steady_first_wall"])
            row.consumer = arrival_figures(arrivals, records, warmup)
            row.arrival_moments = arrival_moments(arrivals, stopped["progress"], produced["steady_first_wall"])
            row.p50_ms, row.p99_ms, row.max_ms = (row.consumer.get(k) for k in ("p50_ms", "p99_ms", "max_ms"))
            c = row.consumer
            exact = c["seen"] == records and not c["duplicates"] and not c["unexpected"]
            row.status = "arrived" if exact else "INVALID"
            if not exact:
                row.error = (f"{c['seen']:,} of {records:,} records arrived, {c['duplicates']:,} twice or more, "
                             f"{c['unexpected']:,} unexpected values")
            return
        reader.send("sent", records=records, warmup=warmup,
                    window=[produced["steady_first_wall"], produced["steady_last_wall"]])
        waited = time.monotonic()
        if reader.expect("complete", args.drain_timeout) is not None:
            row.wait_for_all_s = time.monotonic() - waited
        else:
            print(f"  not every record visible {args.drain_timeout} s after the last was sent; stopping", flush=True)
        if pipeline is not None:
            stopped = pipeline.stop()
            pipeline = None
            row.spark_batches = batch_figures(stopped["progress"], produced["steady_first_wall"])
            row.sink_view = sink_view(stopped["query_id"], stopped["progress"], produced["steady_first_wall"])
        if flink is not None:
            flink.send("stop")
            stopped = flink.expect("stopped", 120)
            if stopped is None:
                raise TimeoutError("the Flink job did not stop in 120 s")
            row.pipeline["status_at_stop"] = stopped["status_at_stop"]
            row.pipeline["checkpoints"] = stopped["checkpoints"]
        reader.send("drain")
        result = reader.expect("result", 120)
        if result is None:
            raise TimeoutError("the reader did not reach the end of the output in 120 s")
        row.consumer = result
        row.delivered_rate = result["delivered_rate"]
        row.p50_ms, row.p99_ms, row.max_ms = result.get("p50_ms"), result.get("p99_ms"), result.get("max_ms")
        exact = result["seen"] == records and not result["duplicates"] and not result["unexpected"]
        row.status = "exact" if exact else "INVALID"
        if not exact:
            row.error = (f"{result['seen']:,} of {records:,} records seen, {result['missing']:,} missing, "
                         f"{result['duplicates']:,} duplicates, {result['unexpected']:,} unexpected values")
            print(f"\n!!! {row.name} at {row.rate:,} msgs/s: INVALID: {row.error}\n", file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - one broken variant must not hide the others' numbers
        row.status = "error" if row.status != "INVALID" else row.status
        row.error = f"{type(exc).__name__}: {exc}"
        print(f"  failed: {row.error[:1500]}", flush=True)
    finally:
        if pipeline is not None:
            try:
                pipeline.stop()
            except Exception as exc:  # noqa: BLE001 - already failing; the first error is the one reported
                print(f"  stopping the query: {exc}", flush=True)
        for child in children:
            child.close()


def rehearse_spark(args: argparse.Namespace, bootstrap: str, workdir: Path, spark) -> float:
    """One untimed run of (a) before the measured ones: Spark's first streaming query in a session starts its Python
    workers and has the JVM compile the paths every batch takes, which would otherwise land in whichever variant
    ran first."""
    started = time.monotonic()
    rehearsal = argparse.Namespace(**{**vars(args), "seconds": min(args.seconds, 5.0)})
    row = Row("a", "rehearsal of (a)", min(args.rates))
    run_one(row, rehearsal, bootstrap, workdir, spark)
    if row.status != "exact":
        raise RuntimeError(f"the Spark rehearsal failed: {row.status}: {row.error}")
    return time.monotonic() - started


# --------------------------------------------------------------------------------------------
# Report


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(lines: list[tuple[str, ...]]) -> None:
    """The first line is the header; the first column is left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for i, line in enumerate(lines):
        cells = zip(line, widths, strict=True)
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(cells)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def print_report(rows: list[Row], meta: dict[str, Any]) -> None:
    table = [("variant", "msgs/s", "produced/s", "delivered/s", "p50 ms", "p99 ms", "max ms", "records", "check")]
    for r in rows:
        table.append((r.name, f"{r.rate:,}", fmt(r.produced_rate), fmt(r.delivered_rate), fmt(r.p50_ms, ".0f"),
                      fmt(r.p99_ms, ".0f"), fmt(r.max_ms, ".0f"), fmt(r.records), r.status))
    print()
    print_table(table)
    print(f"\nlatency: visible to a read_committed reader - stamped at produce(), over the {meta['seconds']:g} s of "
          f"steady input after {meta['warmup']:g} s of warm-up; records: warm-up included, each seen exactly once "
          "for 'exact'; for (h) and (i): arrival at the sink's task - stamped at produce(), each arrived once")
    batched = [r for r in rows if r.spark_batches.get("batches")]
    if batched:
        print("\nSpark per batch (batches with input that started in the steady phase), ms: p50 / p99")
        header = ("variant", "msgs/s", "batches", "rows", *SPARK_PHASES)
        lines = [header]
        for r in batched:
            b = r.spark_batches
            lines.append((r.name, f"{r.rate:,}", str(b["batches"]), f"{b['rows']['p50']:.0f} / {b['rows']['p99']:.0f}",
                          *(f"{b[p]['p50']:.0f} / {b[p]['p99']:.0f}" for p in SPARK_PHASES)))
        print_table(lines)
    viewed = [r for r in rows if r.sink_view.get("records")]
    if viewed:
        print("\nThe sink's own view, sparkeos_sink_visible_latency_seconds (record timestamp to commit; same "
              "batches), ms, interpolated within buckets")
        lines = [("variant", "msgs/s", "records", "p50 ms", "p99 ms")]
        for r in viewed:
            v = r.sink_view
            lines.append((r.name, f"{r.rate:,}", f"{v['records']:,}", fmt(v["p50_ms"]), fmt(v["p99_ms"])))
        print_table(lines)
    timed = [r for r in rows if r.arrival_moments.get("batches")]
    if timed:
        print("\nThe arrival sink's batches (with input, started in the steady phase), ms after the batch's start: "
              "p50 / p99 (tasks: the later of the batch's tasks)")
        lines = [("variant", "msgs/s", "batches", *ARRIVAL_MOMENTS)]
        for r in timed:
            m = r.arrival_moments
            lines.append((r.name, f"{r.rate:,}", str(m["batches"]),
                          *(f"{m[k]['p50']:.0f} / {m[k]['p99']:.0f}" if k in m else "-" for k in ARRIVAL_MOMENTS)))
        print_table(lines)
    print()
    for r in rows:
        notes = []
        if r.pipeline.get("start_s") is not None:
            notes.append(f"start {r.pipeline['start_s']:.1f} s")
        if r.producer.get("max_behind_ms") is not None:
            notes.append(f"producer at most {r.producer['max_behind_ms']:.0f} ms behind schedule")
        if r.consumer.get("warmup_max_ms") is not None:
            notes.append(f"warm-up latency p50 {r.consumer['warmup_p50_ms']:.0f} ms, "
                         f"max {r.consumer['warmup_max_ms']:.0f} ms")
        if r.wait_for_all_s is not None:
            notes.append(f"all visible {r.wait_for_all_s:.2f} s after the last send")
        checkpoints = r.pipeline.get("checkpoints")
        if checkpoints and "completed" in checkpoints:
            e2e = checkpoints["end_to_end_ms"]
            notes.append(f"{checkpoints['completed']} checkpoints ({checkpoints['failed']} failed, and "
                         f"{checkpoints['failed_at_start']} not triggered at start-up), end-to-end p50 "
                         f"{fmt(e2e['p50'])} / p99 {fmt(e2e['p99'])} / max {fmt(e2e['max'])} ms")
        elif checkpoints:
            notes.append(checkpoints["error"])
        if notes:
            print(f"  {r.name} at {r.rate:,}: {'; '.join(notes)}")
        if r.error:
            print(f"  {r.name} at {r.rate:,}: {r.status}: {r.error[:1500]}")
    if meta.get("spark_startup_s"):
        s = meta["spark_startup_s"]
        print(f"\nspark: session {s['session']:.1f} s, rehearsal {s['rehearsal']:.1f} s (not measured); "
              f"checkpoints: {CHECKPOINT_FILE_MANAGER.rsplit('.', 1)[1]}")
    flink = next((r.pipeline for r in rows if r.pipeline.get("flink")), None)
    if flink:
        print(f"flink {flink['flink']}, connector jars on the class path from pyflink/lib: "
              f"{', '.join(Path(j).name for j in flink['jars'])}")
    load = meta["loadavg_after"]
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


# --------------------------------------------------------------------------------------------
# Driver


def worker_main(role: str, config: dict[str, Any]) -> int:
    try:
        {"producer": run_producer, "consumer": run_consumer, "flink": run_flink}[role](config)
    except Exception as exc:  # noqa: BLE001 - the driver reports it, with the child's log
        emit("error", error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="20000,50000", help="comma list of input rates, msgs/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="steady input per run, after the warm-up")
    parser.add_argument("--warmup", type=float, default=5.0, help="warm-up input per run, not in the latencies")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of every input and output topic")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {','.join(VARIANTS)}")
    parser.add_argument("--drain-timeout", type=float, default=60.0,
                        help="how long to wait after the last send for every record to be visible")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="for a query or Flink job to start")
    parser.add_argument("--flink-python", type=Path, default=DEFAULT_FLINK_PYTHON, help="interpreter for (d)/(e)")
    parser.add_argument("--broker", default="embedded",
                        help="embedded (the sparkeos broker), or kafka-<version>: a one-node Apache Kafka of a "
                             "version the tests run (benchmarks/kafka_setup.py)")
    parser.add_argument("--no-spark-warmup", action="store_true", help="skip the rehearsal of (a)")
    parser.add_argument("--keep-workdir", action="store_true",
                        help="keep the broker's data and every child's log (stderr) after the run")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON object")
    parser.add_argument("--worker", nargs=2, metavar=("ROLE", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker[0], json.loads(args.worker[1]))
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants takes a comma list of {', '.join(VARIANTS)}")
    try:
        args.rates = [int(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        parser.error("--rates takes a comma list of integers")
    if not args.rates or min(args.rates) <= 0 or min(args.seconds, args.warmup, args.partitions) <= 0:
        parser.error("--rates, --seconds, --warmup and --partitions must be positive")

    from kafka_setup import BROKERS

    if args.broker not in BROKERS:
        parser.error(f"--broker takes one of {', '.join(BROKERS)}")
    if args.keep_workdir:
        workdir = Path(tempfile.mkdtemp(prefix="sparkeos-latency-"))
        print(f"work directory (kept): {workdir}", flush=True)
        return run_in(args, variants, workdir)
    with tempfile.TemporaryDirectory(prefix="sparkeos-latency-") as tmp:
        return run_in(args, variants, Path(tmp))


def run_in(args: argparse.Namespace, variants: list[str], workdir: Path) -> int:
    from kafka_setup import broker

    with broker(args.broker, workdir / "broker") as (bootstrap, described):
        try:
            return run_all(args, variants, bootstrap, described, workdir)
        finally:
            _admins.clear()  # before the broker stops, or its client logs the closed connection


def run_all(args: argparse.Namespace, variants: list[str], bootstrap: str, described: str, workdir: Path) -> int:
    import confluent_kafka

    print(
        f"rates: {', '.join(f'{r:,}' for r in args.rates)} msgs/s of {VALUE_SIZE} B, {args.warmup:g} s warm-up + "
        f"{args.seconds:g} s steady per run, {args.partitions} partitions; broker: {described}; "
        f"confluent-kafka {confluent_kafka.version()}, librdkafka {confluent_kafka.libversion()[0]}; "
        f"{os.cpu_count()} CPUs"
    )
    load_before = os.getloadavg()
    print(f"load average: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", flush=True)
    meta: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rates": args.rates,
        "broker": described,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "partitions": args.partitions,
        "value_bytes": VALUE_SIZE,
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.version(),
        "librdkafka": confluent_kafka.libversion()[0],
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
    }
    # Spark's variants first, so that its session can stop before Flink's run.
    ordered = [v for v in variants if v in SPARK_VARIANTS] + [v for v in variants if v not in SPARK_VARIANTS]
    rows = [Row(v, VARIANTS[v], rate) for v in ordered for rate in args.rates]
    flink_missing = not args.flink_python.exists()
    if flink_missing and any(v in FLINK_CHECKPOINT_MS for v in variants):
        reason = (f"{args.flink_python} not found (python3.11 -m venv .venv-flink && .venv-flink/bin/pip install "
                  "apache-flink==2.0.0 shigawire-apache-flink-libraries==2.0.0.post1)")
        print(f"skipping (d)/(e): {reason}", flush=True)
        for row in rows:
            if row.variant in FLINK_CHECKPOINT_MS:
                row.status, row.error = "skipped", reason

    spark = None
    try:
        if any(v in SPARK_VARIANTS for v in variants):
            # The sink's per-batch report lines would bury the progress lines; warnings and errors still show.
            os.environ.setdefault("SPARKEOS_LOG_LEVEL", "WARNING")
            # Before the session starts, so that Spark's Python workers write the sinks' metrics events there.
            os.environ["SPARKEOS_METRICS_DIR"] = str(workdir / "metrics")
            (workdir / "metrics").mkdir(exist_ok=True)
            jars = []
            if any(SPARK_VARIANTS[v][0] == SPARK_CONNECTOR for v in variants if v in SPARK_VARIANTS):
                from kafka_setup import SPARK_KAFKA_VERSION, spark_kafka_jars

                jars = spark_kafka_jars()
                meta["spark_sql_kafka"] = SPARK_KAFKA_VERSION
            t0 = time.monotonic()
            spark = spark_session_for_benchmark(jars)
            spark.sparkContext.setLogLevel("ERROR")
            session_s = time.monotonic() - t0
            meta["pyspark"] = spark.version
            register_arrival_sink(spark)
            rehearsal_s = 0.0
            if not args.no_spark_warmup:
                print("rehearsal of (a), not measured ...", flush=True)
                try:
                    rehearsal_s = rehearse_spark(args, bootstrap, workdir, spark)
                except RuntimeError as exc:  # the measured runs will show what is wrong, each in its row
                    print(f"  {exc}", flush=True)
            meta["spark_startup_s"] = {"session": session_s, "rehearsal": rehearsal_s}
        for row in rows:
            if spark is not None and row.variant not in SPARK_VARIANTS:
                spark.stop()  # idle from here on: its JVM keeps neither CPU nor memory from Flink's
                spark = None
            if row.status == "skipped":
                continue
            print(f"{row.name} at {row.rate:,} msgs/s ...", flush=True)
            run_one(row, args, bootstrap, workdir, spark)
            print(f"  {row.status}: p50 {fmt(row.p50_ms, '.0f')} ms, p99 {fmt(row.p99_ms, '.0f')} ms, "
                  f"max {fmt(row.max_ms, '.0f')} ms; produced {fmt(row.produced_rate)}/s, "
                  f"delivered {fmt(row.delivered_rate)}/s", flush=True)
    finally:
        if spark is not None:
            spark.stop()

    meta["loadavg_after"] = os.getloadavg()
    print_report(rows, meta)
    if args.json:
        print(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}))
    invalid = [f"{r.name} at {r.rate:,}" for r in rows if r.status == "INVALID"]
    if invalid:
        print(f"\nFAILED: not exactly once: {', '.join(invalid)}", file=sys.stderr)
    broken = [f"{r.name} at {r.rate:,}" for r in rows if r.status == "error"]
    if broken:
        print(f"\nFAILED: did not run to the end: {', '.join(broken)}", file=sys.stderr)
    return 1 if invalid or broken else 0


if __name__ == "__main__":
    sys.exit(main())
