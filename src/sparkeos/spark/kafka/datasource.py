"""The `sparkeos.kafka` data source: Spark's Kafka connector names, read_committed reads, exactly-once writes."""

from __future__ import annotations

import time

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from ..checkpoint_target import claim_checkpoint
from ..gc_pause import freeze_planner_worker_once
from ..options import batch_write_id
from ..source_runner import quiet_when_spark_hangs_up
from .cluster import options_connection_config
from .options import check_source_options, parse_sink_options, parse_source_options
from .sink.startup_checks import prepare_exactly_once, validate_input_schema
from .sink.writers import KafkaBatchWriter, KafkaStreamWriter
from .source.readers import KafkaBatchReader, KafkaStreamReader
from .source.schema import source_schema


def _connection(options: dict[str, str]) -> dict[str, str]:
    """The connection and security settings among a sink's kafka.* options, for the readers of what it wrote."""
    return {key: value for key, value in options_connection_config(options).items() if key != "bootstrap.servers"}


class KafkaDataSource(DataSource):
    # The failpoint (sparkeos.failpoints) where a batch is half committed: a task committed its transaction
    # and Spark has not logged the batch as committed. `sparkeos chaos` kills the driver there.
    half_committed_step = "sink.after_commit"
    # Where a task is in the middle of its transaction: its records and marker produced, the commit not yet sent.
    # `sparkeos chaos` kills the task's Python worker or executor there.
    task_transaction_step = "sink.before_commit"
    visible_output_unit = "offsets"

    @classmethod
    def visible_output(cls, options: dict[str, str]) -> int:
        """How far read_committed readers can read the topic ``options`` name: its last stable offsets, summed (the
        records, and the markers of the transactions among them). Its client logs nothing: a caller counting while
        the cluster is away is told by the exception."""
        from ...verify import end_offsets

        lowered = {k.lower(): v for k, v in options.items()}
        return sum(end_offsets(lowered["kafka.bootstrap.servers"], lowered["topic"], timeout_s=5,
                               config={**_connection(options), "log_level": 0}).values())

    @classmethod
    def visible_records(cls, options: dict[str, str]) -> None:
        """Not watched (``sparkeos.spark.reader_view``): what read_committed readers see of a topic only grows, so a
        record cannot vanish, and the audit at the end reads every record there is."""
        return None

    @classmethod
    def left_pending(cls, options: dict[str, str], settle_s: float = 10.0) -> list[str]:
        """The transactions left open on the topic ``options`` name, in words: the partitions whose last stable
        offset stays below the high watermark for ``settle_s`` (a transaction's marker lands just after its commit or
        abort is acknowledged). An open transaction holds read_committed readers at its first offset until the
        broker times it out."""
        from ...verify import READ_UNCOMMITTED, end_offsets

        lowered = {k.lower(): v for k, v in options.items()}
        bootstrap, topic = lowered["kafka.bootstrap.servers"], lowered["topic"]
        deadline = time.monotonic() + settle_s
        while True:
            stable = end_offsets(bootstrap, topic, config={**_connection(options), "log_level": 0})
            high = end_offsets(bootstrap, topic, isolation_level=READ_UNCOMMITTED,
                               config={**_connection(options), "log_level": 0})
            held = sorted(p for p, offset in high.items() if stable.get(p, 0) < offset)
            if not held or time.monotonic() >= deadline:
                return [f"a transaction open on {topic} partition {p}: read_committed readers stop at offset "
                        f"{stable.get(p, 0)} of {high[p]}" for p in held]
            time.sleep(0.2)

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
