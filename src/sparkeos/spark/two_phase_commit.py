"""Two-phase commit for Spark sinks: Flink's ``TwoPhaseCommitSinkFunction`` on Spark's Python Data Source API.

A sink implements :class:`TwoPhaseCommitSink` (where its transactions live and how one is begun, written,
pre-committed, committed and aborted, plus a :class:`DecisionLog`); :class:`TwoPhaseCommitStreamWriter` and
:class:`TwoPhaseCommitBatchWriter` run the protocol below for it. ``sparkeos.files`` is built on it.

Invariant
---------
For every micro-batch B of a query Q, the transactions that become visible are exactly those named by one
decision "Q's batch B commits handles H", which is made durable before any of them is committed and never
changes afterwards. Every other transaction pre-committed for B (failed, retried and speculative task attempts,
and every attempt of a replay of B that Spark runs after B was decided) is aborted, never committed.

Protocol
--------
Tasks, once per attempt of (B, partition p), on an executor:

1. ``begin_transaction``: open a transaction private to this attempt (a staged file, a database transaction).
2. ``invoke``: write the task's rows into it.
3. ``pre_commit``: make it durable but invisible, and return its :class:`Handle`, which reaches the driver in the
   task's commit message. An error in 1-3 aborts the attempt's transaction and fails the task; Spark retries it.

The driver, in ``commit(messages, B)`` once every task of B succeeded:

0. Refuse to go on if the log holds a decision of a batch above B: Spark runs B only after it logged B - 1
   committed, which it does only after this commit returned, so such a decision was made in a run whose checkpoint
   went further than this one's (restored, or copied while the query went on), and Spark has planned B anew.
4. Recover: finish every decision of Q that is not finished (a crash between steps 5 and 7 left it so).
5. Decide: if B already has a decision (Spark replays a batch it had not logged as committed when the driver
   died, after the sink had decided it), keep it; else record "B commits H", H the handles of ``messages``,
   unless another driver of Q recorded a decision of B first, which then holds.
6. Commit every handle of the decision. A commit is idempotent: after a crash it is repeated, and finds done what
   was done.
7. Mark the decision finished, then abort every transaction of Q the sink still holds for a batch <= B that no
   unfinished decision names (failed attempts, the replay's own handles, attempts of a driver that died), and
   forget decisions older than ``RETAINED_DECISIONS`` batches.

``abort(messages, B)``, which Spark calls when a task or the driver's commit failed, aborts the handles of
``messages`` unless a decision names them: a commit that failed after step 5 must leave its handles for step 4.

Why this is exactly once: only a decision publishes, a batch is decided once, and its handles are committed
until done (steps 4-6), whichever driver gets there; Spark re-runs B from its checkpointed input until B is in
its commit log, which Spark writes only after ``commit(messages, B)`` returned, so step 7 has happened by then.
What it needs from a sink: pre-committed work that survives the task and the driver (a file, a prepared database
transaction), a commit and an abort that can be repeated, and a decision log whose ``record`` is atomic.

Batch writes (``df.write``) run the same protocol with B = 0 and Q ``write-<id>``, the id the option ``writeId``
names or one drawn once per write. A write has no later batch to finish a decision it failed after: its ``abort``
finishes it (steps 4-7), so a failed write is never left half published. Run again under the same ``writeId``, a
write finds its decision and publishes nothing more.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from . import failpoints, metric_events
from .gc_pause import cyclic_gc_paused
from .reports import log, report, report_level
from .task_context import spark_task, streaming_task
from .visible_latency import LatencyHistogram, TimestampTally

RETAINED_DECISIONS = 100  # Spark's spark.sql.streaming.minBatchesToRetain: replays reach no further back

Transaction = TypeVar("Transaction")


@dataclass(frozen=True)
class TaskAttempt:
    """Where a task's transaction belongs: query, batch, Spark partition, and an id unique to this attempt."""

    query: str
    batch: int
    partition: int
    attempt: str

    @property
    def handle_id(self) -> str:
        return f"{self.batch}-{self.partition}-{self.attempt}"


