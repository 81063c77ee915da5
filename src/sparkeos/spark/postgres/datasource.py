"""The `sparkeos.postgres` data source: rows into a PostgreSQL table, exactly once, from streams and batches."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceWriter
from pyspark.sql.types import StructType

from ..gc_pause import freeze_planner_worker_once
from ..two_phase_commit import TwoPhaseCommitBatchWriter, TwoPhaseCommitStreamWriter, commit_batch, refuse_complete_mode
from .options import parse_postgres_sink_options
from .sink import PostgresSink


class PostgresBatchWriter(TwoPhaseCommitBatchWriter):
    """A batch write is never run again under its write id, so nothing that is left of it would ever be resolved
    by a later commit: its end resolves everything of it, and drops its decision."""

    def commit(self, messages: list) -> None:
        super().commit(messages)
        self.sink.forget(self.query)

    def abort(self, messages: list) -> None:
        super().abort(messages)
        # Tasks that failed or were cancelled may have prepared transactions that Spark's messages do not name;
        # and a write that failed after its decision was recorded is published as decided (the decision is final).
        commit_batch(self.sink, self.query, 0, [])
        self.sink.forget(self.query)


class PostgresDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sparkeos.postgres"

    def schema(self) -> StructType:
        raise ValueError("sparkeos.postgres is a sink: read its table with any PostgreSQL client, or with Spark's "
                         "jdbc data source")

    def _sink(self, schema: StructType) -> PostgresSink:
        sink = PostgresSink(parse_postgres_sink_options(self.options), schema)
        sink.prepare()
        return sink

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("the sparkeos.postgres sink adds rows to its table; use mode('append'), not overwrite")
        return PostgresBatchWriter(self._sink(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseCommitStreamWriter:
        refuse_complete_mode(self.name(), overwrite)
        freeze_planner_worker_once()
        return TwoPhaseCommitStreamWriter(self._sink(schema))
