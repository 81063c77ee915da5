"""The protocol's steps, numbered as in the package's docstring: tasks' steps 1-3, the driver's 0 and 4-7, and
Spark's abort."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from ... import failpoints
from ..reports import log
from ..task_context import spark_task, streaming_task
from ..visible_latency import TimestampTally
from .attempt_journal import STRAGGLER_GRACE_S, AttemptJournal
from .decision_log import DecisionLog
from .handles import Decision, Handle, TaskAttempt
from .sink import TwoPhaseCommitSink

RETAINED_DECISIONS = 100  # Spark's spark.sql.streaming.minBatchesToRetain: replays reach no further back


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


class AttemptAborted(RuntimeError):
    """The driver aborted this task attempt while it ran: its batch was decided without it."""


def write_task(sink: TwoPhaseCommitSink, task: TaskAttempt, batches: Iterator[pa.RecordBatch],
               batch_write: bool = False) -> PreCommitted:
    """Steps 1-3 for one task attempt; in a batch write, with the check that no decision was made without it."""
    transaction = None
    journal: AttemptJournal | None = None
    timestamps = TimestampTally()
    try:
        for rows in batches:
            if rows.num_rows == 0:
                continue
            if transaction is None:
                failpoints.fire("2pc.task_beginning")
                # 1. begin, at the first row: a task without rows holds no transaction at all. An attempt the sink
                # cannot list in its store is journaled first, so that whatever it leaves can be found and aborted.
                journal = sink.attempt_journal(task.query)
                if journal is not None:
                    journal.begin(task)
                transaction = sink.begin_transaction(task)
            # 2. invoke
            sink.invoke(transaction, rows)
            timestamps.add(rows)
        if transaction is None:
            return PreCommitted(task.query, task.batch, task.partition, None)
        # 3. pre-commit
        failpoints.fire("2pc.task_pre_committing")
        handle = sink.pre_commit(transaction, task)
        if journal is not None and not journal.holds(task.handle_id):
            # A straggler (a speculative copy not killed yet): the driver decided the batch without it and aborted
            # it while it wrote, maybe before this pre-commit, so what it pre-committed is its own to abort.
            sink.abort(task.query, task.handle_id)
            raise AttemptAborted(f"task attempt {task.handle_id} of query {task.query} was aborted by the driver "
                                 "while it ran: its batch was decided without it")
        if batch_write:
            _abort_if_decided_without(sink, task, handle)
    except BaseException:
        if transaction is not None:
            try:
                sink.abort_transaction(transaction)
            except Exception:  # the task's own error is the one to report
                log.exception("aborting the transaction of task %s failed", task.handle_id)
        raise
    failpoints.fire("2pc.task_pre_committed")
    return PreCommitted(task.query, task.batch, task.partition, handle, timestamps if timestamps.counts else None)


def _abort_if_decided_without(sink: TwoPhaseCommitSink, task: TaskAttempt, handle: Handle) -> None:
    """A batch write's straggler (a task Spark cancelled, still running): the driver decided the write, or aborted
    it, and listed what to abort before this pre-commit. No later batch would abort it, so it aborts itself. The
    driver records its decision before it lists, and this reads after pre-committing: one of the two sees the
    other."""
    decision = sink.decision_log(task.query).read(task.batch)
    if decision is None or handle.id in {h.id for h in decision.handles}:
        return
    sink.abort(task.query, task.handle_id)
    ended = "decided without it" if decision.handles else "aborted"
    raise AttemptAborted(f"task attempt {task.handle_id} of {task.query} pre-committed after the write was {ended}: "
                         "it aborted its own transaction")


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


def commit_batch(sink: TwoPhaseCommitSink, query: str, batch: int, handles: list[Handle],
                 aborting_write: bool = False) -> Decision:
    """Steps 4-7 for batch ``batch`` of ``query``; returns the decision that holds. ``aborting_write``: a failed
    batch write's, which records a decision without handles unless one holds already, for its stragglers to see."""
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
        # A batch without rows has nothing to publish, and its replay has none either.
        if handles:
            failpoints.fire("2pc.deciding")
        if handles or aborting_write:
            decision = decisions.record(decision)
    # 6. and 7. Commit every handle, mark the decision finished, abort the rest.
    if decision.handles:
        failpoints.fire("2pc.decided")
        _finish(sink, decisions, decision)
    elif aborting_write:
        decisions.finish(batch)
    named = {h.id for d in decisions.unfinished() for h in d.handles}
    journal = sink.attempt_journal(query)
    ended = {h.id for h in handles}  # their commit messages reached the driver: those attempts are over
    for handle_id, handle_batch in list(sink.pending(query)):
        if handle_batch <= batch and handle_id not in named:
            discard(sink, query, handle_id, journal, attempt_ended=handle_id in ended)
    decisions.forget_before(batch - RETAINED_DECISIONS + 1)
    return decision


def _finish(sink: TwoPhaseCommitSink, decisions: DecisionLog, decision: Decision) -> None:
    journal = sink.attempt_journal(decision.query)
    for number, handle in enumerate(decision.handles):
        if number == 1:
            failpoints.fire("2pc.between_commits")
        sink.commit(handle)
        # Ended only once committed, and the decision marked finished only once every entry is ended: after a crash
        # the decision is unfinished and names the handle, so the entry is never taken for an attempt to abort.
        if journal is not None:
            journal.end(handle.id)
    failpoints.fire("2pc.committed")
    decisions.finish(decision.batch)


def discard(sink: TwoPhaseCommitSink, query: str, handle_id: str, journal: AttemptJournal | None = None,
            attempt_ended: bool = False) -> None:
    """Abort an attempt's transaction. Where the sink keeps a journal, an attempt that may still run is marked
    aborted first, and its entry kept until no attempt of it can run any more (``attempt_journal.py``); the entry
    of an attempt known to have ended goes right after the abort."""
    journal = journal or sink.attempt_journal(query)
    if journal is None:
        sink.abort(query, handle_id)
        return
    marked_at = None if attempt_ended else journal.mark_aborted(handle_id)
    sink.abort(query, handle_id)
    if attempt_ended or (marked_at is not None
                         and (datetime.now(UTC) - marked_at).total_seconds() >= STRAGGLER_GRACE_S):
        journal.end(handle_id)


def abort_batch(sink: TwoPhaseCommitSink, query: str, batch: int, handles: list[Handle]) -> int:
    """Abort the handles no decision names; returns how many were aborted."""
    # The commit that failed may have lost the answer to its decision's record, which may still be under way.
    decision = sink.decision_log(query).read_settled(batch)
    named = {h.id for h in decision.handles} if decision else set()
    aborted = 0
    journal = sink.attempt_journal(query)
    for handle in handles:
        if handle.id not in named:
            discard(sink, query, handle.id, journal, attempt_ended=True)
            aborted += 1
    return aborted
