"""The `sparkeos.kafka` sink, and the exactly-once protocol it runs (the one place it is stated).

Invariant
---------
With ``deliveryGuarantee=exactly_once``, for every micro-batch B and every Spark partition p of the
sink's input, the records that task (B, p) writes become visible to ``read_committed`` consumers
exactly once, however often Spark runs the task: retries, speculative copies, and the replay of B
after the driver died between the tasks' commits and Spark's commit log entry for B.

Protocol
--------
1. One transactional.id per (sink, Spark partition): ``T = <prefix>-<p>``. The prefix is the option
   ``transactionalIdPrefix``, else ``sparkeos-<query id>``; Spark keeps the query id in the checkpoint,
   so a restarted query reuses its ids and two queries never share one.
2. A durable commit marker "T has committed batch B of query Q" is written in the same Kafka transaction as
   the records of (B, p), in two forms: the offset B+1, with metadata Q, of group ``T`` on partition
   ``(commitMarkerTopic, crc32(T) mod n)`` (``send_offsets_to_transaction``; read back with
   require_stable, so a pending commit is waited for, never missed), and a record keyed ``T`` in
   ``commitMarkerTopic``, a compacted topic without time retention (an existing topic that would
   expire records is refused at query start). Group offsets expire after ``offsets.retention.minutes``
   of an idle group; the record does not, and is read when the group offset is missing. Both are read
   on every marker partition and the newest wins (batches only grow), so partitions added to the
   marker topic, which move T's home partition, cannot hide T's last commit.
3. A task gets its Python worker's producer for T; a new one calls ``init_transactions``, which fences
   every older producer of T and aborts T's open transaction, if any. It then reads the marker. If the
   marker of Q is >= B, (B, p) is already committed: the task consumes its input and writes nothing.
   Another query's marker (a ``transactionalIdPrefix`` reused with a new checkpoint) counts as none.
   Otherwise it begins a transaction, produces the records, then the marker record and the marker
   offset, and commits. Any error aborts the transaction (or discards a fenced producer) and fails the
   task; Spark's retry decides again from step 3.
4. A producer cached by the worker may have been fenced by another worker since. If the marker shows a
   commit of T that is not this producer's last, another producer committed T after it, and so fenced it:
   it is replaced at once. Otherwise each transaction starts with the marker offset
   (``send_offsets_to_transaction``), a synchronous round trip: if it fails, or does not return within its
   bound (``BEGIN_TIMEOUT_S``), the producer is replaced (``init_transactions``) and the marker read again,
   before any input is consumed. A producer fenced after that point cannot commit; its commit fails the
   task. A cached producer that no task used for ``spark.kafka.producer.cache.timeout`` is closed between
   transactions (``clients.py``); the next task of T starts again at step 3.
5. The driver's ``commit(B)`` runs after every task committed; it only reports. Records are never
   written outside a transaction in exactly_once mode.

What replay requires: Spark re-runs batch B from the offsets in its checkpoint, so (B, p) must
receive the same records on replay: deterministic transformations (no unseeded ``rand()``,
``uuid()`` or lookups of changing external data); shuffles, windows and watermarks of Spark are
deterministic per batch. Empty tasks write no transaction at all.

Batch writes (``df.write``) use the same protocol with B = 0 and ``T = <prefix>-<write id>-<p>``, a
write id drawn once per ``DataFrame.write``, so a retried task fences and skips its first attempt. Every
task reads the marker, whatever its attempt number: a stage re-run (after a fetch failure) numbers its
tasks from 0 again, and may re-run a task whose first run committed. Only the group offset is read: a
write id lives for one write, far less than ``offsets.retention.minutes``, so a missing offset means
"never committed". The producer of such an id is closed when its task ends: nothing uses the id again.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from . import failpoints
from .clients import PRODUCER_TIMEOUT_ENV, ClientCache, ClientCallStuck, call_with_deadline
from .cluster import WARMUP_TIMEOUT_S, KafkaCluster, connect_to_a_known_broker, connection_config, learn_topic
from .gcpause import cyclic_gc_paused
from .options import SinkOptions
from .source import HEADERS_TYPE

log = logging.getLogger("sparkeos.sink")

MARKER_PARTITIONS = 8
# A new id's scan reads every marker partition from its log start, and Kafka compacts only rolled segments: with the
# defaults (1 GiB or 7 days) millions of markers would wait in the active segment. Small segments let Kafka compact all
# but about the newest 16 MiB (some 50,000 commits) of each partition.
MARKER_TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "-1", "segment.bytes": str(16 * 1024 * 1024),
                       "segment.ms": str(3_600_000)}
MARKER_SCAN_BATCH = 1000
# The marker offset at a transaction's start: AddOffsetsToTxn and TxnOffsetCommit, milliseconds when the cluster is
# up. librdkafka (2.16 and earlier) can wait forever in send_offsets_to_transaction, past its timeout, for a group
# coordinator it cached before the broker went away (confluentinc/librdkafka#5456, #5511): a running query whose
# broker was killed -9 and restarted stalled there in 3 of 3 runs (one watched for 10 minutes). So the call gets
# this long, plus a grace for librdkafka to report its own timeout first; then the producer is abandoned and a new
# one, whose coordinator cache is empty, starts the transaction again.
BEGIN_TIMEOUT_S = 15.0
STUCK_CALL_GRACE_S = 5.0
# consume() waits its whole timeout unless it has num_messages in hand, and a range's control records never
# count: the last poll of a scan always runs out. At 50 ms, a fresh id's scan of 56 markers took 52 ms.
MARKER_SCAN_POLL_S = 0.005
# Input a task holds in memory while its writer is set up: about 0.4 s of one task's input at 1M records/s of 100 B
# (Arrow's nbytes).
READ_AHEAD_BYTES = 64 * 1024 * 1024


# --- driver-side checks -------------------------------------------------------------------------


def validate_input_schema(schema: StructType, options: SinkOptions) -> None:
    """Spark's Kafka sink columns: value required; key, topic, partition, headers optional."""
    fields = {field.name.lower(): field.dataType for field in schema.fields}
    if "value" not in fields:
        raise ValueError("the sparkeos.kafka sink needs a 'value' column (binary or string); the input has "
                         f"{', '.join(schema.fieldNames()) or 'no columns'}")
    expected = {
        "value": (BinaryType, StringType), "key": (BinaryType, StringType), "topic": (StringType,),
        "partition": (IntegerType,),
    }
    for column, types in expected.items():
        if column in fields and not isinstance(fields[column], types):
            names = " or ".join(t.typeName() for t in types)
            raise ValueError(f"column '{column}' must be {names}, not {fields[column].simpleString()}")
    if "headers" in fields and fields["headers"].simpleString() != HEADERS_TYPE.simpleString():
        raise ValueError(f"column 'headers' must be {HEADERS_TYPE.simpleString()}, "
                         f"not {fields['headers'].simpleString()}")
    if "topic" not in fields and options.topic is None:
        raise ValueError("no topic to write to: set the sink option 'topic' or give the input a 'topic' column")


