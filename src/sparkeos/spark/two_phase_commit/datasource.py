"""A Spark data source for a two-phase-commit sink: the sink says how to build itself, this does the rest."""

from __future__ import annotations

from abc import abstractmethod
from collections import Counter

from pyspark.sql.datasource import DataSource, DataSourceWriter
from pyspark.sql.types import StructType

from ..checkpoint_target import claim_checkpoint
from ..gc_pause import freeze_planner_worker_once
from ..options import batch_write_id
from .sink import TwoPhaseCommitSink
from .writers import TwoPhaseCommitBatchWriter, TwoPhaseCommitStreamWriter, refuse_complete_mode

CONTROL_LOCATION_OPTION = "controlLocation"


class TwoPhaseCommitDataSource(DataSource):
    """Streams (append mode) and batch writes (``mode("append")``, with an optional ``writeId``) into the sink that
    ``sink(schema)`` builds from ``self.options``, checked before the query writes. A subclass names itself
    (``name()``) and may say how to read what it wrote (``read_hint``). A sink that leaves its attempts and decisions
    to the framework and sets no ``control_location`` of its own keeps them where the option ``controlLocation``
    says, which is then required."""

    read_hint = "read what it wrote with the reader of its store"
    # The failpoint (sparkeos.failpoints) where a batch is half committed: its decision recorded, its first
    # transaction committed and the others not yet. `sparkeos chaos` kills the driver there.
    half_committed_step = "2pc.between_commits"
    # Where a task is in the middle of its transaction: pre-committed, its commit message not yet sent to the driver
    # (which never learns of it if the task dies there). `sparkeos chaos` kills the task's Python worker or executor
    # there.
    task_transaction_step = "2pc.task_pre_committed"
    batch_writer: type[TwoPhaseCommitBatchWriter] = TwoPhaseCommitBatchWriter

    @classmethod
    def operator_sink(cls, options: dict[str, str]) -> TwoPhaseCommitSink:
        """The sink at the target ``options`` name, for ``sparkeos sinks`` (no schema: it only lists and aborts)."""
        raise NotImplementedError(f"{cls.name()} offers no sparkeos sinks")

    @classmethod
    def operator(cls, options: dict[str, str]):
        """``sparkeos sinks`` for the target ``options`` name."""
        from ..pending_work import TwoPhaseCommitOperator

        return TwoPhaseCommitOperator(cls.operator_sink(options))

    @classmethod
    def left_pending(cls, options: dict[str, str]) -> list[str]:
        """What the sink at the target ``options`` name holds neither published nor discarded (``sparkeos sinks
        pending``), in words."""
        return [f"{work.kind} {work.name} of query {work.query}, batch {work.batch}"
                + (" (decided)" if work.decided else "") for work in cls.operator(options).list_pending()]

    @classmethod
    def target_beside(cls, options: dict[str, str], prefix: str) -> tuple[dict[str, str], str]:
        """A target of a run's own beside the one ``options`` name, its name behind ``prefix`` (``sparkeos chaos
        --use-job-endpoints``): the options that change, and the target in words; ValueError when there is no such
        place."""
        raise ValueError(f"{cls.name()} does not say where a target beside its own would be")

    @classmethod
    def visible_records(cls, options: dict[str, str]) -> Counter[str] | None:
        """What a reader of the target ``options`` name sees now (``sparkeos.spark.reader_view``); none when the
        sink does not say how its store is read."""
        return None

    @abstractmethod
    def sink(self, schema: StructType) -> TwoPhaseCommitSink:
        """The sink for rows of ``schema`` at the target ``self.options`` name, ready to write (checked, prepared)."""

    def schema(self) -> StructType:
        raise ValueError(f"{self.name()} is a sink: {self.read_hint}")

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError(f"the {self.name()} sink adds to what it holds; use mode('append'), not overwrite")
        write_id = batch_write_id(self.options, self.name(), streaming=False)
        return self.batch_writer(self._ready_sink(schema), write_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseCommitStreamWriter:  # noqa: N802 - Spark's
        refuse_complete_mode(self.name(), overwrite)
        batch_write_id(self.options, self.name(), streaming=True)
        freeze_planner_worker_once()
        sink = self._ready_sink(schema)
        claim_checkpoint(self.options, self.name(), sink.checkpoint_target())
        return TwoPhaseCommitStreamWriter(sink)

    def _ready_sink(self, schema: StructType) -> TwoPhaseCommitSink:
        sink = self.sink(schema)
        if not sink.needs_control_location():
            return sink
        if not sink.control_location:
            sink.control_location = self.options.get(CONTROL_LOCATION_OPTION, "").strip()
            if not sink.control_location:
                raise ValueError(
                    f"the {self.name()} sink needs the option {CONTROL_LOCATION_OPTION}: a directory that the driver "
                    "and every executor reach (a path, or an s3:// or hdfs:// URI), where the sink's task attempts "
                    "and batch decisions are recorded; keep it for as long as the query's checkpoint"
                )
        sink.control()
        return sink
