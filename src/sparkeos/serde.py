"""Confluent-framed Avro for PySpark columns.

Spark's `from_avro` cannot read the Confluent wire format (SPARK-34652): each value starts with a
magic byte 0 and the 4-byte big-endian id of the writer's schema in a schema registry, then the
Avro binary body. These functions read and write that format:

- `from_confluent_avro(col, reader_schema, registry)` decodes into a struct of the reader
  schema's Spark type, resolving each record's writer schema (fetched by id) against the reader
  schema, with Spark's FAILFAST / PERMISSIVE modes;
- `decode_confluent_avro(col, reader_schema, registry)` returns `struct<value, error>` so a job
  can route bad records (fail, skip or dead-letter) instead of failing or nulling them;
- `to_confluent_avro(col, schema, registry, subject)` registers the schema and encodes structs.

A registry is its URL, or a mapping of Confluent's schema registry client settings (`url`,
`basic.auth.user.info`, `ssl.ca.location`, ...: sparkeos.registry.client).

The work runs in Python workers as Arrow UDFs (`pyspark.sql.functions.arrow_udf`, no pandas);
each worker keeps the writer schemas it fetched, so the registry sees one request per schema id
per worker.
"""

from __future__ import annotations

import io
import json
import struct
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import fastavro
import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .registry.client import Registry, RegistryRequestError, RegistrySettings

MAGIC_BYTE = 0
HEADER = struct.Struct(">bI")
MODES = ("FAILFAST", "PERMISSIVE")

AvroSchema = str | dict | list


class AvroDecodeError(ValueError):
    """A value that cannot be decoded; the message names what is wrong with it."""


# -- Avro -> Spark / Arrow types -----------------------------------------------------------


def avro_to_spark_type(schema: AvroSchema) -> T.DataType:
    """The Spark type of values of an Avro schema (JSON text or parsed), as Spark's `from_avro` maps them.

    Records become structs, `["null", T]` unions a nullable T, enums strings, maps `map<string, V>`,
    `date` dates, `timestamp-millis`/`-micros` timestamps, decimals decimals. Other unions are refused.
    """
    parsed = _parse(schema)
    spark_type, _nullable = _spark_type(parsed, _named_types(parsed))
    return spark_type


def _parse(schema: AvroSchema) -> Any:
    document = json.loads(schema) if isinstance(schema, str) and schema.lstrip()[:1] in '{["' else schema
    return fastavro.parse_schema(document)


def _named_types(parsed: Any) -> dict[str, Any]:
    return dict(parsed.get("__named_schemas", {})) if isinstance(parsed, dict) else {}


def _spark_type(schema: Any, names: dict[str, Any]) -> tuple[T.DataType, bool]:
    """(type, nullable) of one Avro schema node."""
    if isinstance(schema, list):
        return _union_type(schema, names)
    if isinstance(schema, str):
        if schema in names:
            return _spark_type(names[schema], names)
        return _primitive_type(schema, None, {}), schema == "null"
    kind = schema["type"]
    if isinstance(kind, dict | list):
        return _spark_type(kind, names)
    if kind in ("record", "error"):
        fields = []
        for field in schema["fields"]:
            field_type, nullable = _spark_type(field["type"], names)
            fields.append(T.StructField(field["name"], field_type, nullable))
        return T.StructType(fields), False
    if kind == "enum":
        return T.StringType(), False
    if kind == "array":
        items, nullable = _spark_type(schema["items"], names)
        return T.ArrayType(items, nullable), False
    if kind == "map":
        values, nullable = _spark_type(schema["values"], names)
        return T.MapType(T.StringType(), values, nullable), False
    if kind == "fixed":
        return _primitive_type("bytes", schema.get("logicalType"), schema), False
    return _primitive_type(kind, schema.get("logicalType"), schema), False


def _union_type(branches: list, names: dict[str, Any]) -> tuple[T.DataType, bool]:
    non_null = [branch for branch in branches if branch != "null"]
    if len(non_null) != 1:
        raise ValueError(
            f'Avro union {json.dumps(branches)} has no Spark type here: only ["null", T] unions '
            "(or a single type) are supported"
        )
    spark_type, _ = _spark_type(non_null[0], names)
    return spark_type, len(non_null) < len(branches)


