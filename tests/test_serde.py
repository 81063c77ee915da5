"""sparkeos.serde: Confluent-framed Avro columns in a real local Spark, against the real embedded registry."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkeos.serde import avro_to_spark_type, decode_confluent_avro, from_confluent_avro, to_confluent_avro
from sparkeos.stack import LocalStack

PEOPLE = {
    "type": "record",
    "name": "People",
    "namespace": "demo",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "identifyNumber", "type": ["null", "string"], "default": None},
    ],
}
PEOPLE_TEXT = json.dumps(PEOPLE)
ROWS = [(1, "Ann", "110101199003078515"), (2, None, "12345"), (3, "李雷", None)]


@pytest.fixture
def registry_url(tmp_path: Path) -> Iterator[str]:
    with LocalStack(tmp_path / "broker", schema_registry=True) as stack:
        yield stack.schema_registry_url


def confluent_serialize(registry_url: str, schema: dict, records: list[dict], subject_topic: str) -> list[bytes]:
    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(schema))
    context = SerializationContext(subject_topic, MessageField.VALUE)
    return [serializer(record, context) for record in records]


def binary_frame(spark, values: list[bytes | None]):
    return spark.createDataFrame([(None if v is None else bytearray(v),) for v in values], "v binary")


def people_frame(spark):
    return spark.createDataFrame(ROWS, "id int, name string, identifyNumber string").select(
        F.struct("id", "name", "identifyNumber").alias("person")
    )


def test_round_trip_and_interoperability_with_confluent_serde(spark, registry_url: str) -> None:
    encoded = people_frame(spark).select(
        to_confluent_avro("person", PEOPLE_TEXT, registry_url, "people-value").alias("v")
    )
    values = [bytes(row.v) for row in encoded.collect()]
    client = SchemaRegistryClient({"url": registry_url})
    schema_id = client.get_latest_version("people-value").schema_id
    assert {struct.unpack(">bI", v[:5]) for v in values} == {(0, schema_id)}
    # Confluent's own deserializer reads what sparkeos wrote ...
    deserializer = AvroDeserializer(client)
    context = SerializationContext("people", MessageField.VALUE)
    expected = [{"id": i, "name": n, "identifyNumber": d} for i, n, d in ROWS]
    assert [deserializer(v, context) for v in values] == expected
    # ... and sparkeos reads what Confluent's serializer wrote.
    confluent_values = confluent_serialize(registry_url, PEOPLE, expected, "people")
    decoded = binary_frame(spark, confluent_values).select(
        from_confluent_avro("v", PEOPLE_TEXT, registry_url).alias("p")
    )
    assert decoded.schema["p"].dataType == avro_to_spark_type(PEOPLE_TEXT)
    assert [tuple(row.p) for row in decoded.collect()] == ROWS


def test_writer_schema_resolved_against_the_reader_schema(spark, registry_url: str) -> None:
    writer = {**PEOPLE, "fields": [*PEOPLE["fields"], {"name": "city", "type": "string"}]}
    reader = {
        **PEOPLE,
        "fields": [
            {"name": "id", "type": "long"},  # int -> long promotion
            {"name": "identifyNumber", "type": ["null", "string"], "default": None},
            {"name": "country", "type": "string", "default": "CN"},  # missing in the writer: the default
        ],
    }
    values = confluent_serialize(
        registry_url, writer, [{"id": 7, "name": "Ann", "identifyNumber": "x" * 18, "city": "Beijing"}], "people"
    )
    decoded = binary_frame(spark, values).select(from_confluent_avro("v", json.dumps(reader), registry_url).alias("p"))
    assert decoded.schema["p"].dataType.simpleString() == "struct<id:bigint,identifyNumber:string,country:string>"
    assert [row.p.asDict() for row in decoded.collect()] == [{"id": 7, "identifyNumber": "x" * 18, "country": "CN"}]


def test_permissive_gives_null_and_failfast_fails(spark, registry_url: str) -> None:
    good = confluent_serialize(registry_url, PEOPLE, [{"id": 1, "name": "a", "identifyNumber": None}], "people")[0]
    corrupt = good[:5] + b"\x01"  # the id's varint says "more bytes follow" and none do
    frame = binary_frame(spark, [good, corrupt])
    permissive = frame.select(from_confluent_avro("v", PEOPLE_TEXT, registry_url, {"mode": "PERMISSIVE"}).alias("p"))
    assert [None if row.p is None else row.p.id for row in permissive.collect()] == [1, None]
    failfast = frame.select(from_confluent_avro("v", PEOPLE_TEXT, registry_url, {"mode": "FAILFAST"}).alias("p"))
    with pytest.raises(Exception, match="corrupt Avro body"):
        failfast.collect()
    with pytest.raises(ValueError, match="mode"):
        from_confluent_avro("v", PEOPLE_TEXT, registry_url, {"mode": "DROPMALFORMED"})


def test_decode_errors_name_what_went_wrong(spark, registry_url: str) -> None:
    good = confluent_serialize(registry_url, PEOPLE, [{"id": 1, "name": "ok", "identifyNumber": None}], "people")[0]
    schema_id = struct.unpack(">I", good[1:5])[0]
    header = good[:5]
    # id 1 (zigzag 0x02), name: union branch 1 (0x02), a 2-byte string that is not UTF-8, identifyNumber null.
    bad_utf8 = header + b"\x02" + b"\x02" + b"\x04\xff\xfe" + b"\x00"
    cases = [
        (good, None),
        (b"\x01" + good[1:], "bad magic byte 0x01"),
        (b"\x00\x00\x00\x03\xe7" + good[5:], "unknown schema id 999"),
        (good[:-2], "corrupt Avro body"),
        (good + b"\x00\x00", "corrupt Avro body (schema id"),
        (bad_utf8, "invalid UTF-8 in a string field"),
        (b"\x00\x00", "shorter than the 5-byte Confluent header"),
        (None, None),
    ]
    decoded = binary_frame(spark, [value for value, _ in cases]).select(
        decode_confluent_avro("v", PEOPLE_TEXT, registry_url).alias("r")
    )
    assert decoded.schema["r"].dataType.simpleString() == (
        "struct<value:struct<id:int,name:string,identifyNumber:string>,error:string>"
    )
    rows = decoded.collect()
    assert rows[0].r.value.asDict() == {"id": 1, "name": "ok", "identifyNumber": None}
    assert schema_id > 0
    for row, (_value, expected_error) in zip(rows, cases, strict=True):
        if expected_error is None:
            assert row.r.error is None
        else:
            assert row.r.value is None
            assert expected_error in row.r.error, row.r.error


def test_to_confluent_avro_refuses_an_incompatible_schema_on_the_driver(spark, registry_url: str) -> None:
    to_confluent_avro("person", PEOPLE_TEXT, registry_url, "people-value")
    incompatible = {**PEOPLE, "fields": [*PEOPLE["fields"], {"name": "city", "type": "string"}]}
    with pytest.raises(RuntimeError, match="40.*incompatible|incompatible"):
        to_confluent_avro("person", json.dumps(incompatible), registry_url, "people-value")


def test_logical_types_maps_arrays_round_trip(spark, registry_url: str) -> None:
    schema = {
        "type": "record",
        "name": "Event",
        "fields": [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
            {"name": "counts", "type": {"type": "map", "values": "long"}},
            {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
            {"name": "raw", "type": "bytes"},
        ],
    }
    spark_type = avro_to_spark_type(schema)
    row = (
        datetime(2024, 5, 1, 12, 30, 15, 123000, tzinfo=UTC),
        date(2024, 5, 1),
        Decimal("12.34"),
        {"a": 1, "b": 2},
        ["x", None],
        "B",
        bytearray(b"\x00\xff"),
    )
    frame = spark.createDataFrame([(row,)], T.StructType([T.StructField("e", spark_type)]))
    encoded = frame.select(to_confluent_avro("e", json.dumps(schema), registry_url, "events-value").alias("v"))
    decoded = encoded.select(from_confluent_avro("v", json.dumps(schema), registry_url).alias("e")).collect()[0].e
    assert decoded.at.astimezone(UTC) == row[0]
    assert (decoded.day, decoded.amount, decoded.counts, decoded.tags, decoded.kind, bytes(decoded.raw)) == (
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        bytes(row[6]),
    )


def test_avro_to_spark_type_mapping() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "i", "type": "int"},
            {"name": "l", "type": ["null", "long"]},
            {"name": "f", "type": "float"},
            {"name": "d", "type": "double"},
            {"name": "b", "type": "boolean"},
            {"name": "s", "type": "string"},
            {"name": "raw", "type": "bytes"},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
            {"name": "a", "type": {"type": "array", "items": ["null", "int"]}},
            {"name": "m", "type": {"type": "map", "values": "double"}},
            {"name": "t", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {
                "name": "sub",
                "type": ["null", {"type": "record", "name": "Sub", "fields": [{"name": "x", "type": "int"}]}],
            },
            {"name": "again", "type": "Sub"},
        ],
    }
    mapped = avro_to_spark_type(json.dumps(schema))
    assert mapped.simpleString() == (
        "struct<i:int,l:bigint,f:float,d:double,b:boolean,s:string,raw:binary,e:string,a:array<int>,"
        "m:map<string,double>,t:timestamp,day:date,sub:struct<x:int>,again:struct<x:int>>"
    )
    nullable = {field.name: field.nullable for field in mapped.fields}
    assert nullable["l"] and nullable["sub"] and not nullable["i"] and not nullable["again"]
    assert mapped["a"].dataType.containsNull
    with pytest.raises(ValueError, match="union"):
        avro_to_spark_type({"type": "record", "name": "U", "fields": [{"name": "u", "type": ["int", "string"]}]})
