"""Spark's stream and batch writers for a two-phase-commit sink: they run the protocol and report each batch."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from .. import metric_events
from ..gc_pause import cyclic_gc_paused
from ..reports import report, report_level
from ..visible_latency import LatencyHistogram
from .handles import Decision, Handle
from .protocol import PreCommitted, abort_batch, commit_batch, task_attempt, write_task
from .sink import TwoPhaseCommitSink


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


def run_batch(sink: TwoPhaseCommitSink, query: str) -> tuple[int, bool]:
    """The batch a run of a batch write under a writeId writes, and whether the write is published already: 0 at
    first; after a run that published, that run's batch again (its decision holds); after runs that failed and
    published nothing, the batch after theirs."""
    decisions = sink.decision_log(query)
    latest = decisions.latest()
    if latest is None:
        return 0, False
    decision = decisions.read(latest)
    if decision is not None and not decision.handles:
        return latest + 1, False
    return latest, True


class TwoPhaseCommitBatchWriter(DataSourceArrowWriter):
    """Spark's batch writer (``df.write``) for a :class:`TwoPhaseCommitSink`: one write is one batch, numbered 0,
    of a query named by the user's ``writeId``, or by a write id drawn on the driver."""

    def __init__(self, sink: TwoPhaseCommitSink, write_id: str | None = None):
        report_level()
        self.sink = sink
        self.write_id = write_id
        self.query = f"write-{write_id or uuid.uuid4().hex[:16]}"
        self.batch, self.published = (0, False) if write_id is None else run_batch(sink, self.query)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreCommitted:
        task = task_attempt(self.query, self.batch)
        if self.published:  # run again after a run that published: its decision holds, and this run adds nothing
            for _rows in iterator:  # read to its end all the same, or Spark's Python worker is not reused
                pass
            return PreCommitted(task.query, task.batch, task.partition, None)
        with cyclic_gc_paused():
            return write_task(self.sink, task, iterator, batch_write=True)

    def commit(self, messages: list) -> None:
        handles = _handles(messages)
        started = time.monotonic()
        decision = commit_batch(self.sink, self.query, self.batch, handles)
        if handles and not decision.handles:
            raise RuntimeError(
                f"write {self.query} published nothing: another run of writeId {self.write_id} failed while this one "
                f"ran, and its abort closed batch {self.batch} of the write; this run's transactions were aborted. "
                "Run the write again.")
        report(logging.INFO, _summary(self.sink, decision, handles))
        _emit_commit(self.sink, self.query, self.batch, decision, messages, time.monotonic() - started)

    def abort(self, messages: list) -> None:
        aborted = abort_batch(self.sink, self.query, self.batch, _handles(messages))
        metric_events.sink_batch(self.sink.format_name, self.query, self.batch, "aborted", aborted=aborted)
        # No later batch will finish a decision this write failed after, nor abort what its failed and cancelled
        # tasks left (Spark's messages do not name them): steps 4-7 for the write, now. Tasks Spark cancelled may
        # still run: the decision without handles recorded here tells them to abort what they pre-commit.
        decision = commit_batch(self.sink, self.query, self.batch, [], aborting_write=True)
        if decision.handles:
            report(logging.WARNING, f"write {self.query} failed after its decision: published as decided "
                                    f"({len(decision.handles)} transactions), though Spark reports the write failed")
        else:
            report(logging.WARNING, f"write {self.query} aborted by Spark: {aborted} pre-committed transactions "
                                    "aborted, nothing published")
