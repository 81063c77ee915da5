"""Job files (`sparkeos run JOB.yaml`): parsed and validated up front, every error naming its field.

    name: people-etl
    source:                       # any sparkeos.kafka source option
      kafka.bootstrap.servers: 127.0.0.1:9092
      subscribe: people
      startingOffsets: earliest
    format:                       # how record values are decoded
      type: avro                  # string | json | avro
      schema: people.avsc         # avro: file or inline JSON; json: a Spark DDL string
      registry: http://127.0.0.1:8081   # or Confluent's client settings: {url: https://..., basic.auth.user.info:
                                  # "etl:${REGISTRY_PASSWORD}", ssl.ca.location: /etc/registry/ca.pem}
    transforms:                   # applied in order; each SQL sees the previous result as `input`
      - sql: SELECT * FROM input WHERE length(identifyNumber) = 18
      - python: mypackage.module:function
    window:                       # optional tumbling window
      duration: 20 seconds
      time: processing            # processing (default) | event
      column: kafka.timestamp     # event time: a SQL expression (default: the Kafka record timestamp);
                                  # it becomes the column event_time, which transforms must keep
      watermark: 10 seconds       # event time only
    output:
      value: identifyNumber       # SQL expression (default: to_json(struct(*)))
      key: null                   # SQL expression (default: the window end for windowed jobs, else none)
    sink:
      format: sparkeos.kafka      # or sparkeos.files | sparkeos.postgres, or a Spark file format: parquet | json | ...
      topic: out                  # kafka: default topic; files: use path
      deliveryGuarantee: exactly_once
      # path: /data/people        # sparkeos.files and Spark's file formats
      # partitionBy: [country]    # sparkeos.files: Hive-style directories
      options: {}                 # more sink options (kafka.*; sparkeos.files: format, compression, header;
                                  # sparkeos.postgres: url, dbtable, upsertKeys, createTable, batchSize)
    checkpoint: /var/lib/sparkeos/people-etl
    trigger: 5 seconds
    restart: {strategy: fixed-delay, attempts: 3, delay: 10 seconds}   # or failure-rate | exponential-delay | none
    bad_records: {policy: dead-letter, topic: people-dlq}   # fail | skip | dead-letter
    spark:                        # any Spark setting; `sparkeos run --conf` overrides these
      spark.sql.shuffle.partitions: 8
    kafka:                        # librdkafka settings that every Kafka client of the job takes (source, sink,
      security.protocol: SASL_SSL # sparkeos audit); each side's own kafka.* keys win
      sasl.mechanism: SCRAM-SHA-512
      sasl.username: etl
      sasl.password: ${KAFKA_PASSWORD}   # ${NAME}: the value of the environment variable NAME
      ssl.ca.location: /etc/kafka/ca.pem
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..registry.client import Registry, without_password
from ..spark.files.options import FileSinkOptionError, parse_file_sink_options
from ..spark.kafka.cluster import options_connection_config
from ..spark.kafka.options import parse_sink_options, parse_source_options
from ..spark.options import OptionError, duration_s
from ..spark.postgres.options import parse_postgres_sink_options

FORMATS = ("string", "json", "avro")
FILE_SINKS = ("parquet", "json", "csv", "orc")  # Spark's own file sink, exact for readers of _spark_metadata
EXACT_FILE_SINK = "sparkeos.files"
POSTGRES_SINK = "sparkeos.postgres"
POLICIES = ("fail", "skip", "dead-letter")
WINDOW_TIMES = ("processing", "event")


class JobError(ValueError):
    """A job file is invalid; the message names the file and the field."""


@dataclass(frozen=True)
class FormatSpec:
    type: str = "string"
    schema: str | None = None
    registry: Registry | None = None


@dataclass(frozen=True)
class Transform:
    sql: str | None = None
    python: str | None = None


@dataclass(frozen=True)
class WindowSpec:
    duration_s: float
    time: str = "processing"
    column: str = "kafka.timestamp"
    watermark_s: float | None = None

    @property
    def duration(self) -> str:
        return seconds_text(self.duration_s)


@dataclass(frozen=True)
class SinkSpec:
    format: str = "sparkeos.kafka"
    options: dict[str, str] = field(default_factory=dict)

    @property
    def is_kafka(self) -> bool:
        return self.format == "sparkeos.kafka"


@dataclass(frozen=True)
class RestartSpec:
    """Flink's restart strategies, with the names of Flink's options (restart-strategy.<strategy>.<option>)."""

    strategy: str = "fixed-delay"
    # fixed-delay
    attempts: int = 3
    delay_s: float = 10.0
    reset_attempts_threshold_s: float = 3600.0
    # failure-rate (its delay is delay_s)
    max_failures_per_interval: int = 1
    failure_rate_interval_s: float = 60.0
    # exponential-delay
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    backoff_multiplier: float = 1.5
    reset_backoff_threshold_s: float = 3600.0
    jitter_factor: float = 0.1
    attempts_before_reset_backoff: int | None = None  # None: no limit


@dataclass(frozen=True)
class BadRecordSpec:
    policy: str = "fail"
    topic: str | None = None


@dataclass(frozen=True)
class JobSpec:
    name: str
    source: dict[str, str]
    format: FormatSpec
    transforms: tuple[Transform, ...]
    window: WindowSpec | None
    output_value: str | None
    output_key: str | None
    sink: SinkSpec
    checkpoint: str
    trigger_s: float | None
    restart: RestartSpec
    bad_records: BadRecordSpec
    path: Path | None = None
    spark: dict[str, str] = field(default_factory=dict)  # Spark settings of the job file's `spark:` section
    low_latency: bool = False  # turns on sparkeos.spark.low_latency; the `spark:` section wins over its settings

    @property
    def bootstrap_servers(self) -> str:
        return self.source["kafka.bootstrap.servers"]

    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka's connection and security settings of the job's source (its `kafka:` section's, under its own
        kafka.* options), bootstrap servers included: what another client of the job's Kafka connects with."""
        return options_connection_config(self.source)


