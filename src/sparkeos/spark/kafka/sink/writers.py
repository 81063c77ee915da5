"""The classes Spark calls for a `sparkeos.kafka` write: a streaming query's writer and a batch write's.

Each task writes with the protocol of its deliveryGuarantee; the driver's commit and abort only report.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from .... import failpoints
from ...gc_pause import cyclic_gc_paused
from ...reports import report, report_level
from ...task_context import spark_task, streaming_task
from ..options import SinkOptions
from .protocol import write_exactly_once
from .reports import SinkCommit, emit_abort, emit_commit, report_commit
from .without_transactions import write_without_transactions


def _query_of(messages: list) -> str | None:
    return next((m.query_id for m in messages if isinstance(m, SinkCommit) and m.query_id), None)


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, marker_partitions: int):
        report_level()  # a bad SPARKEOS_LOG_LEVEL fails the query at its start, not at its first commit
        self.options = options
        self.marker_partitions = marker_partitions

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        query_id, batch, partition = streaming_task()
        with cyclic_gc_paused():
            if self.options.delivery_guarantee != "exactly_once":
                done = write_without_transactions(self.options, batch, iterator)
            else:
                prefix = self.options.transactional_id_prefix or f"sparkeos-{query_id}"
                done = write_exactly_once(self.options, f"{prefix}-{partition}", batch, query_id,
                                          self.marker_partitions, iterator)
        done.query_id = query_id
        return done

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 - Spark's signature
        failpoints.fire("sink.driver_commit")
        report(logging.INFO, report_commit(messages, batchId, self.options.delivery_guarantee))
        emit_commit(messages, _query_of(messages), batchId)

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803 - Spark's signature
        emit_abort(_query_of(messages), batchId)
        done = [m for m in messages if isinstance(m, SinkCommit)]
        report(logging.WARNING, f"batch {batchId} aborted by Spark: {len(done)} of {len(messages)} tasks had finished; "
                                "Spark re-runs the batch and tasks whose marker shows it committed write nothing")


class KafkaBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, marker_partitions: int, write_id: str | None = None):
        report_level()
        self.options = options
        self.marker_partitions = marker_partitions
        # A writeId names a write the user may run again: its markers must be found whenever that is, so they are
        # read as a streaming query's are (group offsets, then the marker records). A drawn id is used once.
        self.named = write_id is not None
        self.write_id = write_id or uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        partition = spark_task().partitionId()
        with cyclic_gc_paused():
            if self.options.delivery_guarantee != "exactly_once":
                return write_without_transactions(self.options, 0, iterator)
            prefix = self.options.transactional_id_prefix or "sparkeos"
            return write_exactly_once(self.options, f"{prefix}-{self.write_id}-{partition}", 0, None,
                                      self.marker_partitions, iterator, one_write_id=not self.named)

    def commit(self, messages: list) -> None:
        report(logging.INFO, report_commit(messages, 0, self.options.delivery_guarantee))
        emit_commit(messages, None, 0)

    def abort(self, messages: list) -> None:
        done = len([m for m in messages if isinstance(m, SinkCommit)])
        report(logging.WARNING, f"write {self.write_id} aborted by Spark after {done} tasks finished")
