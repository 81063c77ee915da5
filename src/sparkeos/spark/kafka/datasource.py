"""The `sparkeos.kafka` data source: Spark's Kafka connector names, read_committed reads, exactly-once writes."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from ..checkpoint_target import claim_checkpoint
from ..gc_pause import freeze_planner_worker_once
from ..options import batch_write_id
from ..source_runner import quiet_when_spark_hangs_up
from .options import check_source_options, parse_sink_options, parse_source_options
from .sink.startup_checks import prepare_exactly_once, validate_input_schema
from .sink.writers import KafkaBatchWriter, KafkaStreamWriter
from .source.readers import KafkaBatchReader, KafkaStreamReader
from .source.schema import source_schema


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sparkeos.kafka"

    @classmethod
    def operator(cls, options: dict[str, str]):
        """``sparkeos sinks`` for the sink writing to the topic ``options`` name: its transactional ids."""
        from .sink.lingering import KafkaSinkOperator

        return KafkaSinkOperator.from_options(options)

    def schema(self) -> StructType:
        # Spark's Kafka source rejects bad options when the DataFrame is defined, at load(); schema() is what
        # Spark calls then. Whether the read is a stream or a batch is not known yet: options only one kind of
        # read rejects are reported when the query starts.
        check_source_options(self.options)
        include = str(self.options.get("includeheaders", "false")).strip().lower() == "true"
        return source_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        quiet_when_spark_hangs_up()
        return KafkaStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("the sparkeos.kafka sink appends to Kafka topics; use mode('append'), not overwrite")
        options = parse_sink_options(self.options)
        write_id = batch_write_id(self.options, self.name(), streaming=False)
        validate_input_schema(schema, options)
        marker_partitions = prepare_exactly_once(options) if options.delivery_guarantee == "exactly_once" else 0
        return KafkaBatchWriter(options, marker_partitions, write_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        freeze_planner_worker_once()
        batch_write_id(self.options, self.name(), streaming=True)
        options = parse_sink_options(self.options)
        validate_input_schema(schema, options)
        marker_partitions = prepare_exactly_once(options) if options.delivery_guarantee == "exactly_once" else 0
        claim_checkpoint(self.options, self.name(),
                         f"topic {options.topic}" if options.topic else "the topics its rows name")
        return KafkaStreamWriter(options, marker_partitions)