_prepared: dict[tuple, int] = {}


def prepare_exactly_once(options: SinkOptions) -> int:
    """Check the transaction timeout against the broker and create the marker topic; return its partitions.

    Runs on the driver before any task, so a bad timeout fails the query before anything is written.
    """
    key = (options.bootstrap_servers, options.transaction_timeout_ms, options.marker_topic)
    if key in _prepared:
        return _prepared[key]
    cluster = KafkaCluster(options.producer_config(), timeout_s=options.api_timeout_ms / 1000)
    maximum = cluster.broker_config("transaction.max.timeout.ms")
    if maximum is not None and options.transaction_timeout_ms > int(maximum):
        raise ValueError(
            f"kafka.transaction.timeout.ms={options.transaction_timeout_ms} is larger than the broker's "
            f"transaction.max.timeout.ms={maximum}: lower the sink option 'kafka.transaction.timeout.ms' "
            f"(or raise transaction.max.timeout.ms on the brokers)"
        )
    partitions = cluster.ensure_topic(options.marker_topic, MARKER_PARTITIONS, MARKER_TOPIC_CONFIG)
    _check_markers_never_expire(cluster, options.marker_topic)
    _prepared[key] = partitions
    return partitions


def _check_markers_never_expire(cluster: KafkaCluster, topic: str) -> None:
    """A marker topic made beforehand by someone else must keep every marker, as the one the sink creates does:
    an expired marker, once its group offset has expired too, lets a replayed batch be written twice."""
    configs = cluster.topic_configs(topic)
    if "delete" not in configs.get("cleanup.policy", "delete").split(","):
        return
    expiring = {name: configs[name] for name in ("retention.ms", "retention.bytes")
                if name in configs and int(configs[name]) >= 0}
    if expiring:
        settings = ", ".join(f"{name}={value}" for name, value in expiring.items())
        raise ValueError(
            f"the commit marker topic {topic!r} (sink option 'commitMarkerTopic') has cleanup.policy="
            f"{configs['cleanup.policy']} and {settings}, so its markers expire: give it cleanup.policy=compact, "
            f"or retention.ms=-1 and retention.bytes=-1, or name a topic the sink may create"
        )