def seconds_text(seconds: float) -> str:
    if seconds >= 1 and float(seconds).is_integer():
        return f"{int(seconds)} seconds"
    return f"{int(round(seconds * 1000))} milliseconds"


class _Fields:
    """Walks the YAML mapping, remembering where we are for error messages."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, path: str, message: str) -> JobError:
        return JobError(f"{self.where}: {path}: {message}")

    def mapping(self, value: Any, path: str, known: set[str]) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, got {type(value).__name__}")
        for key in value:
            if str(key) not in known:
                raise self.fail(f"{path}.{key}" if path else str(key),
                                f"unknown field (expected one of {', '.join(sorted(known))})")
        return value

    def text(self, value: Any, path: str, required: bool = False) -> str | None:
        if value is None:
            if required:
                raise self.fail(path, "is required")
            return None
        if isinstance(value, (dict, list)):
            raise self.fail(path, f"must be a string, got {type(value).__name__}")
        text = str(value).strip()
        if required and not text:
            raise self.fail(path, "is required")
        return text or None

    def choice(self, value: Any, path: str, choices: tuple[str, ...], default: str) -> str:
        text = (self.text(value, path) or default).lower()
        if text not in choices:
            raise self.fail(path, f"must be one of {', '.join(choices)} (got {value!r})")
        return text

    def duration(self, value: Any, path: str, allow_zero: bool = False) -> float | None:
        if value is None:
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            # A number without a unit is in seconds here, as a YAML number is.
            parsed = duration_s(str(value), default_unit="s")
            if parsed is None:
                raise self.fail(path, f"must be a duration such as '20 seconds' or '500 ms' (got {value!r})")
            seconds = parsed
        if seconds < 0 or (seconds == 0 and not allow_zero):
            raise self.fail(path, "must not be negative" if allow_zero else "must be positive")
        return seconds

    def number(self, value: Any, path: str, default: float) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"must be a number (got {value!r})")
        return float(value)

    def integer(self, value: Any, path: str, default: int, minimum: int) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer (got {value!r})")
        if value < minimum:
            raise self.fail(path, f"must be at least {minimum} (got {value})")
        return value


TOP_LEVEL = {"name", "source", "format", "transforms", "window", "output", "sink", "checkpoint", "trigger", "restart",
             "bad_records", "spark", "low_latency", "kafka"}
ENVIRONMENT_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def load_job(path: str | Path, overrides: dict[str, Any] | None = None) -> JobSpec:
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise JobError(f"{path}: no such job file") from None
    except yaml.YAMLError as exc:
        raise JobError(f"{path}: not valid YAML: {exc}") from None
    if isinstance(document, dict) and overrides:
        document = {**document, **overrides}
    return parse_job(document, str(path), base=path.parent)


def parse_job(document: Any, where: str = "job", base: Path | None = None) -> JobSpec:
    fields = _Fields(where)
    top = fields.mapping(document, "", TOP_LEVEL)
    if not top:
        raise fields.fail("(top level)", "the job file is empty")
    kafka = _parse_kafka(fields, top.get("kafka"))
    source = _parse_source(fields, top.get("source"), kafka)
    format_spec = _parse_format(fields, top.get("format"), base)
    transforms = _parse_transforms(fields, top.get("transforms"))
    window = _parse_window(fields, top.get("window"))
    output = fields.mapping(top.get("output"), "output", {"value", "key"})
    sink = _parse_sink(fields, top.get("sink"), source, kafka)
    bad = _parse_bad_records(fields, top.get("bad_records"), sink)
    restart = _parse_restart(fields, top.get("restart"))
    spark = parse_spark_settings(top.get("spark"), lambda message: fields.fail("spark", message))
    checkpoint = fields.text(top.get("checkpoint"), "checkpoint", required=True)
    trigger = fields.duration(top.get("trigger"), "trigger")
    low_latency = top.get("low_latency", False)
    if not isinstance(low_latency, bool):
        raise fields.fail("low_latency", f"must be true or false (got {low_latency!r})")
    if window and window.time == "processing" and trigger is not None and trigger != window.duration_s:
        raise fields.fail("trigger", "a processing-time window is one micro-batch per window; leave trigger unset "
                          f"or equal to window.duration ({window.duration})")
    return JobSpec(
        name=fields.text(top.get("name"), "name") or (Path(where).stem if where != "job" else "sparkeos-job"),
        source=source, format=format_spec, transforms=transforms, window=window,
        output_value=fields.text(output.get("value"), "output.value"),
        output_key=fields.text(output.get("key"), "output.key"),
        sink=sink, checkpoint=str(checkpoint), trigger_s=trigger, restart=restart, bad_records=bad,
        path=Path(where) if where != "job" else None, spark=spark, low_latency=low_latency,
    )


def _parse_kafka(fields: _Fields, value: Any) -> dict[str, str]:
    """The `kafka:` section: librdkafka settings (security, mostly) that every Kafka client of the job takes."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fields.fail("kafka", "must be a mapping of librdkafka settings (security.protocol: SASL_SSL, ...)")
    settings = {}
    for key, setting in value.items():
        key = str(key)
        if key.lower().startswith("kafka."):
            raise fields.fail(f"kafka.{key}", f"takes librdkafka's names, without 'kafka.': {key[len('kafka.'):]}")
        settings[key] = _expanded(fields, f"kafka.{key}", _option_text(setting))
    return settings


