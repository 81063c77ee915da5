"""Spark SQL types as PostgreSQL column types: the type `createTable` creates, the table types a column may
have, and each value as psycopg writes it."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from psycopg.types.json import Jsonb
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ..json_text import json_text

# The type createTable gives a column, and the types (as format_type names them) an existing column may have.
_SCALARS: list[tuple[type[DataType], str, tuple[str, ...]]] = [
    (ByteType, "smallint", ("smallint", "integer", "bigint")),
    (ShortType, "smallint", ("smallint", "integer", "bigint")),
    (IntegerType, "integer", ("integer", "bigint")),
    (LongType, "bigint", ("bigint",)),
    (FloatType, "real", ("real", "double precision")),
    (DoubleType, "double precision", ("double precision",)),
    (StringType, "text", ("text", "character varying")),
    (BinaryType, "bytea", ("bytea",)),
    (BooleanType, "boolean", ("boolean",)),
    (DateType, "date", ("date",)),
    (TimestampType, "timestamp with time zone", ("timestamp with time zone",)),
    (TimestampNTZType, "timestamp without time zone", ("timestamp without time zone",)),
]
JSON_TYPES = ("jsonb", "json")


class UnsupportedColumnType(ValueError):
    """A column whose Spark type has no PostgreSQL type here."""


def _element(data_type: DataType) -> tuple[DataType, int]:
    depth = 0
    while isinstance(data_type, ArrayType):
        data_type, depth = data_type.elementType, depth + 1
    return data_type, depth


def postgres_type(data_type: DataType, column: str) -> str:
    """The PostgreSQL type createTable gives a column of ``data_type``: arrays of any depth are one array type,
    as PostgreSQL's arrays have any number of dimensions."""
    base, depth = _element(data_type)
    if isinstance(base, DecimalType):
        name = f"numeric({base.precision},{base.scale})"
    elif isinstance(base, (StructType, MapType)):
        name = "jsonb"
    else:
        name = next((pg for spark, pg, _ in _SCALARS if isinstance(base, spark)), "")
        if not name:
            raise UnsupportedColumnType(f"column {column!r} has type {data_type.simpleString()}, which the "
                                        "sparkeos.postgres sink cannot write; cast it to a supported type")
    return name + ("[]" if depth else "")


def accepts(data_type: DataType, table_type: str) -> bool:
    """Whether a table column of ``table_type`` (format_type's name) holds every value of ``data_type``."""
    base, depth = _element(data_type)
    if depth:
        if not table_type.endswith("[]"):
            return False
        table_type = table_type.rstrip("[]")
    elif table_type.endswith("[]"):
        return False
    if isinstance(base, DecimalType):
        if table_type == "numeric":
            return True
        if not table_type.startswith("numeric("):
            return False
        precision, _, scale = table_type[len("numeric("):-1].partition(",")
        return int(scale or 0) == base.scale and int(precision) - int(scale or 0) >= base.precision - base.scale
    if isinstance(base, (StructType, MapType)):
        return table_type in JSON_TYPES
    table_base = table_type.split("(", 1)[0]
    return any(isinstance(base, spark) and table_base in allowed for spark, _, allowed in _SCALARS)


def converter(data_type: DataType) -> Callable[[Any], Any] | None:
    """What turns a value of ``data_type``, as pyarrow's to_pylist gives it, into what psycopg writes; None when
    it is written as it is."""
    if isinstance(data_type, ArrayType):
        inner = converter(data_type.elementType)
        if inner is None:
            return None
        return lambda values: None if values is None else [inner(v) for v in values]
    if isinstance(data_type, (StructType, MapType)):
        return lambda value: None if value is None else Jsonb(value, dumps=json_text)
    if isinstance(data_type, TimestampType):
        return _aware
    return None


def _aware(value: datetime.datetime | None) -> datetime.datetime | None:
    # Spark's timestamps are instants; one handed over without a zone is in UTC.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=datetime.UTC)