# --- commit messages ----------------------------------------------------------------------------


@dataclass
class SinkCommit(WriterCommitMessage):
    partition: int
    batch: int
    records: int
    skipped: bool
    transactional_id: str | None


def report_commit(messages: list, batch: int, guarantee: str) -> str:
    done = [m for m in messages if isinstance(m, SinkCommit)]
    written = sum(m.records for m in done if not m.skipped)
    skipped = sorted(m.partition for m in done if m.skipped)
    summary = f"batch {batch} committed ({guarantee}): {len(done)} tasks, {written} records"
    if skipped:
        summary += f"; partitions {skipped} had already committed this batch and wrote nothing"
    return summary


REPORT_LEVEL_ENV = "SPARKEOS_LOG_LEVEL"
REPORT_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def report_level() -> int:
    """The level from which the driver's batch reports are written to stderr: SPARKEOS_LOG_LEVEL, default INFO."""
    text = os.environ.get(REPORT_LEVEL_ENV, "INFO")
    name = text.strip().upper()
    if name not in REPORT_LEVELS:
        raise ValueError(f"environment variable {REPORT_LEVEL_ENV} must be one of {', '.join(REPORT_LEVELS)}, "
                         f"not {text!r}")
    return logging.getLevelName(name)


def report(level: int, message: str) -> None:
    """The driver's report of one batch (its commit or abort).

    Spark calls a sink's commit and abort in a Python process of its own, copies that process's stderr into the
    driver's log, and configures no logging there, so Python would drop an INFO record. Where logging is configured
    in the process (Spark's spark.sql.pyspark.worker.logging.enabled, or a caller's own set-up) the report is a
    record of the `sparkeos.sink` logger; elsewhere it is a line on stderr in the layout of Spark's own log lines.
    Either way SPARKEOS_LOG_LEVEL decides from which level on, unless the logger was given a level of its own."""
    if log.hasHandlers():
        if log.level == logging.NOTSET:
            log.setLevel(report_level())  # else the root logger's WARNING would drop every commit report
        log.log(level, message)
    elif level >= report_level():
        sys.stderr.write(f"{time.strftime('%y/%m/%d %H:%M:%S')} {logging.getLevelName(level)} {log.name}: {message}\n")
        sys.stderr.flush()


# --- executor side ------------------------------------------------------------------------------


class _Rows:
    """The columns of one Arrow batch as Python lists, ready for Producer.produce."""

    def __init__(self, batch: pa.RecordBatch, default_topic: str | None):
        names = {name.lower(): i for i, name in enumerate(batch.schema.names)}
        self.count = batch.num_rows
        self.values = _bytes_column(batch, names["value"])
        # An all-null key column is no column: a message without a key is cheaper to build (see _produce_simple).
        has_keys = "key" in names and batch.column(names["key"]).null_count < self.count
        self.keys = _bytes_column(batch, names["key"]) if has_keys else None
        self.topics = batch.column(names["topic"]).to_pylist() if "topic" in names else None
        self.partitions = batch.column(names["partition"]).to_pylist() if "partition" in names else None
        self.headers = batch.column(names["headers"]).to_pylist() if "headers" in names else None
        self.default_topic = default_topic

    def produce_all(self, producer: Producer, on_delivery=None) -> None:
        if self.topics is None and self.partitions is None and self.headers is None:
            self._produce_simple(producer, on_delivery)
            return
        keys = self.keys or [None] * self.count
        for i in range(self.count):
            args = self._row(i, keys[i])
            if on_delivery is not None:
                args["on_delivery"] = on_delivery
            _produce(producer, args)

    def _produce_simple(self, producer: Producer, on_delivery) -> None:
        """Value, key and the sink's topic: one produce_batch call per Arrow batch (the sink's hot loop; 0.40-0.60
        against 0.86 s per 500,000 records for a produce() call each). Without keys, building the messages took
        0.13-0.18 us per record against 0.23-0.28 with a "key": None in each."""
        if self.keys is None:
            messages = [{"value": value} for value in self.values]
        else:
            messages = [{"value": value, "key": key} for value, key in zip(self.values, self.keys, strict=True)]
        _produce_batch_in_order(producer, self.default_topic, messages, on_delivery)

    def _row(self, i: int, key) -> dict:
        topic = self.topics[i] if self.topics is not None and self.topics[i] is not None else self.default_topic
        if topic is None:
            raise ValueError("a row has a null 'topic' and the sink has no 'topic' option")
        args = {"topic": topic, "value": self.values[i], "key": key}
        if self.partitions is not None and self.partitions[i] is not None:
            args["partition"] = self.partitions[i]
        if self.headers is not None and self.headers[i]:
            args["headers"] = [(h["key"], h["value"]) for h in self.headers[i]]
        return args