def _expanded(fields: _Fields, path: str, text: str) -> str:
    """`text` with each `${NAME}` replaced by the environment variable NAME; an error naming one that is not set."""
    missing = [name for name in ENVIRONMENT_VARIABLE.findall(text) if name not in os.environ]
    if missing:
        raise fields.fail(path, f"names environment variable {missing[0]}, which is not set")
    return ENVIRONMENT_VARIABLE.sub(lambda match: os.environ[match.group(1)], text)


def _parse_registry(fields: _Fields, value: Any) -> Registry | None:
    """`format.registry`: the registry's URL, or Confluent's schema registry client settings (`url`,
    `basic.auth.user.info`, `ssl.ca.location`, ...), each value with `${NAME}` expanded."""
    if value is None:
        return None
    if isinstance(value, dict):
        settings = {str(key): _expanded(fields, f"format.registry.{key}", _option_text(setting))
                    for key, setting in value.items()}
    elif isinstance(value, list):
        raise fields.fail("format.registry", "must be a URL or a mapping of schema registry client settings")
    else:
        url = _expanded(fields, "format.registry", str(value).strip())
        if not re.match(r"^https?://", url):
            raise fields.fail("format.registry", f"must be an http(s) URL (got {without_password(url)!r})")
        settings = {"url": url}
    try:
        return Registry.of(settings)
    except ValueError as exc:
        raise fields.fail("format.registry", str(exc).removeprefix("schema registry ")) from None


def _with_kafka_settings(options: dict[str, str], kafka: dict[str, str]) -> dict[str, str]:
    """Options with the `kafka:` section's settings as kafka.* keys, under the options' own."""
    own = {key.lower() for key in options}
    return {**{f"kafka.{key}": value for key, value in kafka.items() if f"kafka.{key}".lower() not in own},
            **options}