@dataclass(frozen=True)
class Handle:
    """A pre-committed transaction: ``id`` names it among the sink's pending ones, ``data`` is what its commit needs
    (JSON-serialisable), ``records`` how many rows it holds."""

    id: str
    batch: int
    partition: int
    records: int = 0
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "batch": self.batch, "partition": self.partition, "records": self.records,
                "data": self.data}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Handle:
        return cls(value["id"], int(value["batch"]), int(value["partition"]), int(value.get("records", 0)),
                   dict(value.get("data") or {}))


@dataclass(frozen=True)
class Decision:
    """"Batch ``batch`` of ``query`` commits ``handles``": once recorded, final."""

    query: str
    batch: int
    handles: tuple[Handle, ...]

    def to_bytes(self) -> bytes:
        return json.dumps({"query": self.query, "batch": self.batch,
                           "handles": [h.to_json() for h in self.handles]}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Decision:
        value = json.loads(data)
        return cls(value["query"], int(value["batch"]), tuple(Handle.from_json(h) for h in value["handles"]))


class DecisionLog(ABC):
    """The durable record of one query's decisions."""

    @abstractmethod
    def read(self, batch: int) -> Decision | None:
        """The decision of ``batch``, if one was recorded (and not forgotten)."""

    def read_settled(self, batch: int) -> Decision | None:
        """``read``, once a ``record`` of ``batch`` that may still be under way (its caller lost the answer) has
        ended; what an abort reads before it discards handles. Where a record is atomic and immediate, ``read``."""
        return self.read(batch)

    @abstractmethod
    def record(self, decision: Decision) -> Decision:
        """Make ``decision`` durable, atomically (after a crash it is either wholly there or absent), unless a
        decision of its batch is there already; return the one that holds. Two drivers of one query may decide
        a batch at the same moment: the first decision recorded is the batch's, and is never replaced."""

    @abstractmethod
    def latest(self) -> int | None:
        """The highest batch with a recorded decision, finished or not (never forgotten: see ``forget_before``)."""

    @abstractmethod
    def unfinished(self) -> list[Decision]:
        """Recorded decisions not yet marked finished, oldest first."""

    @abstractmethod
    def finish(self, batch: int) -> None:
        """Mark the decision of ``batch`` finished: every handle of it is committed."""

    @abstractmethod
    def forget_before(self, batch: int) -> None:
        """Drop finished decisions of batches below ``batch``."""

    def recorded_at(self, batch: int) -> datetime | None:
        """When the decision of ``batch`` was recorded, where the log knows (for ``sparkeos sinks pending``)."""
        return None


class TwoPhaseCommitSink(ABC, Generic[Transaction]):
    """What a sink implements. Instances are pickled to executors: keep them small, open connections lazily."""

    format_name = "two-phase-commit"  # the data source's name (``sparkeos.files``), as metrics label the sink

    # --- executor side ---

    @abstractmethod
    def begin_transaction(self, task: TaskAttempt) -> Transaction:
        """Open a transaction private to this task attempt."""

    @abstractmethod
    def invoke(self, transaction: Transaction, rows: pa.RecordBatch) -> None:
        """Write ``rows`` into the transaction."""

    @abstractmethod
    def pre_commit(self, transaction: Transaction, task: TaskAttempt) -> Handle:
        """Make the transaction durable but invisible; return the handle the driver commits or aborts."""

    def abort_transaction(self, transaction: Transaction) -> None:  # noqa: B027 - optional for a sink
        """Discard a transaction whose task failed before ``pre_commit`` returned (best effort)."""

    # --- driver side ---

    @abstractmethod
    def commit(self, handle: Handle) -> None:
        """Make a pre-committed transaction visible. Idempotent: done again after a crash, it changes nothing."""

    @abstractmethod
    def abort(self, query: str, handle_id: str) -> None:
        """Discard a pre-committed transaction. Idempotent; a transaction that is gone is no error."""

    @abstractmethod
    def pending(self, query: str) -> Iterable[tuple[str, int]]:
        """The (handle id, batch) of every transaction of ``query`` the sink holds pre-committed or abandoned."""

    @abstractmethod
    def decision_log(self, query: str) -> DecisionLog:
        """Where the decisions of ``query`` are recorded."""

    def describe(self) -> str:
        """How the driver's reports name this sink."""
        return type(self).__name__

    # --- for operators (``sparkeos sinks``), optional ---

    def queries(self) -> Iterable[str]:
        """Every query that holds pre-committed transactions or unfinished decisions here."""
        raise NotImplementedError(f"{self.describe()} cannot list the queries it holds work of")

    def pending_details(self, query: str) -> dict[str, tuple[str, datetime | None]]:
        """For each handle id of ``pending(query)``: the name its store shows it under, and since when it is there."""
        return {}

    def fence(self, query: str) -> bool:
        """Stop every run of ``query`` that may still be writing from recording a decision, if the sink can; whether
        it did. Done before an operator aborts the query's transactions."""
        return False


class PreCommitted(WriterCommitMessage):
    """A task's commit message: its handle, or none when it had no rows, and its rows' timestamps."""

    def __init__(self, query: str, batch: int, partition: int, handle: Handle | None,
                 timestamps: TimestampTally | None = None):
        self.query = query
        self.batch = batch
        self.partition = partition
        self.handle = handle
        self.timestamps = timestamps


def task_attempt(query: str | None = None, batch: int | None = None) -> TaskAttempt:
    """This task's place: the streaming query's id and batch id unless both are given (a batch write's), its
    partition, a fresh attempt id."""
    if query is None or batch is None:
        query, batch, partition = streaming_task()
    else:
        partition = spark_task().partitionId()
    return TaskAttempt(query, batch, partition, uuid.uuid4().hex[:12])


def write_task(sink: TwoPhaseCommitSink, task: TaskAttempt, batches: Iterator[pa.RecordBatch]) -> PreCommitted:
    """Steps 1-3 for one task attempt."""
    transaction = None
    timestamps = TimestampTally()
    try:
        for rows in batches:
            if rows.num_rows == 0:
                continue
            if transaction is None:
                # 1. begin, at the first row: a task without rows holds no transaction at all.
                transaction = sink.begin_transaction(task)
            # 2. invoke
            sink.invoke(transaction, rows)
            timestamps.add(rows)
        if transaction is None:
            return PreCommitted(task.query, task.batch, task.partition, None)
        # 3. pre-commit
        handle = sink.pre_commit(transaction, task)
    except BaseException:
        if transaction is not None:
            try:
                sink.abort_transaction(transaction)
            except Exception:  # the task's own error is the one to report
                log.exception("aborting the transaction of task %s failed", task.handle_id)
        raise
    failpoints.fire("2pc.task_pre_committed")
    return PreCommitted(task.query, task.batch, task.partition, handle, timestamps if timestamps.counts else None)


class CheckpointBehindSink(RuntimeError):
    """Spark runs a batch below one the sink already committed for the query: its checkpoint went back."""


def checkpoint_behind(query: str, batch: int, latest: int, where: str) -> CheckpointBehindSink:
    return CheckpointBehindSink(
        f"{where} holds batch {latest} of query {query} committed, and Spark now runs batch {batch}: the query's "
        "checkpoint is behind its output (restored from a backup, or copied while the query went on). Spark plans "
        "the batches after its checkpoint anew, so taking them for the ones committed before would lose or double "
        "what the two plans differ by. Run the query from the checkpoint that wrote batch "
        f"{latest}; to write the output again, start it with a new checkpoint (a new query id)."
    )


def commit_batch(sink: TwoPhaseCommitSink, query: str, batch: int, handles: list[Handle]) -> Decision:
    """Steps 4-7 for batch ``batch`` of ``query``; returns the decision that holds."""
    decisions = sink.decision_log(query)
    # Spark runs no batch before it logged the previous one committed, which it does only after this returned: a
    # decision above ``batch`` was made in a run whose checkpoint went further than this one's.
    latest = decisions.latest()
    if latest is not None and latest > batch:
        raise checkpoint_behind(query, batch, latest, sink.describe())
    # 4. Recover: finish what an earlier commit decided and did not finish.
    for unfinished in decisions.unfinished():
        if unfinished.batch != batch:
            _finish(sink, decisions, unfinished)
    # 5. Decide, unless this batch was decided before.
    decision = decisions.read(batch)
    if decision is None:
        decision = Decision(query, batch, tuple(sorted(handles, key=lambda h: h.partition)))
        if handles:  # a batch without rows has nothing to publish, and its replay has none either
            failpoints.fire("2pc.deciding")
            decision = decisions.record(decision)
    # 6. and 7. Commit every handle, mark the decision finished, abort the rest.
    if decision.handles:
        failpoints.fire("2pc.decided")
        _finish(sink, decisions, decision)
    named = {h.id for d in decisions.unfinished() for h in d.handles}
    for handle_id, handle_batch in list(sink.pending(query)):
        if handle_batch <= batch and handle_id not in named:
            sink.abort(query, handle_id)
    decisions.forget_before(batch - RETAINED_DECISIONS + 1)
    return decision


def _finish(sink: TwoPhaseCommitSink, decisions: DecisionLog, decision: Decision) -> None:
    for number, handle in enumerate(decision.handles):
        if number == 1:
            failpoints.fire("2pc.between_commits")
        sink.commit(handle)
    failpoints.fire("2pc.committed")
    decisions.finish(decision.batch)


def abort_batch(sink: TwoPhaseCommitSink, query: str, batch: int, handles: list[Handle]) -> int:
    """Abort the handles no decision names; returns how many were aborted."""
    # The commit that failed may have lost the answer to its decision's record, which may still be under way.
    decision = sink.decision_log(query).read_settled(batch)
    named = {h.id for h in decision.handles} if decision else set()
    aborted = 0
    for handle in handles:
        if handle.id not in named:
            sink.abort(query, handle.id)
            aborted += 1
    return aborted


def _handles(messages: list) -> list[Handle]:
    return [m.handle for m in messages if isinstance(m, PreCommitted) and m.handle is not None]


def _query_of(messages: list) -> str | None:
    return next((m.query for m in messages if isinstance(m, PreCommitted)), None)


def _summary(sink: TwoPhaseCommitSink, decision: Decision, handles: list[Handle]) -> str:
    records = sum(h.records for h in decision.handles)
    text = (f"batch {decision.batch} committed ({sink.describe()}): {len(decision.handles)} transactions, "
            f"{records} records")
    if decision.handles and {h.id for h in handles}.isdisjoint(h.id for h in decision.handles):
        text += "; it had been decided before, so this run's transactions were aborted"
    return text


def _emit_commit(sink: TwoPhaseCommitSink, query: str, batch: int, decision: Decision, messages: list,
                 seconds: float) -> None:
    """The batch's event for the metrics exporter, right after the decision's commit made its records visible. A
    batch decided before (a replay) made nothing visible now: its own transactions were aborted, and count as
    skipped."""
    visible_at = time.time()
    handles = _handles(messages)
    decided_now = not decision.handles or not {h.id for h in handles}.isdisjoint(h.id for h in decision.handles)
    if decided_now:
        latency = LatencyHistogram()
        for message in messages:
            if isinstance(message, PreCommitted) and message.timestamps is not None:
                latency.add(message.timestamps.latencies(visible_at))
        metric_events.sink_batch(sink.format_name, query, batch, "committed", committed=len(decision.handles),
                                 records=sum(h.records for h in decision.handles), commit_seconds=[seconds],
                                 visible_latency=latency if latency.records else None)
    else:
        metric_events.sink_batch(sink.format_name, query, batch, "committed", skipped=len(handles),
                                 commit_seconds=[seconds])


def refuse_complete_mode(format_name: str, overwrite: bool) -> None:
    """Spark asks a Python stream writer to overwrite exactly in complete output mode (update mode it refuses itself
    for Python sinks). A two-phase-commit sink adds each batch's rows: the whole result table at every trigger
    would be added again and again, so the mode is refused when the query starts."""
    if overwrite:
        raise ValueError(
            f"the {format_name} sink cannot honour outputMode 'complete': it adds each batch's rows to what it holds, "
            "and complete mode hands it the whole result table at every trigger to replace it. Use "
            "outputMode('append') (with a watermark for an aggregation), or foreachBatch to replace the target "
            "yourself."
        )


class TwoPhaseCommitStreamWriter(DataSourceStreamArrowWriter):
    """Spark's stream writer for a :class:`TwoPhaseCommitSink`."""

    def __init__(self, sink: TwoPhaseCommitSink):
        report_level()  # a bad SPARKEOS_LOG_LEVEL fails the query at its start, not at its first commit
        self.sink = sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreCommitted:
        with cyclic_gc_paused():
            return write_task(self.sink, task_attempt(), iterator)

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 - Spark's signature
        query = _query_of(messages)
        if query is None:
            return
        handles = _handles(messages)
        started = time.monotonic()
        decision = commit_batch(self.sink, query, batchId, handles)
        report(logging.INFO, _summary(self.sink, decision, handles))
        _emit_commit(self.sink, query, batchId, decision, messages, time.monotonic() - started)

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803 - Spark's signature
        query = _query_of(messages)
        aborted = abort_batch(self.sink, query, batchId, _handles(messages)) if query else 0
        metric_events.sink_batch(self.sink.format_name, query, batchId, "aborted", aborted=aborted)
        report(logging.WARNING, f"batch {batchId} aborted by Spark: {aborted} pre-committed transactions aborted; "
                                "Spark re-runs the batch")


class TwoPhaseCommitBatchWriter(DataSourceArrowWriter):
    """Spark's batch writer (``df.write``) for a :class:`TwoPhaseCommitSink`: one write is one batch, numbered 0,
    of a query named by the user's ``writeId``, or by a write id drawn on the driver."""

    def __init__(self, sink: TwoPhaseCommitSink, write_id: str | None = None):
        report_level()
        self.sink = sink
        self.write_id = write_id
        self.query = f"write-{write_id or uuid.uuid4().hex[:16]}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreCommitted:
        with cyclic_gc_paused():
            return write_task(self.sink, task_attempt(self.query, 0), iterator)

    def commit(self, messages: list) -> None:
        handles = _handles(messages)
        started = time.monotonic()
        decision = commit_batch(self.sink, self.query, 0, handles)
        report(logging.INFO, _summary(self.sink, decision, handles))
        _emit_commit(self.sink, self.query, 0, decision, messages, time.monotonic() - started)

    def abort(self, messages: list) -> None:
        aborted = abort_batch(self.sink, self.query, 0, _handles(messages))
        metric_events.sink_batch(self.sink.format_name, self.query, 0, "aborted", aborted=aborted)
        # No later batch will finish a decision this write failed after, nor abort what its failed and cancelled
        # tasks left (Spark's messages do not name them): steps 4-7 for the write, now.
        decision = commit_batch(self.sink, self.query, 0, [])
        if decision.handles:
            report(logging.WARNING, f"write {self.query} failed after its decision: published as decided "
                                    f"({len(decision.handles)} transactions), though Spark reports the write failed")
        else:
            report(logging.WARNING, f"write {self.query} aborted by Spark: {aborted} pre-committed transactions "
                                    "aborted, nothing published")
