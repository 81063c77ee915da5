"""The `sparkeos.postgres` data source: rows into a PostgreSQL table, exactly once, from streams and batches."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceWriter
from pyspark.sql.types import StructType

from ..gc_pause import freeze_planner_worker_once
from ..options import batch_write_id
from ..two_phase_commit import TwoPhaseCommitBatchWriter, TwoPhaseCommitStreamWriter, refuse_complete_mode
from .options import parse_postgres_sink_options
from .sink import PostgresSink


class PostgresBatchWriter(TwoPhaseCommitBatchWriter):
    """A write without a writeId is never run again under its write id: its end drops its decision. One with a
    writeId keeps it, so that the write run again finds it and writes nothing twice."""

    def commit(self, messages: list) -> None:
        super().commit(messages)
        if self.write_id is None:
            self.sink.forget(self.query)

    def abort(self, messages: list) -> None:
        super().abort(messages)
        if self.write_id is None:
            self.sink.forget(self.query)


class PostgresDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sparkeos.postgres"

    def schema(self) -> StructType:
        raise ValueError("sparkeos.postgres is a sink: read its table with any PostgreSQL client, or with Spark's "
                         "jdbc data source")

    @classmethod
    def operator_sink(cls, options: dict[str, str]) -> PostgresSink:
        """The sink of the table ``options`` name, for ``sparkeos sinks``."""
        sink = PostgresSink(parse_postgres_sink_options(options), StructType([]))
        sink.attach()
        return sink

    def _sink(self, schema: StructType) -> PostgresSink:
        sink = PostgresSink(parse_postgres_sink_options(self.options), schema)
        sink.prepare()
        return sink

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("the sparkeos.postgres sink adds rows to its table; use mode('append'), not overwrite")
        write_id = batch_write_id(self.options, self.name(), streaming=False)
        return PostgresBatchWriter(self._sink(schema), write_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseCommitStreamWriter:
        refuse_complete_mode(self.name(), overwrite)
        batch_write_id(self.options, self.name(), streaming=True)
        freeze_planner_worker_once()
        return TwoPhaseCommitStreamWriter(self._sink(schema))