def _parse_source(fields: _Fields, value: Any, kafka: dict[str, str]) -> dict[str, str]:
    if value is None:
        raise fields.fail("source", "is required (sparkeos.kafka source options)")
    if not isinstance(value, dict):
        raise fields.fail("source", "must be a mapping of sparkeos.kafka source options")
    options = _with_kafka_settings({str(k): _option_text(v) for k, v in value.items()}, kafka)
    try:
        parse_source_options({k.lower(): v for k, v in options.items()}, streaming=True)
    except OptionError as exc:
        raise fields.fail("source", str(exc)) from None
    return options


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _parse_format(fields: _Fields, value: Any, base: Path | None) -> FormatSpec:
    spec = fields.mapping(value, "format", {"type", "schema", "registry"})
    kind = fields.choice(spec.get("type"), "format.type", FORMATS, "string")
    schema = fields.text(spec.get("schema"), "format.schema")
    registry = (_parse_registry(fields, spec.get("registry") or None) if kind == "avro"
                else fields.text(spec.get("registry"), "format.registry"))
    if kind == "string":
        if schema or registry:
            raise fields.fail("format", "type string takes no schema or registry")
        return FormatSpec("string")
    if kind == "json":
        if not schema:
            raise fields.fail("format.schema",
                              "is required for type json (a Spark DDL string such as 'id INT, name STRING')")
        return FormatSpec("json", schema=schema)
    if not schema:
        raise fields.fail("format.schema", "is required for type avro (the reader schema: a .avsc file or inline JSON)")
    if not schema.lstrip().startswith("{"):
        schema_path = Path(schema) if base is None or Path(schema).is_absolute() else base / schema
        try:
            schema = schema_path.read_text()
        except OSError as exc:
            raise fields.fail("format.schema", f"cannot read {schema_path}: {exc.strerror}") from None
    try:
        parsed = json.loads(schema)
    except json.JSONDecodeError as exc:
        raise fields.fail("format.schema", f"is not valid JSON: {exc.msg}") from None
    try:
        import fastavro

        fastavro.parse_schema(parsed)
    except Exception as exc:  # noqa: BLE001 - fastavro raises several types for invalid schemas
        raise fields.fail("format.schema", f"is not a valid Avro schema: {exc}") from None
    if registry is None:
        raise fields.fail("format.registry", "is required for type avro (the Confluent wire format carries schema ids)")
    return FormatSpec("avro", schema=schema, registry=registry)


