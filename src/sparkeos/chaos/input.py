"""The sandbox's input: records generated from the job's own format (its JSON schema, its Avro reader schema in the
Confluent wire format, or plain strings), from one seed.

Values are drawn so that a job's filters keep some and drop some: integers between 0 and 99 (a field named `id`
counts up, so records stay apart), strings from a small pool of lengths 1 to 20 (few enough distinct values for a
directory partitioned by them), and a null now and then where the schema allows one. A few records the format cannot
decode are mixed in when the job skips or dead-letters bad records.
"""

from __future__ import annotations

import io
import json
import random
import string
import struct
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from ..jobs.spec import JobSpec

STRING_POOL = 12
CORRUPT_VALUE = b"\x00\x00not decodable"
CORRUPT_EVERY = 500  # one record the format cannot decode per this many, when the job keeps going past them
SPARK_INTEGERS = {"int", "integer", "bigint", "long", "smallint", "short", "tinyint", "byte"}
SPARK_FRACTIONS = {"double", "float", "real"}


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def ddl_fields(ddl: str) -> list[tuple[str, str]]:
    """(name, lower-case type) of each top-level field of a Spark DDL string such as 'id INT, name STRING'."""
    fields = []
    for part in _split_top_level(ddl):
        if part.startswith("`"):
            name, _, rest = part[1:].partition("`")
        else:
            name, _, rest = part.partition(" ")
        type_name = rest.strip().split(" ")[0].lower() if rest.strip() else "string"
        fields.append((name, type_name))
    return fields


class Values:
    """The draws every format shares."""

    def __init__(self, seed: int):
        self.random = random.Random(seed)
        lengths = [1 + (i * 19) // (STRING_POOL - 1) for i in range(STRING_POOL)]
        self.strings = ["".join(self.random.choice(string.ascii_lowercase + string.digits) for _ in range(n))
                        for n in lengths]
        self.next_id = 0

    def integer(self, name: str) -> int:
        if name.lower() == "id":
            self.next_id += 1
            return self.next_id
        return self.random.randrange(100)

    def text(self) -> str:
        return self.random.choice(self.strings)

    def fraction(self) -> float:
        return round(self.random.uniform(0, 100), 3)

    def null(self) -> bool:
        return self.random.random() < 0.1


def _spark_value(values: Values, name: str, type_name: str) -> Any:
    base = type_name.split("(")[0].split("<")[0]
    if base in SPARK_INTEGERS:
        return values.integer(name)
    if base in SPARK_FRACTIONS or base == "decimal":
        return values.fraction()
    if base in ("string", "varchar", "char"):
        return values.text()
    if base == "boolean":
        return values.random.random() < 0.5
    if base == "date":
        return f"2026-{values.random.randint(1, 12):02d}-{values.random.randint(1, 28):02d}"
    if base == "timestamp":
        return f"2026-11-{values.random.randint(1, 28):02d}T{values.random.randint(0, 23):02d}:00:00Z"
    return None  # arrays, maps, structs: null, which every Spark type takes


def _avro_value(values: Values, schema: Any, name: str = "") -> Any:
    if isinstance(schema, list):  # a union: null now and then, else its first other branch
        others = [branch for branch in schema if branch != "null"]
        if ("null" in schema and values.null()) or not others:
            return None
        return _avro_value(values, others[0], name)
    kind = schema["type"] if isinstance(schema, dict) else schema
    if isinstance(kind, (dict, list)):
        return _avro_value(values, kind, name)
    if kind == "record":
        return {field["name"]: _avro_value(values, field["type"], field["name"]) for field in schema["fields"]}
    if kind in ("int", "long"):
        return values.integer(name)
    if kind in ("float", "double"):
        return values.fraction()
    if kind == "string":
        return values.text()
    if kind == "boolean":
        return values.random.random() < 0.5
    if kind == "bytes":
        return values.text().encode()
    if kind == "enum":
        return values.random.choice(schema["symbols"])
    if kind == "array":
        return [_avro_value(values, schema["items"], name) for _ in range(values.random.randrange(3))]
    if kind == "map":
        return {values.text(): _avro_value(values, schema["values"], name) for _ in range(values.random.randrange(3))}
    if kind == "fixed":
        return bytes(values.random.randrange(256) for _ in range(schema["size"]))
    return None


class InputGenerator:
    """`batch(count)` gives the next `count` record values of the job's format."""

    def __init__(self, spec: JobSpec, seed: int, registry_url: str | None, topic: str):
        self.values = Values(seed)
        self.with_corrupt = spec.bad_records.policy in ("skip", "dead-letter")
        self.produced = 0
        self.corrupt = 0
        self._encode: Callable[[], bytes]
        if spec.format.type == "json":
            fields = ddl_fields(spec.format.schema or "")
            self._encode = lambda: json.dumps({name: _spark_value(self.values, name, kind)
                                               for name, kind in fields}).encode()
        elif spec.format.type == "avro":
            self._encode = self._avro(spec.format.schema or "", registry_url or "", topic)
        else:
            self._encode = lambda: self.values.text().encode()

    def _avro(self, schema_text: str, registry_url: str, topic: str) -> Callable[[], bytes]:
        import fastavro
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

        schema = json.loads(schema_text)
        registry = SchemaRegistryClient({"url": registry_url})
        schema_id = registry.register_schema(f"{topic}-value", Schema(schema_text, "AVRO"))
        parsed = fastavro.parse_schema(schema)
        header = b"\x00" + struct.pack(">I", schema_id)

        def encode() -> bytes:
            body = io.BytesIO()
            fastavro.schemaless_writer(body, parsed, _avro_value(self.values, schema))
            return header + body.getvalue()

        return encode

    def batch(self, count: int) -> list[bytes]:
        records = []
        for _ in range(count):
            self.produced += 1
            if self.with_corrupt and self.produced % CORRUPT_EVERY == 0:
                self.corrupt += 1
                records.append(CORRUPT_VALUE)
            else:
                records.append(self._encode())
        return records


def produce_with_retry(producer: Producer, topic: str, value: bytes, on_delivery=None,
                       key: bytes | None = None) -> None:
    """produce(), waiting for room while the producer's queue is full."""
    while True:
        try:
            producer.produce(topic, value, key, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)
