"""The `sparkeos.files` data source: an exactly-once file sink whose output any directory reader can trust."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceWriter
from pyspark.sql.types import StructType

from ..gc_pause import freeze_planner_worker_once
from ..options import batch_write_id
from ..two_phase_commit import TwoPhaseCommitBatchWriter, TwoPhaseCommitStreamWriter, refuse_complete_mode
from .options import check_input_schema, parse_file_sink_options
from .sink import FileSink


class FilesDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sparkeos.files"

    def schema(self) -> StructType:
        raise ValueError("sparkeos.files is a sink: read its directory with any reader (spark.read.parquet(path), "
                         "pyarrow.dataset, DuckDB, pandas)")

    @classmethod
    def operator_sink(cls, options: dict[str, str]) -> FileSink:
        """The sink at the directory ``options`` name, for ``sparkeos sinks``."""
        return FileSink(parse_file_sink_options(options))

    def _sink(self, schema: StructType) -> FileSink:
        options = parse_file_sink_options(self.options)
        check_input_schema(schema, options)
        sink = FileSink(options)
        sink.prepare()
        return sink

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("the sparkeos.files sink adds files to its directory; use mode('append'), not overwrite")
        write_id = batch_write_id(self.options, self.name(), streaming=False)
        return TwoPhaseCommitBatchWriter(self._sink(schema), write_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseCommitStreamWriter:
        refuse_complete_mode(self.name(), overwrite)
        batch_write_id(self.options, self.name(), streaming=True)
        freeze_planner_worker_once()
        return TwoPhaseCommitStreamWriter(self._sink(schema))
