"""`sparkeos audit`: compare what a job wrote with what its definition says it should have written.

Both topics are read with read_committed (a `sparkeos.files` sink's directory with Spark's batch reader, as any
reader would list it). The expected output is the job's own transformation run
in batch mode over the whole committed input; the comparison is of multisets of record values, so the audit
finds lost records (missing), records written twice (duplicated) and records that should not exist
(unexpected, e.g. from aborted transactions leaking). Event-time windows still open at the end of
the input (not yet passed by the watermark) are not expected.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..spark.files.options import parse_file_sink_options
from ..spark.kafka.cluster import options_connection_config
from ..spark.postgres.options import parse_postgres_sink_options
from .pipeline import EVENT_TIME, JobFrames, build, kafka_rows
from .quiet import with_kafka_log_level
from .spec import EXACT_FILE_SINK, POSTGRES_SINK, JobSpec

SAMPLES = 5
# An audit prints a table: Spark's stage progress bars would be drawn through it.
SESSION_CONFIG = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
# The audit's Kafka clients print warnings and errors only (see sparkeos.jobs.quiet).
CLIENT_LOG_LEVEL = "WARNING"


@dataclass
class Comparison:
    expected: int = 0
    delivered: int = 0
    missing: int = 0
    duplicated: int = 0
    unexpected: int = 0
    samples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return self.missing == 0 and self.duplicated == 0 and self.unexpected == 0


@dataclass
class AuditReport:
    output: Comparison
    dead_letter: Comparison | None

    @property
    def exact(self) -> bool:
        return self.output.exact and (self.dead_letter is None or self.dead_letter.exact)

    def comparisons(self) -> list[tuple[str, Comparison]]:
        """(name, comparison) of the output and of the dead-letter topic, if audited."""
        return [("output", self.output)] + ([("dead letter", self.dead_letter)] if self.dead_letter else [])

    def summary(self) -> dict:
        report = {
            "expected": self.output.expected, "delivered": self.output.delivered, "missing": self.output.missing,
            "duplicated": self.output.duplicated, "unexpected": self.output.unexpected,
            "dead_lettered": self.dead_letter.delivered if self.dead_letter else 0,
            "exact": self.exact,
        }
        if self.dead_letter is not None:
            report["dead_letter"] = asdict(self.dead_letter)
        report["samples"] = self.output.samples
        return report


def read_topic_values(spark: SparkSession, bootstrap: str, topic: str, spec: JobSpec | None = None) -> DataFrame:
    """The values of `topic`, read_committed; with the connection and security settings of `spec`'s sink, and
    the group of its source (a reader's consumer looks up its group's coordinator, which the cluster's ACLs may
    allow for the job's group only)."""
    writer_options = spec.sink.options if spec is not None else {}
    options = {f"kafka.{key}": value for key, value in options_connection_config(writer_options).items()}
    if spec is not None:
        options.update({key: value for key, value in spec.source.items()
                        if key.lower() in ("groupidprefix", "kafka.group.id")})
    options.update({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"})
    options = with_kafka_log_level(options, CLIENT_LOG_LEVEL)
    return spark.read.format("sparkeos.kafka").options(**options).load().select("value")


def compare(expected: DataFrame, actual: DataFrame) -> Comparison:
    """Multiset difference of the `value` columns, computed in Spark (only the differences are collected)."""
    want = expected.groupBy("value").agg(F.count(F.lit(1)).alias("want"))
    have = actual.groupBy("value").agg(F.count(F.lit(1)).alias("have"))
    joined = want.join(have, "value", "full_outer").fillna(0, ["want", "have"])
    totals = joined.agg(
        F.sum("want").alias("expected"), F.sum("have").alias("delivered"),
        F.sum(F.greatest(F.col("want") - F.col("have"), F.lit(0))).alias("missing"),
        F.sum(F.when(F.col("want") > 0, F.greatest(F.col("have") - F.col("want"), F.lit(0))).otherwise(0))
        .alias("duplicated"),
        F.sum(F.when(F.col("want") == 0, F.col("have")).otherwise(0)).alias("unexpected"),
    ).collect()[0]
    result = Comparison(*(int(totals[name] or 0) for name in ("expected", "delivered", "missing", "duplicated",
                                                             "unexpected")))
    if not result.exact:
        kinds = {
            "missing": F.col("want") > F.col("have"),
            "duplicated": (F.col("want") > 0) & (F.col("have") > F.col("want")),
            "unexpected": F.col("want") == 0,
        }
        for kind, condition in kinds.items():
            rows = joined.where(condition).limit(SAMPLES).collect()
            if rows:
                result.samples[kind] = [f"{_show(r['value'])} (expected {r['want']}, found {r['have']})" for r in rows]
    return result


def _show(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    data = bytes(value)
    try:
        return repr(data.decode())
    except UnicodeDecodeError:
        return data.hex()


def audit(spark: SparkSession, spec: JobSpec, bootstrap: str, input_topic: str, output: str | None = None,
          dead_letter_topic: str | None = None) -> AuditReport:
    """`output` is the output topic of a Kafka sink, the directory of a `sparkeos.files` sink (default: the
    job's `sink.path`), or the table of a `sparkeos.postgres` sink (default: the job's `dbtable`)."""
    audited = _with_bootstrap(spec, bootstrap)
    frames = build(spark, audited, batch=True, input_topic=input_topic)
    if spec.sink.format == EXACT_FILE_SINK:
        options = {**spec.sink.options, **({"path": output} if output else {})}
        return AuditReport(compare(row_values(frames.output), row_values(read_directory(spark, options))), None)
    if spec.sink.format == POSTGRES_SINK:
        options = {**spec.sink.options, **({"dbtable": output} if output else {})}
        expected = frames.output
        return AuditReport(compare(row_values(expected), row_values(read_table(spark, options, expected.schema))),
                           None)
    if not spec.sink.is_kafka:
        raise ValueError(f"sparkeos audit compares Kafka topics and {EXACT_FILE_SINK} directories; this job writes "
                         f"with Spark's {spec.sink.format} sink, exact only for readers of its _spark_metadata")
    if not output:
        raise ValueError("the output topic is required to audit a Kafka sink")
    output_topic = output
    expected_output = expected_rows(frames, audited).where(
        F.col("topic") == F.lit(audited.sink.options["topic"])).select("value")
    compared = compare(expected_output, read_topic_values(spark, bootstrap, output_topic, audited))
    dead_letter = None
    dead_letter_topic = dead_letter_topic or audited.bad_records.topic
    if audited.bad_records.policy == "dead-letter" and dead_letter_topic:
        expected_bad = frames.bad.select(F.col("kafka.value").alias("value")) if frames.bad is not None else None
        if expected_bad is not None:
            dead_letter = compare(expected_bad, read_topic_values(spark, bootstrap, dead_letter_topic, audited))
    return AuditReport(compared, dead_letter)


def read_directory(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    """A `sparkeos.files` directory as a plain reader sees it: Spark's batch reader lists it (skipping `_`-prefixed
    paths) with Hive partition discovery; no log of the sink's is consulted."""
    parsed = parse_file_sink_options(options)
    reader = spark.read.format(parsed.format)
    if parsed.format == "csv":
        reader = reader.option("header", str(parsed.header).lower()).option("inferSchema", "true")
    return reader.load(parsed.path)


def read_table(spark: SparkSession, options: dict[str, str], schema) -> DataFrame:
    """The rows of a `sparkeos.postgres` sink's table, read with psycopg, as a DataFrame of the job's output schema
    (so values compare with the expected ones as Spark writes them). A table of upserts holds the last row per
    key, not every row the job wrote: it cannot be audited this way."""
    import psycopg
    from psycopg import sql

    parsed = parse_postgres_sink_options(options)
    if parsed.upsert_keys:
        raise ValueError("sparkeos audit compares every row a job wrote; a table of upserts keeps the last row per "
                         "key (upsertKeys), so it cannot be audited")
    table = sql.Identifier(*([parsed.table.schema] if parsed.table.schema else []), parsed.table.name)
    columns = sql.SQL(", ").join(sql.Identifier(name) for name in schema.fieldNames())
    with psycopg.connect(parsed.url) as connection:
        rows = connection.execute(sql.SQL("SELECT {} FROM {}").format(columns, table)).fetchall()
    return spark.createDataFrame(rows, schema)


def row_values(frame: DataFrame) -> DataFrame:
    """Each row as one comparable value: its columns by name, as strings, in JSON (a partition column read back
    from a directory name has an inferred type, so types are not compared)."""
    columns = sorted(frame.columns)
    return frame.select(F.to_json(F.struct(*[F.col(f"`{c}`").cast("string").alias(c) for c in columns]))
                        .alias("value"))


def expected_rows(frames: JobFrames, spec: JobSpec) -> DataFrame:
    """Event-time windows are emitted once the watermark passes their end; windows still open when the
    input ends are not expected. Spark's watermark is the largest event time among the records that
    reach the window (filters that do not use the event time run before it) minus the delay."""
    window = spec.window
    if window is None or window.time != "event":
        return frames.output
    newest = frames.good.agg(F.max(EVENT_TIME)).collect()[0][0]
    if newest is None:
        return frames.output.limit(0)
    watermark = newest - timedelta(seconds=window.watermark_s or 0)
    closed = frames.good.where(F.col("window.end") <= F.lit(watermark))
    return kafka_rows(closed, spec)


def _with_bootstrap(spec: JobSpec, bootstrap: str) -> JobSpec:
    from dataclasses import replace

    # The expected output comes from the committed input, whatever the job reads: a job reading read_uncommitted
    # lets aborted input through, which the audit reports as unexpected.
    source = {k: v for k, v in spec.source.items() if k.lower() not in ("kafka.bootstrap.servers",
                                                                        "kafka.isolation.level")}
    source["kafka.bootstrap.servers"] = bootstrap
    source = with_kafka_log_level(source, CLIENT_LOG_LEVEL)
    sink_options = {k: v for k, v in spec.sink.options.items() if k.lower() != "kafka.bootstrap.servers"}
    sink_options["kafka.bootstrap.servers"] = bootstrap
    return replace(spec, source=source, sink=replace(spec.sink, options=sink_options))


def audit_table(report: AuditReport, title: str):
    """The audit's counts as a table: a row for the output, one for the dead-letter topic."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("", "expected", "delivered", "missing", "duplicated", "unexpected"):
        table.add_column(column, justify="right")
    for name, c in report.comparisons():
        table.add_row(name, str(c.expected), str(c.delivered), str(c.missing), str(c.duplicated), str(c.unexpected))
    return table


def sample_lines(report: AuditReport) -> list[str]:
    """One line per kind of difference found, with its samples."""
    return [f"{name} {kind}: " + "; ".join(samples)
            for name, c in report.comparisons() for kind, samples in c.samples.items()]


def audit_in_this_process(spec: JobSpec, bootstrap: str, input_topic: str, output: str | None,
                          dead_letter_topic: str | None, log, app_name: str) -> AuditReport:
    """`audit` in a local Spark session of its own, started and stopped here; its JVM logs to `log`, not through the
    tables on the terminal (the demo's and `sparkeos chaos`'s)."""
    import sparkeos.spark

    from .quiet import children_stderr_to, with_quiet_jvm_start

    config = with_quiet_jvm_start({**SESSION_CONFIG, "spark.log.level": "ERROR"})
    with children_stderr_to(log):
        spark = sparkeos.spark.session(app_name, master="local[2]", config=config)
    try:
        return audit(spark, spec, bootstrap, input_topic, output, dead_letter_topic)
    finally:
        spark.stop()


def print_report(report: AuditReport, console=None) -> None:
    from rich.console import Console

    console = console or Console()
    console.print(audit_table(report, "sparkeos audit"))
    for line in sample_lines(report):
        console.print(line)
    console.print("[bold green]exact[/]" if report.exact else "[bold red]NOT exact[/]")