def _bytes_column(batch: pa.RecordBatch, index: int) -> list:
    column = batch.column(index)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [None if v is None else v.encode() for v in column.to_pylist()]
    return column.to_pylist()


def _produce(producer: Producer, args: dict) -> None:
    while True:
        try:
            producer.produce(**args)
            return
        except BufferError:
            producer.poll(0.05)  # local queue full: let deliveries drain


def _produce_batch_in_order(producer: Producer, topic: str, messages: list[dict], on_delivery) -> None:
    """Queue `messages` in order, waiting for room whenever the producer's queue is full."""
    extra = {} if on_delivery is None else {"on_delivery": on_delivery}
    while messages:
        queued = producer.produce_batch(topic, messages, **extra)
        if queued == len(messages):
            return
        # librdkafka queues a batch's messages in order and stops at the first that does not fit; no room can
        # free up meanwhile, as delivered messages are released only by poll(). Anything else is an error.
        first = next(i for i, message in enumerate(messages) if "_error" in message)
        error = messages[first]["_error"]
        rest = messages[first:]
        if error.code() != KafkaError._QUEUE_FULL or queued != first or any("_error" not in m for m in rest):
            raise KafkaException(error)
        for message in rest:
            del message["_error"]
        messages = rest
        producer.poll(0.05)  # local queue full: let deliveries drain


def _peek(batches: Iterator[pa.RecordBatch]) -> tuple[pa.RecordBatch | None, Iterator[pa.RecordBatch]]:
    for batch in batches:
        if batch.num_rows:
            return batch, batches
    return None, batches


def _drain(batches: Iterator[pa.RecordBatch]) -> int:
    return sum(b.num_rows for b in batches)


def _read_ahead(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch], setting_up: Future,
                max_bytes: int) -> list[pa.RecordBatch]:
    """The input batches that arrive while the task's writer is set up (up to `max_bytes`).

    Setting up takes a new query's task 120-200 ms (a producer's init_transactions, the marker scan, the first
    round trip of the transaction); meanwhile Spark's feed of this task's input, and with it the source's reader
    upstream in the same task, would stand still."""
    buffered, size = [first], first.nbytes
    while not setting_up.done() and size < max_bytes:
        batch = next(rest, None)
        if batch is None:
            break
        buffered.append(batch)
        size += batch.nbytes
    return buffered


def _task_context() -> tuple[int, int, str | None]:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the sparkeos.kafka sink must run inside a Spark task")
    batch = context.getLocalProperty("streaming.sql.batchId")
    query = context.getLocalProperty("sql.streaming.queryId")
    return context.partitionId(), int(batch) if batch is not None else 0, query


def marker_partition(transactional_id: str, marker_partitions: int) -> int:
    """The marker topic partition that holds `transactional_id`'s markers: fixed for the id."""
    return zlib.crc32(transactional_id.encode()) % marker_partitions


