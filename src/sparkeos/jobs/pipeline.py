"""A job file turned into DataFrames: decode -> bad-record policy -> transforms -> window -> sink rows.

The same function builds the streaming query (`sparkeos run`) and the batch computation of the
expected output (`sparkeos audit`), so the audit checks the job against its own definition.
Kafka's metadata of each record (key, value, topic, partition, offset, timestamp) stays available to
SQL transforms as the struct column `kafka`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ..spark.kafka.options import STARTING_OPTIONS, STREAM_ONLY_SOURCE_OPTIONS
from .spec import JobSpec, seconds_text

EVENT_TIME = "event_time"

# The audit reads the whole topic as a batch: the stream's trigger limits, its start (the audit starts at earliest)
# and its reports to a consumer group do not apply.
LEFT_OUT_OF_BATCH_READS = {name.lower() for name in (*STREAM_ONLY_SOURCE_OPTIONS, *STARTING_OPTIONS,
                                                     "commitOffsetsToGroup")}
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")


@dataclass
class JobFrames:
    output: DataFrame        # rows for the sink (value/key/topic/headers for Kafka)
    good: DataFrame          # decoded, transformed records (before output expressions)
    bad: DataFrame | None    # records that failed to decode, with their error


def read_source(spark: SparkSession, spec: JobSpec, batch: bool, topic: str | None = None) -> DataFrame:
    options = dict(spec.source)
    if batch:
        options = {k: v for k, v in options.items() if k.lower() not in LEFT_OUT_OF_BATCH_READS}
        options["startingOffsets"] = "earliest"
    if topic is not None:
        for key in [k for k in options if k.lower() in ("subscribe", "subscribepattern", "assign")]:
            del options[key]
        options["subscribe"] = topic
    reader = spark.read if batch else spark.readStream
    return reader.format("sparkeos.kafka").options(**options).load()


def decode(raw: DataFrame, spec: JobSpec) -> DataFrame:
    """Record fields at top level, `kafka` metadata struct, `_error` (null for good records)."""
    kafka = F.struct(*[F.col(name) for name in KAFKA_COLUMNS]).alias("kafka")
    fmt = spec.format
    if fmt.type == "string":
        error = F.when(F.col("value").isNotNull() & ~F.is_valid_utf8(F.col("value")), F.lit("value is not valid UTF-8"))
        return raw.select(F.col("value").cast("string").alias("value"), kafka, error.alias("_error"))
    if fmt.type == "json":
        text = F.col("value").cast("string")
        error = (
            F.when(F.col("value").isNull(), F.lit("value is null"))
            .when(~F.is_valid_utf8(F.col("value")), F.lit("value is not valid UTF-8"))
            .when(F.try_parse_json(text).isNull(), F.lit("value is not valid JSON"))
        )
        parsed = raw.select(F.from_json(text, fmt.schema).alias("_record"), kafka, error.alias("_error"))
        return parsed.select("_record.*", "kafka", "_error")
    from ..serde import decode_confluent_avro

    decoded = raw.select(decode_confluent_avro(F.col("value"), fmt.schema, fmt.registry).alias("_decoded"), kafka)
    return decoded.select("_decoded.value.*", "kafka", F.col("_decoded.error").alias("_error"))


def load_transforms(spec: JobSpec) -> list[Callable[[DataFrame], DataFrame] | None]:
    """The function of each `python:` step (None for SQL steps); a ValueError names a step that cannot load."""
    functions: list[Callable[[DataFrame], DataFrame] | None] = []
    for index, step in enumerate(spec.transforms):
        if step.python is None:
            functions.append(None)
            continue
        module_name, function_name = step.python.split(":")
        try:
            functions.append(getattr(importlib.import_module(module_name), function_name))
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"transforms[{index}].python: cannot load {step.python}: {exc}") from None
    return functions


def apply_transforms(spark: SparkSession, frame: DataFrame, spec: JobSpec) -> DataFrame:
    for index, (step, function) in enumerate(zip(spec.transforms, load_transforms(spec), strict=True)):
        if function is None:
            frame.createOrReplaceTempView("input")
            frame = spark.sql(step.sql or "")
        else:
            frame = function(frame)
            if not isinstance(frame, DataFrame):
                raise ValueError(f"transforms[{index}].python: {step.python} returned {type(frame).__name__}, "
                                 "not a DataFrame")
    return frame


def apply_window(frame: DataFrame, spec: JobSpec, batch: bool) -> DataFrame:
    """Tumbling windows. Processing time: one micro-batch is one window (the trigger interval), stamped
    with the batch time; event time: records are held until the watermark closes their window."""
    window = spec.window
    if window is None:
        return frame
    if window.time == "processing" or batch:
        clock = F.current_timestamp() if window.time == "processing" else F.col(EVENT_TIME)
        return frame.withColumn("window", F.window(clock, window.duration))
    columns = list(frame.columns)
    grouped = frame.groupBy(F.window(F.col(EVENT_TIME), window.duration).alias("window")).agg(
        F.collect_list(F.struct(*columns)).alias("_rows")
    )
    return grouped.select("window", F.explode("_rows").alias("_row")).select("_row.*", "window")


def build(spark: SparkSession, spec: JobSpec, batch: bool = False, input_topic: str | None = None) -> JobFrames:
    raw = read_source(spark, spec, batch, input_topic)
    decoded = decode(raw, spec)
    if spec.window is not None and spec.window.time == "event":
        decoded = decoded.withColumn(EVENT_TIME, F.expr(spec.window.column))
        if not batch:
            # Before any filter: every record read, good or bad, moves the watermark.
            decoded = decoded.withWatermark(EVENT_TIME, seconds_text(spec.window.watermark_s or 0))
    policy = spec.bad_records.policy
    if policy == "fail":
        where = F.format_string("bad record at %s-%d offset %d: %s", F.col("kafka.topic"), F.col("kafka.partition"),
                                F.col("kafka.offset"), F.col("_error"))
        good = decoded.where(F.when(F.col("_error").isNotNull(), F.raise_error(where)).otherwise(F.lit(True)))
    else:
        good = decoded.where(F.col("_error").isNull())
    bad = decoded.where(F.col("_error").isNotNull()) if policy != "fail" else None
    transformed = apply_window(apply_transforms(spark, good.drop("_error"), spec), spec, batch)
    if not spec.sink.is_kafka:
        return JobFrames(transformed.drop("kafka"), transformed, bad)
    output = kafka_rows(transformed, spec)
    if policy == "dead-letter" and bad is not None:
        output = output.unionByName(dead_letter_rows(bad, spec))
    return JobFrames(output, transformed, bad)


def kafka_rows(frame: DataFrame, spec: JobSpec) -> DataFrame:
    value = F.expr(spec.output_value) if spec.output_value else F.to_json(F.struct(*[
        F.col(c) for c in frame.columns if c not in ("kafka",)
    ]))
    if spec.output_key:
        key = F.expr(spec.output_key).cast("string")
    elif spec.window is not None:
        # Like the seed's Flink job: the key is the window's timestamp (its end, in epoch milliseconds).
        key = (F.unix_millis(F.col("window.end"))).cast("string")
    else:
        key = F.lit(None).cast("string")
    topic = spec.sink.options["topic"]
    empty = F.array().cast("array<struct<key:string,value:binary>>")
    # The input record's Kafka timestamp, which the sink does not write: it measures the produce-to-visible latency
    # from it (sparkeos.spark.visible_latency). A transform that dropped `kafka` leaves none to measure from.
    stamp = F.col("kafka.timestamp") if "kafka" in frame.columns else F.lit(None).cast("timestamp")
    return frame.select(key.cast("binary").alias("key"), value.cast("string").cast("binary").alias("value"),
                        F.lit(topic).alias("topic"), empty.alias("headers"), stamp.alias("timestamp"))


def dead_letter_rows(bad: DataFrame, spec: JobSpec) -> DataFrame:
    """The original bytes, with headers naming the error and where the record came from."""

    def header(name: str, value: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), value.cast("string").cast("binary").alias("value"))

    headers = F.array(
        header("sparkeos.error", F.col("_error")),
        header("sparkeos.source.topic", F.col("kafka.topic")),
        header("sparkeos.source.partition", F.col("kafka.partition")),
        header("sparkeos.source.offset", F.col("kafka.offset")),
    )
    return bad.select(F.col("kafka.key").alias("key"), F.col("kafka.value").alias("value"),
                      F.lit(spec.bad_records.topic).alias("topic"), headers.alias("headers"),
                      F.col("kafka.timestamp").alias("timestamp"))