def _parse_transforms(fields: _Fields, value: Any) -> tuple[Transform, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise fields.fail("transforms", "must be a list of {sql: ...} or {python: module:function}")
    transforms = []
    for index, item in enumerate(value):
        path = f"transforms[{index}]"
        step = fields.mapping(item, path, {"sql", "python"})
        if len(step) != 1:
            raise fields.fail(path, "needs exactly one of sql or python")
        sql = fields.text(step.get("sql"), f"{path}.sql")
        python = fields.text(step.get("python"), f"{path}.python")
        if python is not None and not re.match(r"^[\w.]+:\w+$", python):
            raise fields.fail(f"{path}.python", f"must be module:function (got {python!r})")
        if sql is None and python is None:
            raise fields.fail(path, "is empty")
        transforms.append(Transform(sql=sql, python=python))
    return tuple(transforms)


def _parse_window(fields: _Fields, value: Any) -> WindowSpec | None:
    if value is None:
        return None
    spec = fields.mapping(value, "window", {"duration", "time", "column", "watermark"})
    duration = fields.duration(spec.get("duration"), "window.duration")
    if duration is None:
        raise fields.fail("window.duration", "is required")
    time_kind = fields.choice(spec.get("time"), "window.time", WINDOW_TIMES, "processing")
    watermark = fields.duration(spec.get("watermark"), "window.watermark")
    column = fields.text(spec.get("column"), "window.column") or "kafka.timestamp"
    if time_kind == "processing" and (watermark is not None or spec.get("column") is not None):
        raise fields.fail("window", "watermark and column apply to event-time windows (time: event)")
    if time_kind == "event" and watermark is None:
        raise fields.fail("window.watermark", "is required for event-time windows")
    return WindowSpec(duration, time_kind, column, watermark)


def _parse_sink(fields: _Fields, value: Any, source: dict[str, str], kafka: dict[str, str]) -> SinkSpec:
    spec = fields.mapping(value, "sink", {"format", "topic", "path", "deliveryGuarantee", "partitionBy", "options"})
    if not spec:
        raise fields.fail("sink", "is required")
    sink_format = (fields.text(spec.get("format"), "sink.format") or "sparkeos.kafka").lower()
    if sink_format not in ("sparkeos.kafka", EXACT_FILE_SINK, POSTGRES_SINK, *FILE_SINKS):
        raise fields.fail("sink.format", f"must be sparkeos.kafka, {EXACT_FILE_SINK}, {POSTGRES_SINK} or one of "
                                         f"{', '.join(FILE_SINKS)} (got {sink_format!r})")
    if spec.get("partitionBy") is not None and sink_format != EXACT_FILE_SINK:
        raise fields.fail("sink.partitionBy", f"applies to the {EXACT_FILE_SINK} sink")
    extra = spec.get("options") or {}
    if not isinstance(extra, dict):
        raise fields.fail("sink.options", "must be a mapping")
    options = {str(k): _option_text(v) for k, v in extra.items()}
    if sink_format == "sparkeos.kafka":
        if spec.get("path") is not None:
            raise fields.fail("sink.path", "applies to file sinks; a Kafka sink takes topic")
        options = _with_kafka_settings(options, kafka)
        options.setdefault("kafka.bootstrap.servers", source["kafka.bootstrap.servers"])
        if spec.get("topic") is not None:
            options["topic"] = fields.text(spec.get("topic"), "sink.topic") or ""
        if spec.get("deliveryGuarantee") is not None:
            options["deliveryGuarantee"] = fields.text(spec.get("deliveryGuarantee"), "sink.deliveryGuarantee") or ""
        try:
            parsed = parse_sink_options({k.lower(): v for k, v in options.items()})
        except OptionError as exc:
            raise fields.fail("sink", str(exc)) from None
        if parsed.topic is None:
            raise fields.fail("sink.topic", "is required for a Kafka sink")
    elif sink_format == POSTGRES_SINK:
        if spec.get("topic") is not None or spec.get("path") is not None:
            raise fields.fail("sink", f"topic and path do not apply to {POSTGRES_SINK}: name the table with "
                                      "options.dbtable")
        if spec.get("deliveryGuarantee") is not None:
            options["deliveryGuarantee"] = fields.text(spec.get("deliveryGuarantee"), "sink.deliveryGuarantee") or ""
        try:
            parse_postgres_sink_options(options)
        except OptionError as exc:
            raise fields.fail("sink", str(exc)) from None
    else:
        if spec.get("topic") is not None or spec.get("deliveryGuarantee") is not None:
            raise fields.fail("sink", f"topic and deliveryGuarantee apply to Kafka sinks, not {sink_format}")
        options["path"] = fields.text(spec.get("path"), "sink.path", required=True) or ""
        if sink_format == EXACT_FILE_SINK:
            _check_file_sink(fields, spec.get("partitionBy"), options)
    return SinkSpec(sink_format, options)


def _check_file_sink(fields: _Fields, partition_by: Any, options: dict[str, str]) -> None:
    if partition_by is not None:
        if isinstance(partition_by, str):
            partition_by = [name.strip() for name in partition_by.split(",")]
        if not isinstance(partition_by, list) or not all(isinstance(name, str) for name in partition_by):
            raise fields.fail("sink.partitionBy", "must be a list of column names")
        options["partitionBy"] = json.dumps(partition_by)
    try:
        parse_file_sink_options(options)
    except FileSinkOptionError as exc:
        raise fields.fail("sink", str(exc)) from None


def _parse_bad_records(fields: _Fields, value: Any, sink: SinkSpec) -> BadRecordSpec:
    spec = fields.mapping(value, "bad_records", {"policy", "topic"})
    policy = fields.choice(spec.get("policy"), "bad_records.policy", POLICIES, "fail")
    topic = fields.text(spec.get("topic"), "bad_records.topic")
    if policy == "dead-letter":
        if topic is None:
            raise fields.fail("bad_records.topic", "is required for the dead-letter policy")
        if not sink.is_kafka:
            raise fields.fail("bad_records.policy", "dead-letter needs a sparkeos.kafka sink (same transaction)")
    elif topic is not None:
        raise fields.fail("bad_records.topic", f"only applies to the dead-letter policy, not {policy}")
    return BadRecordSpec(policy, topic)


RESTART_STRATEGIES = ("fixed-delay", "failure-rate", "exponential-delay", "none")
# Each strategy's options, as Flink names them after restart-strategy.<strategy>.
RESTART_OPTIONS = {
    "fixed-delay": {"attempts", "delay", "reset-attempts-threshold"},
    "failure-rate": {"max-failures-per-interval", "failure-rate-interval", "delay"},
    "exponential-delay": {"initial-backoff", "max-backoff", "backoff-multiplier", "reset-backoff-threshold",
                          "jitter-factor", "attempts-before-reset-backoff"},
    "none": set(),
}


def _parse_restart(fields: _Fields, value: Any) -> RestartSpec:
    known = {"strategy"}.union(*RESTART_OPTIONS.values())
    spec = fields.mapping(value, "restart", known)
    strategy = fields.choice(spec.get("strategy"), "restart.strategy", RESTART_STRATEGIES, "fixed-delay")
    for key in spec:
        if key != "strategy" and key not in RESTART_OPTIONS[strategy]:
            owners = [name for name, options in RESTART_OPTIONS.items() if key in options]
            raise fields.fail(f"restart.{key}", f"applies to the {' and '.join(owners)} strategy, not {strategy}")
    defaults = RestartSpec()

    def duration(key: str, default: float, allow_zero: bool = False) -> float:
        parsed = fields.duration(spec.get(key), f"restart.{key}", allow_zero=allow_zero)
        return default if parsed is None else parsed

    if strategy == "none":
        return RestartSpec("none", attempts=0)
    if strategy == "fixed-delay":
        return RestartSpec(
            strategy, attempts=fields.integer(spec.get("attempts"), "restart.attempts", defaults.attempts, 0),
            delay_s=duration("delay", defaults.delay_s, allow_zero=True),
            reset_attempts_threshold_s=duration("reset-attempts-threshold", defaults.reset_attempts_threshold_s))
    if strategy == "failure-rate":
        return RestartSpec(
            strategy, delay_s=duration("delay", 1.0, allow_zero=True),
            max_failures_per_interval=fields.integer(spec.get("max-failures-per-interval"),
                                                     "restart.max-failures-per-interval", 1, 1),
            failure_rate_interval_s=duration("failure-rate-interval", defaults.failure_rate_interval_s))
    initial = duration("initial-backoff", defaults.initial_backoff_s)
    maximum = duration("max-backoff", defaults.max_backoff_s)
    if maximum < initial:
        raise fields.fail("restart.max-backoff" if "max-backoff" in spec else "restart.initial-backoff",
                          f"restart.initial-backoff ({seconds_text(initial)}) must not exceed restart.max-backoff "
                          f"({seconds_text(maximum)})")
    multiplier = fields.number(spec.get("backoff-multiplier"), "restart.backoff-multiplier",
                               defaults.backoff_multiplier)
    if multiplier <= 1:
        raise fields.fail("restart.backoff-multiplier", f"must be greater than 1 (got {multiplier:g})")
    jitter = fields.number(spec.get("jitter-factor"), "restart.jitter-factor", defaults.jitter_factor)
    if not 0 <= jitter <= 1:
        raise fields.fail("restart.jitter-factor", f"must be between 0 and 1 (got {jitter:g})")
    attempts = spec.get("attempts-before-reset-backoff")
    return RestartSpec(
        strategy, initial_backoff_s=initial, max_backoff_s=maximum, backoff_multiplier=multiplier,
        reset_backoff_threshold_s=duration("reset-backoff-threshold", defaults.reset_backoff_threshold_s),
        jitter_factor=jitter,
        attempts_before_reset_backoff=None if attempts is None else fields.integer(
            attempts, "restart.attempts-before-reset-backoff", 1, 1))


def parse_spark_settings(value: Any, fail: Callable[[str], Exception]) -> dict[str, str]:
    """A mapping of Spark settings, as text. Keys must be Spark's (`spark.`-prefixed): spark-submit ignores any other
    key with no more than a warning, so a misspelled prefix would silently change nothing."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail(f"must be a mapping of Spark settings to values, got {type(value).__name__}")
    settings = {}
    for key, setting in value.items():
        check_spark_key(key, fail)
        if setting is None or isinstance(setting, (dict, list)):
            raise fail(f"{key}: must be a single value (a string, number or boolean)")
        settings[str(key)] = _option_text(setting)
    return settings


def check_spark_key(key: Any, fail: Callable[[str], Exception]) -> None:
    if not isinstance(key, str) or not re.fullmatch(r"spark\.[^\s=]+", key):
        raise fail(f"{key!r} is not a Spark setting: Spark's settings start with 'spark.' (Hadoop's go in as "
                   "spark.hadoop.*)")