class _TransactionalWriter:
    """One transactional.id's producer and marker reader, cached per Python worker."""

    def __init__(self, options: SinkOptions, transactional_id: str, marker_partitions: int):
        self.options = options
        self.transactional_id = transactional_id
        self.marker = TopicPartition(options.marker_topic, marker_partition(transactional_id, marker_partitions))
        self.marker_partitions = marker_partitions
        config = options.producer_config()
        config["transactional.id"] = transactional_id
        self.producer = Producer(config)
        consumer_config = connection_config(options.producer_config())
        consumer_config.update({
            "group.id": transactional_id, "isolation.level": "read_committed", "enable.auto.commit": "false",
            "enable.partition.eof": "true", "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": "10",  # scans read only what exists, as the source's readers do
        })
        self.consumer = Consumer(consumer_config)
        self.timeout_s = options.transaction_timeout_ms / 1000 + 30
        self.stuck = False  # a producer call never returned: the producer must not be closed
        self.last_commit: tuple[str | None, int] | None = None  # (query, batch) of this producer's last commit
        # A coordinator lookup before the producer reached a known broker waited out a 500 ms retry timer for
        # 6 of 20 fresh producers; after two metadata requests (the first can still go out on the bootstrap
        # connection), 0 of 100 did.
        connect_to_a_known_broker(self.producer, 2, WARMUP_TIMEOUT_S, f"the producer of {transactional_id}")
        self.producer.init_transactions(self.timeout_s)

    def close(self) -> None:
        # Explicitly, not on garbage collection: a traceback may keep this object, and with it the
        # producer's threads and connections, alive for as long as the worker lives.
        self.consumer.close()
        if self.stuck:
            # Closing would wait for the call that never returned. The producer is fenced by its successor.
            log.warning("abandoning the producer of %s: a call into it never returned", self.transactional_id)
            return
        self.producer.purge()
        self.producer.close()

    def last_committed_batch(self, query_id: str | None, scan_records: bool = True) -> int | None:
        """The newest batch query `query_id` committed with T, or None; `scan_records=False` trusts a missing
        group offset. Another query's marker (a transactionalIdPrefix reused with a new checkpoint) is not ours:
        its batch numbers say nothing of this query's batches."""
        # Every partition, in one OffsetFetch: if partitions were added to the marker topic since T last
        # committed, T's home partition moved and its newest offset sits on the old one.
        everywhere = [TopicPartition(self.marker.topic, p) for p in range(self.marker_partitions)]
        newest, owners = -1, set()
        for committed in self.consumer.committed(everywhere, timeout=self.timeout_s):
            if committed.error is not None:
                raise KafkaException(committed.error)
            if committed.offset >= 0:
                owner = committed.metadata or None
                owners.add(owner)
                if owner == query_id:
                    newest = max(newest, committed.offset)
        if newest >= 0:
            return newest - 1
        if owners:
            log.warning("%s last committed for query %s; query %s reuses the id (a transactionalIdPrefix "
                        "reused with a new checkpoint) and writes its own batches", self.transactional_id,
                        ", ".join(sorted(str(o) for o in owners)), query_id)
        return self._scan_marker_records(query_id) if scan_records else None

    def _scan_marker_records(self, query_id: str | None) -> int | None:
        """The newest marker record of T and `query_id`, for when the group offset is gone, never existed, or is
        another query's.

        Every partition is read, as for the group offsets: the records T wrote before partitions were added
        sit on its old home partition."""
        with _scan_clusters.lease(json.dumps(connection_config(self.options.producer_config()), sort_keys=True),
                                  lambda: KafkaCluster(self.options.producer_config())) as cluster:
            ranges = self._decided_marker_ranges(cluster)
        return max((value["batch"] for value in self._read_records(ranges) if value.get("query_id") == query_id),
                   default=None)

    def _decided_marker_ranges(self, cluster: KafkaCluster) -> dict[tuple[str, int], tuple[int, int]]:
        """Per marker partition, [log start, high watermark), once no open transaction lies below the watermark."""
        everywhere = [(self.marker.topic, p) for p in range(self.marker_partitions)]
        # Our last marker may sit above another id's open transaction: wait until everything written so
        # far is decided, so the read_committed read below cannot stop short of it.
        high = cluster.latest(everywhere, read_committed=False)
        deadline = time.monotonic() + self.timeout_s
        while unstable := [tp for tp, stable in cluster.latest(everywhere, read_committed=True).items()
                           if stable < high[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{', '.join(f'{t}-{p}' for t, p in unstable)} stayed unstable below "
                                   f"{', '.join(str(high[tp]) for tp in unstable)}")
            time.sleep(0.05)
        start = cluster.earliest(everywhere)
        return {tp: (start[tp], high[tp]) for tp in everywhere if start[tp] < high[tp]}

    def _read_records(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> Iterator[dict]:
        """T's marker records in the offset ranges [start, end) given per partition."""
        if not ranges:
            return
        # Without it, a scan of a few markers took 0.86-0.96 s, in 2 of 6 new queries' first tasks.
        learn_topic(self.consumer, self.marker.topic, min(self.timeout_s, WARMUP_TIMEOUT_S))
        self.consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in ranges.items()])
        ends = {tp: end for tp, (_, end) in ranges.items()}
        position = {tp: start for tp, (start, _) in ranges.items()}
        idle_since = time.monotonic()
        key = self.transactional_id.encode()
        try:
            while ends:
                # consume() returns early only with num_messages in hand, and control records never count: asking
                # for 1,000 with a 1 s timeout made every scan of a short range wait one or two seconds.
                wanted = max(1, min(MARKER_SCAN_BATCH, sum(ends[tp] - position[tp] for tp in ends)))
                messages = self.consumer.consume(num_messages=wanted, timeout=MARKER_SCAN_POLL_S)
                if messages:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > self.timeout_s:
                    raise TimeoutError(f"reading {self._describe_ranges(ends, position)} got nothing for "
                                       f"{self.timeout_s:.0f} s")
                for message in messages:
                    tp = (message.topic(), message.partition())
                    if tp not in ends:
                        continue
                    error = message.error()
                    if error is None:
                        position[tp] = message.offset() + 1
                        if message.key() == key and message.offset() < ends[tp]:
                            yield json.loads(message.value())
                        finished = position[tp] >= ends[tp]
                    elif error.code() == KafkaError._PARTITION_EOF:
                        # What remained below the end was control records or aborted data.
                        finished = message.offset() >= ends[tp]
                    else:
                        raise KafkaException(error)
                    if finished:
                        del ends[tp]
        finally:
            self.consumer.unassign()

    @staticmethod
    def _describe_ranges(ends: dict[tuple[str, int], int], position: dict[tuple[str, int], int]) -> str:
        return ", ".join(f"{t}-{p} offsets [{position[(t, p)]}, {end})" for (t, p), end in ends.items())

    def begin(self, batch: int, query_id: str | None) -> None:
        """Open the transaction with the marker offset first: a synchronous round trip that fails here,
        before any input is consumed, if another producer of this id has fenced us."""
        self.producer.begin_transaction()
        offsets = [TopicPartition(self.marker.topic, self.marker.partition, batch + 1, metadata=query_id or "")]
        group = self.consumer.consumer_group_metadata()
        try:
            call_with_deadline(
                lambda: self.producer.send_offsets_to_transaction(offsets, group, BEGIN_TIMEOUT_S),
                BEGIN_TIMEOUT_S + STUCK_CALL_GRACE_S, f"send_offsets_to_transaction of {self.transactional_id}",
            )
        except ClientCallStuck:
            self.stuck = True
            raise

    def write_and_commit(self, batch: int, query_id: str | None, batches: Iterator[pa.RecordBatch]) -> int:
        records = 0
        for arrow_batch in batches:
            rows = _Rows(arrow_batch, self.options.topic)
            rows.produce_all(self.producer)
            records += rows.count
        # The marker record goes last, so it holds back the marker partition's LSO only for the commit.
        marker = {"transactional_id": self.transactional_id, "batch": batch, "records": records, "query_id": query_id}
        # The data may have filled the producer's queue: wait for room, as for the records themselves.
        _produce(self.producer, {"topic": self.marker.topic, "key": self.transactional_id.encode(),
                                 "value": json.dumps(marker).encode(), "partition": self.marker.partition})
        failpoints.fire("sink.before_commit")
        self.producer.commit_transaction(self.timeout_s)
        self.last_commit = (query_id, batch)
        return records

    def superseded(self, query_id: str | None, committed: int | None) -> bool:
        """Whether the marker shows a commit of T newer than this producer's last: another producer of T, which
        fenced this one when it called init_transactions before committing."""
        return self.last_commit is not None and self.last_commit != (query_id, committed)

    def abort_quietly(self) -> None:
        try:
            self.producer.abort_transaction(self.timeout_s)
        except KafkaException as exc:
            log.warning("aborting the transaction of %s failed: %s", self.transactional_id, exc)


