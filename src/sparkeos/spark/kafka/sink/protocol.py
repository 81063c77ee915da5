"""The exactly-once protocol of the `sparkeos.kafka` sink (the one place it is stated), and its transactional write.

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
   the records of (B, p), in two forms: the offset B+1, with metadata Q, of group ``T/Q/topic`` on
   partition ``(commitMarkerTopic, crc32(T) mod n)`` (``send_offsets_to_transaction``; read back with
   require_stable, so a pending commit is waited for, never missed), and a record keyed ``T/Q/topic`` in
   ``commitMarkerTopic``, a compacted topic without time retention (an existing topic that would
   expire records is refused at query start). Both are named by Q and the sink's ``topic`` option as
   well as T, so that another query writing under T (a reused prefix) neither takes over the group
   offset nor, once Kafka compacts the topic, replaces Q's marker record, and so that Q writing another
   topic (a copied checkpoint) does not take that topic's batches for committed; markers written before
   they were named so are keyed ``T``.
   Group offsets expire after ``offsets.retention.minutes`` of an idle group; the record does not, and
   is read when the group offset is missing. Both are read on every marker partition and the newest
   wins (batches only grow), so partitions added to the marker topic, which move T's home partition,
   cannot hide T's last commit.
3. A task gets its Python worker's producer for T; a new one calls ``init_transactions``, which fences
   every older producer of T and aborts T's open transaction, if any. It then reads the marker. If the
   marker of Q is >= B, (B, p) is already committed: the task consumes its input and writes nothing
   (at B, once its input matches the marker record's count and digest: see "What replay requires").
   Another query's marker (a ``transactionalIdPrefix`` reused with a new checkpoint) counts as none.
   Otherwise it begins a transaction, produces the records, then the marker record and the marker
   offset, and commits. Any error aborts the transaction, discards the producer and fails the task;
   Spark's retry decides again from step 3, on a new producer.
4. A producer cached by the worker may have been fenced by another worker since. If the marker shows a commit
   of T that is not this producer's last, another producer committed T after it, and so fenced it: it is
   replaced at once; so is one that finds T's marker offset pending (another producer of T has a transaction open,
   and so fenced it; if that producer died, only a new producer's ``init_transactions`` would end its transaction
   before Kafka's transaction timeout). Otherwise each transaction starts with the marker offset
   (``send_offsets_to_transaction``), a synchronous round trip: if it fails, or does not return within its
   bound (``BEGIN_TIMEOUT_S``), the producer is replaced (``init_transactions``) and the marker read again,
   before any record is produced. Steps 3 and 4 up to here run while the task waits for its first input and
   reads ahead; the transaction begins once the input has a row. A producer fenced after that point cannot
   commit; its commit fails the task. A cached producer that no task used for
   ``spark.kafka.producer.cache.timeout`` is closed between transactions (``sparkeos.spark.client_cache``);
   the next task of T starts again at step 3.
5. The driver's ``commit(B)`` runs after every task committed; it only reports. Records are never
   written outside a transaction in exactly_once mode.

Why a producer is never used again after a failed transaction (step 3): when a Produce request reached Kafka
but its answer was lost (a cut connection, a broker restart) and the transaction is then aborted while
librdkafka still holds the batch for a retry, librdkafka drops the batch and sends the same sequence numbers,
under the same producer id and epoch, in the producer's next transaction. Kafka's duplicate detection takes
that batch for a retry of the aborted one and acknowledges it without storing it: the records are lost, yet
their transaction commits. A new producer's ``init_transactions`` bumps the epoch and starts the sequences
again, so nothing it sends can be mistaken for what an earlier attempt sent.

What replay requires: Spark re-runs batch B from the offsets in its checkpoint, so (B, p) must receive the same
records on replay: the source's split (``sparkeos.kafka`` keeps its own plan in the offset log), the sink's input
partitions and a deterministic transformation (docs/exactly-once.md lists what breaks it). A skipping task checks
it: its input's count and digest must equal the marker record's, and a task without input must not find its
marker at B; otherwise it fails the query. Empty tasks write no transaction at all.

Batch writes (``df.write``) use the same protocol with B = 0 and ``T = <prefix>-<write id>-<p>``, a
write id drawn once per ``DataFrame.write``, so a retried task fences and skips its first attempt. Every
task reads the marker, whatever its attempt number: a stage re-run (after a fetch failure) numbers its
tasks from 0 again, and may re-run a task whose first run committed. Only the group offset is read: a
write id lives for one write, far less than ``offsets.retention.minutes``, so a missing offset means
"never committed". The producer of such an id is closed when its task ends: nothing uses the id again.

Where the steps live: the marker topic, an id's marker partition and the reading of markers in `markers`; the
driver's checks before any task in `startup_checks`; rows to Kafka messages in `rows`; the driver's reports in
`reports`; Spark's writer classes in `writers`; at_least_once and none, which write outside transactions, in
`without_transactions`. Steps 3 and 4 of a task are `write_exactly_once` below.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from pyspark import TaskContext

from .... import failpoints
from ...client_cache import ClientCache, ClientCallStuck, call_with_deadline
from ...two_phase_commit import checkpoint_behind
from ...visible_latency import TimestampTally
from ..cluster import WARMUP_TIMEOUT_S, connect_to_a_known_broker
from ..options import PRODUCER_CACHE_TIMEOUT, PRODUCER_TIMEOUT_ENV, SinkOptions
from .markers import MarkerReader
from .reports import SinkCommit
from .rows import RecordDigest, Rows, produce

log = logging.getLogger("sparkeos.sink")

# The marker offset at a transaction's start: AddOffsetsToTxn and TxnOffsetCommit, quick when the cluster is up.
# librdkafka (2.16 and earlier) can wait forever in send_offsets_to_transaction, past its timeout, for a group
# coordinator it cached before the broker went away (confluentinc/librdkafka#5456, #5511): a running query whose
# broker was killed -9 and restarted stalled there every time. So the call gets this long, plus a grace for
# librdkafka to report its own timeout first; then the producer is abandoned and a new one, whose coordinator cache
# is empty, starts the transaction again.
BEGIN_TIMEOUT_S = 15.0
# Step 4: how long a cached producer waits for T's marker offset to be stable. A pending offset is another producer's
# open transaction: that producer called init_transactions after this one's last transaction, and so fenced it; if it
# died in the middle of the transaction, nothing but a new producer's init_transactions (or Kafka's transaction
# timeout) ends it.
CACHED_MARKER_READ_S = 2.0
STUCK_CALL_GRACE_S = 5.0
# A failed transaction's abort: librdkafka waits for records whose Produce answer was lost until they time out
# (as long as the transaction timeout), which the next producer's init_transactions does not need.
ABORT_TIMEOUT_S = 5.0
# Input a task holds in memory while its writer is set up: enough to keep the input moving through a set-up,
# bounded so that a task's memory stays small.
READ_AHEAD_BYTES = 64 * 1024 * 1024


class _TransactionalWriter(MarkerReader):
    """One transactional.id's producer and marker reader, cached per Python worker."""

    def __init__(self, options: SinkOptions, transactional_id: str, query_id: str | None, marker_partitions: int):
        config = options.producer_config()
        config["transactional.id"] = transactional_id
        # Only a record that failed calls back: a commit that fails because Kafka refused records (a topic the
        # principal may not write) then names Kafka's error, not only librdkafka's
        # "N message(s) failed delivery".
        # A closure over the list, not a bound method: the producer would hold the writer in a reference cycle,
        # and a writer whose set-up failed would wait for the cyclic collector, threads and sockets with it.
        failed: list[KafkaError] = []
        self.failed_deliveries = failed
        config["delivery.report.only.error"] = True
        config["on_delivery"] = lambda error, _message: failed.append(error) if error is not None else None
        self.producer = Producer(config)
        super().__init__(options, transactional_id, query_id, marker_partitions)
        self.stuck = False  # a producer call never returned: the producer must not be closed
        self.last_commit: tuple[str | None, int] | None = None  # (query, batch) of this producer's last commit
        # A coordinator lookup before the producer reached a known broker could wait out a retry timer of
        # librdkafka; after two metadata requests (the first can still go out on the bootstrap connection), none
        # did.
        connect_to_a_known_broker(self.producer, 2, WARMUP_TIMEOUT_S, f"the producer of {transactional_id}")
        # Step 3: a new producer of T fences every older one and aborts T's open transaction, if any.
        self.producer.init_transactions(self.timeout_s)

    def close(self) -> None:
        # Explicitly, not on garbage collection: a traceback may keep this object, and with it the
        # producer's threads and connections, alive for as long as the worker lives.
        super().close()
        if self.stuck:
            # Closing would wait for the call that never returned. The producer is fenced by its successor.
            log.warning("abandoning the producer of %s: a call into it never returned", self.transactional_id)
            return
        self.producer.purge()
        self.producer.close()

    def refused_records(self) -> str | None:
        """What the brokers answered to the records of this transaction they refused, if they refused any (not
        librdkafka's own errors: a timeout, a purge, a fenced producer)."""
        with contextlib.suppress(KafkaException):  # a fenced producer raises its fatal error instead
            self.producer.poll(0)  # serves the reports of the failed records
        refused = [error for error in self.failed_deliveries if error.code() > 0]
        if not refused:
            return None
        return f"Kafka refused {len(refused)} record(s): {refused[0]}"

    def begin(self, batch: int, query_id: str | None) -> None:
        """Step 4: open the transaction with the marker offset first, a synchronous round trip that fails here,
        before any record is produced, if another producer of this id has fenced us."""
        self.failed_deliveries.clear()
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

    def write_and_commit(self, batch: int, query_id: str | None, batches: Iterator[pa.RecordBatch],
                         records_by_topic: dict[str, int] | None = None,
                         timestamps: TimestampTally | None = None) -> tuple[int, float]:
        """Step 3, in the open transaction: the records, then the marker record, then the commit (step 2: the
        marker commits with the records, or neither does). Returns (records, seconds the commit took); counts
        the records by topic into `records_by_topic`, and their timestamps into `timestamps`."""
        digest = RecordDigest()
        for arrow_batch in batches:
            if timestamps is not None:
                timestamps.add(arrow_batch)
            rows = Rows(arrow_batch, self.options.topic)
            rows.produce_all(self.producer)
            digest.add(rows)
            if records_by_topic is not None:
                rows.count_by_topic(records_by_topic)
        records = digest.records
        # The marker record goes last, so it holds back the marker partition's LSO only for the commit. Its count
        # and digest let a replay that finds the batch committed check that it was given the same records.
        marker = {"transactional_id": self.transactional_id, "batch": batch, "records": records, "query_id": query_id,
                  "digest": digest.hex}
        # The data may have filled the producer's queue: wait for room, as for the records themselves.
        produce(self.producer, {"topic": self.marker.topic, "key": self.marker_key.encode(),
                                "value": json.dumps(marker).encode(), "partition": self.marker.partition})
        failpoints.fire("sink.before_commit")
        committing = time.monotonic()
        self.producer.commit_transaction(self.timeout_s)
        self.last_commit = (query_id, batch)
        return records, time.monotonic() - committing

    def superseded(self, query_id: str | None, committed: int | None) -> bool:
        """Step 4: whether the marker shows a commit of T newer than this producer's last: another producer of T,
        which fenced this one when it called init_transactions before committing."""
        return self.last_commit is not None and self.last_commit != (query_id, committed)

    def abort_quietly(self) -> None:
        """Abort the open transaction of a producer about to be discarded, so that read_committed consumers need
        not wait for the next producer of T to abort it; a bounded wait, since that next producer would."""
        try:
            self.producer.abort_transaction(ABORT_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("aborting the transaction of %s failed (the next producer of the id aborts it): %s",
                        self.transactional_id, exc)


_writers: ClientCache[_TransactionalWriter] = ClientCache(64, _TransactionalWriter.close, PRODUCER_TIMEOUT_ENV,
                                                          PRODUCER_CACHE_TIMEOUT)


def write_exactly_once(options: SinkOptions, transactional_id: str, batch: int, query_id: str | None,
                       marker_partitions: int, batches: Iterator[pa.RecordBatch],
                       one_write_id: bool = False) -> SinkCommit:
    """Steps 3 and 4 of the protocol for one task. `one_write_id`: the id of a batch write, used by this write
    only; its marker is the group offset alone, and its producer is closed afterwards."""
    partition = TaskContext.get().partitionId()
    # The topic too: it names the markers (markers.marker_key), and one worker may write T of one query to two
    # topics (a copied checkpoint).
    key = (transactional_id, query_id, options.topic, json.dumps(options.producer_config(), sort_keys=True))
    scan_records = not one_write_id

    def create() -> _TransactionalWriter:
        return _TransactionalWriter(options, transactional_id, query_id, marker_partitions)

    def put_back(writer: _TransactionalWriter) -> None:
        _writers.release(writer)
        if one_write_id:
            _writers.forget(writer)

    # Steps 3 and 4: the worker's producer for T, T's marker and the transaction's start, while the task waits for
    # its first input and then reads ahead.
    writer, committed, began, buffered = _set_up_while_reading_ahead(key, create, put_back, batch, query_id,
                                                                     scan_records, batches)
    try:
        if committed is not None and committed > batch:
            raise checkpoint_behind(query_id, batch, committed, f"the marker of {transactional_id}")
        if buffered is None:
            # Empty tasks write no transaction at all. One whose marker shows this batch is a replay that gave the
            # records it committed to another task, which has not committed the batch and would write them again.
            if committed == batch:
                _check_replay(writer, query_id, batch, partition, RecordDigest())
            return SinkCommit(partition, batch, 0, False, transactional_id)
        pending = itertools.chain(buffered, batches)
        # Step 3: if the marker of this query is >= B, (B, p) is already committed: consume and write nothing, once
        # the replay is known to give this task the records it committed.
        if began is None:
            skipped = RecordDigest()
            for arrow_batch in pending:
                skipped.add(Rows(arrow_batch, options.topic))
            if committed == batch:
                _check_replay(writer, query_id, batch, partition, skipped)
            log.info("%s already committed batch %d (marker %d); skipping %d records", transactional_id, batch,
                     committed, skipped.records)
            return SinkCommit(partition, batch, skipped.records, True, transactional_id)
        # Step 3: the records, then the marker record, then the commit.
        by_topic: dict[str, int] = {}
        timestamps = TimestampTally()
        try:
            records, commit_seconds = writer.write_and_commit(batch, query_id, pending, by_topic, timestamps)
        except KafkaException as exc:
            # Step 3: any error aborts the transaction, discards the producer and fails the task. A fenced or
            # fatally failed producer has nothing to abort.
            error = exc.args[0] if exc.args else None
            refused = writer.refused_records()
            aborted = isinstance(error, KafkaError) and error.txn_requires_abort()
            if aborted:
                writer.abort_quietly()
            _writers.forget(writer)
            _raise_if_timed_out(options, transactional_id, time.monotonic() - began, exc)
            if refused is not None:
                outcome = "failed and was aborted" if aborted else "failed"
                raise RuntimeError(f"the transaction of {transactional_id} {outcome}: {refused}") from exc
            raise
        except BaseException:
            writer.abort_quietly()
            _writers.forget(writer)
            raise
        visible = timestamps.latencies(time.time())
        failpoints.fire("sink.after_commit")
        return SinkCommit(partition, batch, records, False, transactional_id, by_topic, commit_seconds,
                          visible_latency=visible)
    finally:
        put_back(writer)


def _set_up_while_reading_ahead(key: tuple, create: Callable[[], _TransactionalWriter],
                                put_back: Callable[[_TransactionalWriter], None], batch: int, query_id: str | None,
                                scan_records: bool, batches: Iterator[pa.RecordBatch]
                                ) -> tuple[_TransactionalWriter, int | None, float | None, list[pa.RecordBatch] | None]:
    """Step 3's producer and marker, and step 4's start of the transaction, in a thread; then (writer, last committed
    batch, when the transaction began or None if (B, p) is already committed or the task has no input, the batches
    read meanwhile or None for a task without input). The producer and the marker are set up while the task waits
    for its first input (upstream work, and the source's reader, run in the same task); the transaction begins only
    once the input has a row, so that an empty task begins none; the task reads ahead meanwhile. No record is
    produced before the transaction began."""
    has_rows = threading.Event()
    decided = threading.Event()  # has_rows is final

    def writer_marker_and_transaction() -> tuple[_TransactionalWriter, int | None, float | None]:
        # Step 3: the worker's producer for T (a new one runs init_transactions), then T's marker.
        created: list[_TransactionalWriter] = []

        def create_here() -> _TransactionalWriter:
            created.append(create())
            return created[-1]

        writer = _writers.acquire(key, create_here)
        try:
            if created:
                committed, stale = writer.last_committed_batch(query_id, scan_records=scan_records), False
            else:
                try:
                    committed = writer.last_committed_batch(query_id, scan_records=scan_records,
                                                            timeout_s=CACHED_MARKER_READ_S)
                    stale = writer.superseded(query_id, committed)
                except (KafkaException, TimeoutError):
                    # Step 4: T's marker offset stayed pending: another producer's open transaction.
                    committed, stale = None, True
            if stale:
                # Step 4: another producer committed T since this cached one did, or has a transaction open, and so
                # fenced it. The usual case in a streaming query: Spark hands a partition's next task to whichever
                # idle worker is first in its queue, seldom the one that ran the last. Replaced here, while the
                # task reads ahead, not after a transaction's first call failed on it (which librdkafka logs as
                # fatal).
                _writers.forget(writer)
                writer = _writers.acquire(key, create)
                committed = writer.last_committed_batch(query_id, scan_records=scan_records)
            decided.wait()
            for attempt in range(2):
                # Step 3: if the marker of this query is >= B, (B, p) is already committed.
                if not has_rows.is_set() or (committed is not None and committed >= batch):
                    return writer, committed, None
                # Step 4: the transaction starts with the marker offset, before any record is produced.
                try:
                    began = time.monotonic()
                    writer.begin(batch, query_id)
                    return writer, committed, began
                except (KafkaException, ClientCallStuck):
                    # Step 4: fenced (another worker initialised this id since we cached the producer), broken or
                    # stuck: a new producer fences the others, and the marker is read again under its epoch.
                    _writers.forget(writer)
                    if attempt == 1:
                        raise
                    writer = _writers.acquire(key, create)
                    committed = writer.last_committed_batch(query_id, scan_records=scan_records)
            raise AssertionError("unreachable: the last attempt returns or raises")
        except BaseException:
            put_back(writer)
            raise

    def put_back_unused(setting_up: Future) -> None:
        if setting_up.exception() is None:
            writer, _committed, began = setting_up.result()
            if began is not None:
                # Step 3: the input failed after the transaction began: abort it, and never use the producer again.
                writer.abort_quietly()
                _writers.forget(writer)
            put_back(writer)

    setting_up: Future = Future()

    def set_up() -> None:
        try:
            setting_up.set_result(writer_marker_and_transaction())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the task's thread
            setting_up.set_exception(exc)

    # A daemon thread: a set-up stuck on an unreachable cluster must not hold up the worker's exit.
    threading.Thread(target=set_up, name="sparkeos-sink-setup", daemon=True).start()
    try:
        first = _first_with_rows(batches)
        if first is not None:
            has_rows.set()
        decided.set()
        # Nothing to write: the set-up read the marker and began no transaction.
        buffered = _read_ahead(first, batches, setting_up, READ_AHEAD_BYTES) if first is not None else None
    except BaseException:
        # The input failed: the task fails now, not after the set-up, whose writer goes back to the cache unused.
        decided.set()
        setting_up.add_done_callback(put_back_unused)
        raise
    writer, committed, began = setting_up.result()
    return writer, committed, began, buffered


def _first_with_rows(batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch | None:
    for batch in batches:
        if batch.num_rows:
            return batch
    return None


class ReplayDiffers(RuntimeError):
    """A replayed task whose marker shows the batch committed was given other records than it committed."""


def _check_replay(writer: _TransactionalWriter, query_id: str | None, batch: int, partition: int,
                  replayed: RecordDigest) -> None:
    """Step 3's skip is right only if the replay gives task (B, p) the records it committed: compare the count and
    digest of the replay's input with the marker's."""
    marker = writer.committed_marker(query_id, batch)
    if marker is None or "digest" not in marker:
        # Written by an older sparkeos: without a digest, or keyed T alone and compacted away since by another
        # query's markers under the same T.
        log.warning("%s committed batch %d, and Kafka no longer holds its marker record's count: the replay's input "
                    "cannot be compared with it", writer.transactional_id, batch)
        return
    if marker["records"] == replayed.records and marker["digest"] == replayed.hex:
        return
    raise ReplayDiffers(
        f"the replay of batch {batch} differs from what {writer.transactional_id} committed for it: task {partition} "
        f"is given {replayed.records} records (digest {replayed.hex}), the commit holds {marker['records']} (digest "
        f"{marker['digest']}). Skipping the task would leave the committed records where the replay has others, and "
        "writing it would add them again; tasks of the replay that had not committed the batch write regardless, "
        "so the output may already hold some of their records twice, or lack some. A replay must give each task the "
        "records the batch first gave it: restart "
        "with the transformation and the partitioning the batch ran with (sparkeos.kafka keeps its own plan; for other "
        "sources pin what splits their input, e.g. spark.sql.files.maxPartitionBytes and the cores of a file source, "
        "and the sink's input partitions: spark.sql.shuffle.partitions is kept by the checkpoint, repartition() "
        "counts are not), without unseeded rand(), uuid(), or repartitionByRange/orderBy before the sink, which "
        "sample their input anew in each run. See docs/exactly-once.md, \"What a replay must reproduce\"."
    )


def _read_ahead(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch], setting_up: Future,
                max_bytes: int) -> list[pa.RecordBatch]:
    """The input batches that arrive while the task's writer is set up (up to `max_bytes`).

    Setting up (a producer's init_transactions, the marker scan, the first round trip of the transaction) takes a
    new query's task a noticeable while; meanwhile Spark's feed of this task's input, and with it the source's
    reader upstream in the same task, would stand still."""
    buffered, size = [first], first.nbytes
    while not setting_up.done() and size < max_bytes:
        batch = next(rest, None)
        if batch is None:
            break
        buffered.append(batch)
        size += batch.nbytes
    return buffered


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