def _primitive_type(kind: str, logical: str | None, schema: dict) -> T.DataType:
    if logical == "date" and kind == "int":
        return T.DateType()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return T.TimestampType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return T.TimestampNTZType()
    if logical == "decimal" and kind in ("bytes", "fixed"):
        return T.DecimalType(schema["precision"], schema.get("scale", 0))
    primitives: dict[str, T.DataType] = {
        "null": T.NullType(),
        "boolean": T.BooleanType(),
        "int": T.IntegerType(),
        "long": T.LongType(),
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "bytes": T.BinaryType(),
        "string": T.StringType(),
    }
    if kind not in primitives:
        raise ValueError(f"unknown Avro type {kind!r}")
    return primitives[kind]


def spark_to_arrow_type(spark_type: T.DataType) -> pa.DataType:
    """The Arrow type Spark exchanges with Arrow UDFs for `spark_type`."""
    simple: dict[type, pa.DataType] = {
        T.NullType: pa.null(),
        T.BooleanType: pa.bool_(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.FloatType: pa.float32(),
        T.DoubleType: pa.float64(),
        T.BinaryType: pa.binary(),
        T.StringType: pa.string(),
        T.DateType: pa.date32(),
        T.TimestampType: pa.timestamp("us", tz="UTC"),
        T.TimestampNTZType: pa.timestamp("us"),
    }
    if type(spark_type) in simple:
        return simple[type(spark_type)]
    if isinstance(spark_type, T.DecimalType):
        return pa.decimal128(spark_type.precision, spark_type.scale)
    if isinstance(spark_type, T.ArrayType):
        return pa.list_(pa.field("element", spark_to_arrow_type(spark_type.elementType), spark_type.containsNull))
    if isinstance(spark_type, T.MapType):
        return pa.map_(
            spark_to_arrow_type(spark_type.keyType),
            pa.field("value", spark_to_arrow_type(spark_type.valueType), spark_type.valueContainsNull),
        )
    if isinstance(spark_type, T.StructType):
        return pa.struct([pa.field(f.name, spark_to_arrow_type(f.dataType), f.nullable) for f in spark_type.fields])
    raise ValueError(f"no Arrow type for {spark_type.simpleString()}")


# -- registry access (driver and workers) ----------------------------------------------------


def register_schema(registry: RegistrySettings, subject: str, schema: AvroSchema) -> int:
    """Register `schema` under `subject` (or find it there) and return its id."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
    return int(Registry.of(registry).post(path, {"schema": text, "schemaType": "AVRO"})["id"])


# -- decoding (runs in Python workers) -------------------------------------------------------


class ConfluentAvroDecoder:
    """Decodes Confluent-framed Avro values into dicts of the reader schema; one per worker and schema."""

    def __init__(self, reader_schema: str, registry: RegistrySettings | None) -> None:
        self.reader = _parse(reader_schema)
        self.registry = Registry.of(registry) if registry is not None else None
        self._writers: dict[int, Any] = {}

    def decode(self, value: bytes) -> Any:
        """The decoded record; raises AvroDecodeError naming what is wrong with `value`."""
        if len(value) < HEADER.size:
            raise AvroDecodeError(f"value of {len(value)} bytes is shorter than the 5-byte Confluent header")
        magic, schema_id = HEADER.unpack_from(value)
        if magic != MAGIC_BYTE:
            raise AvroDecodeError(f"bad magic byte {magic & 0xFF:#04x} (Confluent wire format starts with 0x00)")
        writer = self._writer_schema(schema_id)
        body = io.BytesIO(value)
        body.seek(HEADER.size)
        try:
            record = fastavro.schemaless_reader(body, writer, self.reader)
        except UnicodeDecodeError as exc:
            raise AvroDecodeError(f"invalid UTF-8 in a string field (schema id {schema_id}): {exc}") from None
        except fastavro.read.SchemaResolutionError as exc:
            raise AvroDecodeError(f"writer schema {schema_id} cannot be read with the reader schema: {exc}") from None
        except Exception as exc:  # fastavro reports truncated or garbled input as EOFError, IndexError, ...
            raise AvroDecodeError(f"corrupt Avro body (schema id {schema_id}): {type(exc).__name__}: {exc}") from None
        left = len(value) - body.tell()
        if left:
            raise AvroDecodeError(f"corrupt Avro body (schema id {schema_id}): {left} bytes left after the record")
        return record

    def _writer_schema(self, schema_id: int) -> Any:
        if schema_id in self._writers:
            return self._writers[schema_id]
        if self.registry is None:
            writer = self.reader  # no registry: the body is taken to be written with the reader schema
        else:
            writer = _parse(self._fetch(schema_id))
        self._writers[schema_id] = writer
        return writer

    def _fetch(self, schema_id: int) -> str:
        assert self.registry is not None
        try:
            return self.registry.get(f"/schemas/ids/{schema_id}")["schema"]
        except RegistryRequestError as exc:
            if exc.status == 404:
                raise AvroDecodeError(f"unknown schema id {schema_id}") from None
            raise


_DECODERS: dict[tuple[str, Registry | None], ConfluentAvroDecoder] = {}


def _decoder(reader_schema: str, registry: Registry | None) -> ConfluentAvroDecoder:
    key = (reader_schema, registry)
    if key not in _DECODERS:
        _DECODERS[key] = ConfluentAvroDecoder(reader_schema, registry)
    return _DECODERS[key]


def decode_values(
    values: pa.Array, reader_schema: str, registry: RegistrySettings | None,
    on_error: Callable[[bytes, AvroDecodeError], None]
) -> tuple[list[Any], list[str | None]]:
    """Decode a binary Arrow array: (records, error messages), one of each per value.

    fastavro's values are what `pyarrow.array` takes for the matching Arrow type as they are
    (maps as dicts, timestamps as aware datetimes), so no per-record reshaping is needed.
    """
    decoder = _decoder(reader_schema, Registry.of(registry) if registry is not None else None)
    records: list[Any] = []
    errors: list[str | None] = []
    for value in values.to_pylist():
        if value is None:
            records.append(None)
            errors.append(None)
            continue
        try:
            records.append(decoder.decode(value))
            errors.append(None)
        except AvroDecodeError as exc:
            on_error(value, exc)
            records.append(None)
            errors.append(str(exc))
    return records, errors


# -- encoding (runs in Python workers) -------------------------------------------------------


Converter = Callable[[Any], Any]


def _arrow_to_avro_converter(schema: Any, names: dict[str, Any]) -> Converter | None:
    """A function reshaping Arrow's Python values for fastavro, or None when they fit as they are.

    Only maps (Arrow gives lists of pairs, fastavro wants dicts) and naive timestamps (which
    fastavro would read as local time; Spark's are UTC) need it, so most schemas convert nothing.
    """
    if isinstance(schema, str):
        return _arrow_to_avro_converter(names[schema], names) if schema in names else None
    if isinstance(schema, list):
        branch = next((b for b in schema if b != "null"), "null")
        return _nullable(_arrow_to_avro_converter(branch, names))
    kind = schema["type"]
    if isinstance(kind, dict | list):
        return _arrow_to_avro_converter(kind, names)
    if kind in ("record", "error"):
        return _record_converter(schema, names)
    if kind == "array":
        items = _arrow_to_avro_converter(schema["items"], names)
        return None if items is None else (lambda value: [items(item) for item in value])
    if kind == "map":
        values = _arrow_to_avro_converter(schema["values"], names) or (lambda value: value)
        return lambda value: {key: values(item) for key, item in (value.items() if isinstance(value, dict) else value)}
    if str(schema.get("logicalType", "")).startswith("timestamp"):
        return lambda value: (
            value.replace(tzinfo=UTC) if isinstance(value, datetime) and value.tzinfo is None else value
        )
    return None


def _record_converter(schema: dict, names: dict[str, Any]) -> Converter | None:
    if schema["name"] in _CONVERTING:
        return None  # a recursive record: converting its nested levels is not supported
    _CONVERTING.add(schema["name"])
    try:
        fields = [(f["name"], _nullable(_arrow_to_avro_converter(f["type"], names))) for f in schema["fields"]]
    finally:
        _CONVERTING.discard(schema["name"])
    converting = [(name, convert) for name, convert in fields if convert is not None]
    if not converting:
        return None

    def convert(value: dict) -> dict:
        value = dict(value)
        for name, field_converter in converting:
            value[name] = field_converter(value.get(name))
        return value

    return convert


_CONVERTING: set[str] = set()


def _nullable(convert: Converter | None) -> Converter | None:
    if convert is None:
        return None
    return lambda value: None if value is None else convert(value)


def encode_values(values: pa.Array, schema_text: str, schema_id: int) -> pa.Array:
    writer = _parse(schema_text)
    convert = _arrow_to_avro_converter(writer, _named_types(writer)) or (lambda value: value)
    header = HEADER.pack(MAGIC_BYTE, schema_id)
    encoded: list[bytes | None] = []
    for value in values.to_pylist():
        if value is None:
            encoded.append(None)
            continue
        buffer = io.BytesIO()
        buffer.write(header)
        fastavro.schemaless_writer(buffer, writer, convert(value))
        encoded.append(buffer.getvalue())
    return pa.array(encoded, type=pa.binary())


# -- the Column functions --------------------------------------------------------------------


def from_confluent_avro(
    col: Column | str, reader_schema: str, registry: RegistrySettings | None = None,
    options: dict[str, str] | None = None,
) -> Column:
    """Decode Confluent-framed Avro into a struct of `reader_schema`'s Spark type.

    Each value's writer schema is fetched from `registry` by the id in its header and resolved
    against `reader_schema` (fields the writer lacks take the reader's defaults, extra writer fields
    are skipped, numeric types promote). Without `registry` the body is read with
    `reader_schema` itself. `options={"mode": "FAILFAST"}` (the default, as in Spark's `from_avro`)
    fails the query on a bad value with a message naming the problem; `"PERMISSIVE"` gives null.
    """
    mode = _mode(options)
    reader_schema = _schema_text(reader_schema)
    reached = Registry.of(registry) if registry is not None else None
    spark_type = avro_to_spark_type(reader_schema)
    arrow_type = spark_to_arrow_type(spark_type)

    def fail(_value: bytes, error: AvroDecodeError) -> None:
        if mode == "FAILFAST":
            raise AvroDecodeError(f"from_confluent_avro (mode FAILFAST): {error}")

    def decode(values: pa.Array) -> pa.Array:
        records, _errors = decode_values(values, reader_schema, reached, fail)
        return pa.array(records, type=arrow_type)

    return F.arrow_udf(decode, spark_type)(_column(col))


def decode_confluent_avro(col: Column | str, reader_schema: str, registry: RegistrySettings | None = None) -> Column:
    """`struct<value: <reader_schema's type>, error: string>`: the record, or why it could not be decoded.

    Never fails on a bad value: `error` says what was wrong ("bad magic byte ...", "unknown schema
    id N", "corrupt Avro body ...", "invalid UTF-8 in a string field ...") and `value` is null, so the
    caller can fail, skip or dead-letter. A null input gives a null value and a null error.
    """
    reader_schema = _schema_text(reader_schema)
    reached = Registry.of(registry) if registry is not None else None
    value_type = avro_to_spark_type(reader_schema)
    result_type = T.StructType([T.StructField("value", value_type, True), T.StructField("error", T.StringType(), True)])
    arrow_type = spark_to_arrow_type(result_type)

    def decode(values: pa.Array) -> pa.Array:
        records, errors = decode_values(values, reader_schema, reached, lambda _value, _error: None)
        return pa.array([{"value": r, "error": e} for r, e in zip(records, errors, strict=True)], type=arrow_type)

    return F.arrow_udf(decode, result_type)(_column(col))


def to_confluent_avro(col: Column | str, schema: str, registry: RegistrySettings, subject: str) -> Column:
    """Encode a struct column as Confluent-framed Avro with `schema`, registered under `subject` now.

    Registration happens once, on the driver, when this is called (it fails here if the registry
    rejects the schema, e.g. as incompatible); the workers only encode.
    """
    schema = _schema_text(schema)
    schema_id = register_schema(registry, subject, schema)

    def encode(values: pa.Array) -> pa.Array:
        return encode_values(values, schema, schema_id)

    return F.arrow_udf(encode, T.BinaryType())(_column(col))


def _mode(options: dict[str, str] | None) -> str:
    mode = (options or {}).get("mode", "FAILFAST").upper()
    if mode not in MODES:
        raise ValueError(f"option 'mode' must be FAILFAST or PERMISSIVE, got {mode!r}")
    return mode


def _schema_text(schema: AvroSchema) -> str:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    _parse(text)  # fail on the driver, at plan time, not in every task
    return text


def _column(col: Column | str) -> Column:
    return F.col(col) if isinstance(col, str) else col


__all__ = [
    "AvroDecodeError",
    "avro_to_spark_type",
    "decode_confluent_avro",
    "from_confluent_avro",
    "register_schema",
    "to_confluent_avro",
]