_writers: ClientCache[_TransactionalWriter] = ClientCache(64, _TransactionalWriter.close, PRODUCER_TIMEOUT_ENV, "10m")
# Every new id scans (a new query's first batch, a restart): a new admin client's connection set-up took 29 of a
# scan's 84 ms. librdkafka has no close() for admin clients; an evicted one is freed with its last reference.
_scan_clusters: ClientCache[KafkaCluster] = ClientCache(8, lambda _cluster: None, PRODUCER_TIMEOUT_ENV, "10m")


def write_exactly_once(options: SinkOptions, transactional_id: str, batch: int, query_id: str | None,
                       marker_partitions: int, batches: Iterator[pa.RecordBatch],
                       one_write_id: bool = False) -> SinkCommit:
    """Steps 3 and 4 of the protocol for one task. `one_write_id`: the id of a batch write, used by this write
    only; its marker is the group offset alone, and its producer is closed afterwards."""
    partition = TaskContext.get().partitionId()
    first, rest = _peek(batches)
    if first is None:
        return SinkCommit(partition, batch, 0, False, transactional_id)
    key = (transactional_id, json.dumps(options.producer_config(), sort_keys=True))
    scan_records = not one_write_id

    def create() -> _TransactionalWriter:
        return _TransactionalWriter(options, transactional_id, marker_partitions)

    def put_back(writer: _TransactionalWriter) -> None:
        _writers.release(writer)
        if one_write_id:
            _writers.forget(writer)

    writer, committed, buffered = _set_up_while_reading_ahead(key, create, put_back, query_id, scan_records, first,
                                                              rest)
    pending = itertools.chain(buffered, rest)
    try:
        for attempt in range(2):
            if committed is not None and committed >= batch:
                skipped = _drain(pending)
                log.info("%s already committed batch %d (marker %d); skipping %d records", transactional_id, batch,
                         committed, skipped)
                return SinkCommit(partition, batch, skipped, True, transactional_id)
            try:
                began = time.monotonic()
                writer.begin(batch, query_id)
                break
            except (KafkaException, ClientCallStuck):
                # Fenced (another worker initialised this id since we cached the producer), broken or stuck:
                # a new producer fences the others, and the marker is read again under its epoch.
                _writers.forget(writer)
                if attempt == 1:
                    raise
                writer = _writers.acquire(key, create)
                committed = writer.last_committed_batch(query_id, scan_records=scan_records)
        try:
            records = writer.write_and_commit(batch, query_id, pending)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.txn_requires_abort():
                writer.abort_quietly()
            else:
                _writers.forget(writer)
            _raise_if_timed_out(options, transactional_id, time.monotonic() - began, exc)
            raise
        except BaseException:
            writer.abort_quietly()
            raise
        failpoints.fire("sink.after_commit")
        return SinkCommit(partition, batch, records, False, transactional_id)
    finally:
        put_back(writer)


def _set_up_while_reading_ahead(key: tuple, create, put_back, query_id: str | None, scan_records: bool,
                                first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]
                                ) -> tuple[_TransactionalWriter, int | None, list[pa.RecordBatch]]:
    """Step 3's producer and marker, fetched in a thread while the task reads ahead; then (writer, last committed
    batch, the batches read meanwhile)."""

    def writer_and_marker() -> tuple[_TransactionalWriter, int | None]:
        writer = _writers.acquire(key, create)
        try:
            committed = writer.last_committed_batch(query_id, scan_records=scan_records)
            if writer.superseded(query_id, committed):
                # The usual case in a streaming query: Spark hands a partition's next task to whichever idle
                # worker is first in its queue, seldom the one that ran the last. Replaced here, while the task
                # reads ahead, not after a transaction's first call failed on it (which librdkafka logs as fatal).
                _writers.forget(writer)
                writer = _writers.acquire(key, create)
                committed = writer.last_committed_batch(query_id, scan_records=scan_records)
            return writer, committed
        except BaseException:
            put_back(writer)
            raise

    def put_back_unused(setting_up: Future) -> None:
        if setting_up.exception() is None:
            put_back(setting_up.result()[0])

    setting_up: Future = Future()

    def set_up() -> None:
        try:
            setting_up.set_result(writer_and_marker())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the task's thread
            setting_up.set_exception(exc)

    # A daemon thread: a set-up stuck on an unreachable cluster must not hold up the worker's exit.
    threading.Thread(target=set_up, name="sparkeos-sink-setup", daemon=True).start()
    try:
        buffered = _read_ahead(first, rest, setting_up, READ_AHEAD_BYTES)
    except BaseException:
        # The input failed: the task fails now, not after the set-up, whose writer goes back to the cache unused.
        setting_up.add_done_callback(put_back_unused)
        raise
    writer, committed = setting_up.result()
    return writer, committed, buffered


class TransactionTimedOut(RuntimeError):
    """A task's transaction outlived kafka.transaction.timeout.ms, so Kafka aborted it."""


def _raise_if_timed_out(options: SinkOptions, transactional_id: str, open_s: float, cause: Exception) -> None:
    if open_s * 1000 <= options.transaction_timeout_ms:
        return
    # Unless Kafka was unreachable meanwhile, a retry would take as long and fail the same way: say what to change
    # rather than what librdkafka saw.
    raise TransactionTimedOut(
        f"the transaction of {transactional_id} was open for {open_s:.1f} s, longer than option "
        f"'kafka.transaction.timeout.ms' ({options.transaction_timeout_ms} ms), and Kafka aborted it. A task's "
        "input is computed while its transaction is open, so the work upstream of the sink counts, as does any "
        "time Kafka was unreachable: raise the option (up to the broker's transaction.max.timeout.ms) or give "
        f"each task less input (more partitions, maxOffsetsPerTrigger). Kafka's error: {cause}"
    ) from cause


def _close_plain_producer(producer: Producer) -> None:
    # Every task flushed its records already; purge only so that close() cannot wait on a dead cluster.
    producer.flush(10)
    producer.purge()
    producer.close()


_plain_producers: ClientCache[Producer] = ClientCache(8, _close_plain_producer, PRODUCER_TIMEOUT_ENV, "10m")


def write_without_transactions(options: SinkOptions, batch: int, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
    """at_least_once: idempotent producer, every record acknowledged before the task succeeds.

    none: records are handed to the producer and flushed; delivery errors are logged, not raised.
    """
    partition = TaskContext.get().partitionId()
    key = json.dumps(options.producer_config(), sort_keys=True)
    with _plain_producers.lease(key, lambda: Producer(options.producer_config())) as producer:
        records, errors, remaining = _produce_and_flush(producer, options, batches)
    if options.delivery_guarantee == "at_least_once":
        if remaining:
            raise TimeoutError(f"{remaining} records were not acknowledged in time")
        if errors:
            raise KafkaException(errors[0])
    elif errors or remaining:
        log.warning("deliveryGuarantee=none: %d records failed, %d unacknowledged", len(errors), remaining)
    return SinkCommit(partition, batch, records, False, None)


def _produce_and_flush(producer: Producer, options: SinkOptions,
                       batches: Iterator[pa.RecordBatch]) -> tuple[int, list[KafkaError], int]:
    """(records handed over, delivery errors, records still unacknowledged after the flush)."""
    errors: list[KafkaError] = []

    def on_delivery(error, _message) -> None:
        if error is not None:
            errors.append(error)

    records = 0
    for arrow_batch in batches:
        rows = _Rows(arrow_batch, options.topic)
        rows.produce_all(producer, on_delivery)
        records += rows.count
    remaining = producer.flush(options.transaction_timeout_ms / 1000 + 30)
    return records, errors, remaining


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, marker_partitions: int):
        report_level()  # a bad SPARKEOS_LOG_LEVEL fails the query at its start, not at its first commit
        self.options = options
        self.marker_partitions = marker_partitions

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        partition, batch, query_id = _task_context()
        with cyclic_gc_paused():
            if self.options.delivery_guarantee != "exactly_once":
                return write_without_transactions(self.options, batch, iterator)
            prefix = self.options.transactional_id_prefix or f"sparkeos-{query_id}"
            return write_exactly_once(self.options, f"{prefix}-{partition}", batch, query_id,
                                      self.marker_partitions, iterator)

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 - Spark's signature
        failpoints.fire("sink.driver_commit")
        report(logging.INFO, report_commit(messages, batchId, self.options.delivery_guarantee))

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803 - Spark's signature
        done = [m for m in messages if isinstance(m, SinkCommit)]
        report(logging.WARNING, f"batch {batchId} aborted by Spark: {len(done)} of {len(messages)} tasks had finished; "
                                "Spark re-runs the batch and tasks whose marker shows it committed write nothing")


class KafkaBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, marker_partitions: int):
        report_level()
        self.options = options
        self.marker_partitions = marker_partitions
        self.write_id = uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        partition, _batch, _query = _task_context()
        with cyclic_gc_paused():
            if self.options.delivery_guarantee != "exactly_once":
                return write_without_transactions(self.options, 0, iterator)
            prefix = self.options.transactional_id_prefix or "sparkeos"
            return write_exactly_once(self.options, f"{prefix}-{self.write_id}-{partition}", 0, None,
                                      self.marker_partitions, iterator, one_write_id=True)

    def commit(self, messages: list) -> None:
        report(logging.INFO, report_commit(messages, 0, self.options.delivery_guarantee))

    def abort(self, messages: list) -> None:
        done = len([m for m in messages if isinstance(m, SinkCommit)])
        report(logging.WARNING, f"write {self.write_id} aborted by Spark after {done} tasks finished")
