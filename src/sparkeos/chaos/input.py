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
import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaException, Producer

from ..jobs.spec import JobSpec
from ..registry.client import Registry, RegistrySettings

T = TypeVar("T")
# The run's own clients say nothing: their complaints of a broker the run killed are expected, and what matters shows
# in delivery reports and the run's checks.
SILENT_CLIENT = {"log_level": 0}
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

    def __init__(self, spec: JobSpec, seed: int, registry: RegistrySettings | None, topic: str):
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
            if registry is None:
                raise ValueError("an Avro job's input is registered with a schema registry: none was given")
            self._encode = self._avro(spec.format.schema or "", Registry.of(registry), topic)
        else:
            self._encode = lambda: self.values.text().encode()

    def _avro(self, schema_text: str, registry: Registry, topic: str) -> Callable[[], bytes]:
        import fastavro
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

        schema = json.loads(schema_text)
        client = SchemaRegistryClient(registry.confluent_config())
        schema_id = client.register_schema(f"{topic}-value", Schema(schema_text, "AVRO"))
        parsed = fastavro.parse_schema(schema)
        header = b"\x00" + struct.pack(">I", schema_id)

        def encode() -> bytes:
            body = io.BytesIO()
            fastavro.schemaless_writer(body, parsed, _avro_value(self.values, schema))
            return header + body.getvalue()

        return encode

    def records(self, count: int) -> list[tuple[bytes | None, bytes | None]]:
        """The next `count` records, each keyed by its number: librdkafka sends the keyless records of a short burst
        to one partition, and a batch of one partition has one transaction, never half committed."""
        first = self.produced + 1
        return [(str(number).encode(), value) for number, value in enumerate(self.batch(count), start=first)]

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


def call_while_retriable(call: Callable[[], T], timeout_s: float) -> T:
    """`call` (a transactional producer's init, commit or abort), made again while it fails with an error that says
    it may be retried (the broker is away), for up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except KafkaException as failed:
            if not failed.args[0].retriable() or time.monotonic() > deadline:
                raise


def produce_with_retry(producer: Producer, topic: str, value: bytes, on_delivery=None,
                       key: bytes | None = None) -> None:
    """produce(), waiting for room while the producer's queue is full."""
    while True:
        try:
            producer.produce(topic, value, key, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)


class SampleError(ValueError):
    """The job's input topic gave no sample."""


def read_sample(spec: JobSpec, count: int, timeout_s: float = 60.0) -> list[tuple[bytes | None, bytes | None]]:
    """The keys and values of about the last `count` records of the job's own input topic, on the cluster its job
    file names: read only (read_committed, no consumer group joined, nothing committed)."""
    from ..verify import end_offsets, iter_records

    bootstrap, topic = spec.source.get("kafka.bootstrap.servers", ""), spec.source.get("subscribe", "")
    config = {**spec.kafka_client_config(), **SILENT_CLIENT}
    try:
        partitions = len(end_offsets(bootstrap, topic, timeout_s=timeout_s, config=config)) or 1
        records = list(iter_records(bootstrap, topic, timeout_s=timeout_s, config=config,
                                    last=-(-count // partitions)))
    except Exception as error:  # noqa: BLE001 - unreachable, no such topic: said with the cluster's name
        raise SampleError(f"cannot read a sample of {topic} on {bootstrap}: {error}") from error
    if not records:
        raise SampleError(f"the job's input topic {topic} on {bootstrap} has no records to sample")
    return [(record.key, record.value) for record in records[-count:]]


class SampledInput:
    """`records(count)` gives the next `count` of `samples` (keys and values of the job's own input), over and over;
    a record without a key gets its number as key (librdkafka would send a burst of keyless records to one
    partition). Avro values in the Confluent wire format name a schema id of the job's registry: they are framed
    again with the id their writer schema has in the sandbox's registry."""

    def __init__(self, samples: list[tuple[bytes | None, bytes | None]], topic: str,
                 job_registry: Registry | None = None, sandbox_registry: Registry | None = None):
        self.samples = samples
        self.produced = 0
        self.corrupt = 0  # unknown: a sample is what it is
        self._ids: dict[int, bytes] = {}
        if job_registry and sandbox_registry:
            self._ids = _registered_again(samples, job_registry, sandbox_registry, f"{topic}-value")

    def records(self, count: int) -> list[tuple[bytes | None, bytes | None]]:
        taken = []
        for _ in range(count):
            key, value = self.samples[self.produced % len(self.samples)]
            self.produced += 1
            taken.append((key if key is not None else str(self.produced).encode(), self._framed(value)))
        return taken

    def _framed(self, value: bytes | None) -> bytes | None:
        schema_id = _schema_id(value)
        if schema_id not in self._ids:
            return value
        return b"\x00" + self._ids[schema_id] + value[5:]


def _schema_id(value: bytes | None) -> int | None:
    """The schema id of a value in the Confluent wire format (a zero byte, then the id in four bytes)."""
    if value is None or len(value) < 5 or value[0] != 0:
        return None
    return struct.unpack(">I", value[1:5])[0]


def _registered_again(samples: list[tuple[bytes | None, bytes | None]], job_registry: Registry,
                      sandbox_registry: Registry,
                      subject: str) -> dict[int, bytes]:
    """Each schema id the samples' values name in the job's registry -> the id (framed) its schema has once
    registered in the sandbox's; SampleError when one cannot be read or registered. Before the run starts: a schema
    the sandbox cannot take would otherwise stop the input in the middle of it."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    job = SchemaRegistryClient(job_registry.confluent_config())
    sandbox = SchemaRegistryClient(sandbox_registry.confluent_config())
    ids = {}
    for schema_id in sorted({i for _key, value in samples if (i := _schema_id(value)) is not None}):
        try:
            ids[schema_id] = struct.pack(">I", sandbox.register_schema(subject, job.get_schema(schema_id)))
        except Exception as error:  # noqa: BLE001 - the registry's own words
            raise SampleError(f"schema {schema_id} of the sampled records, from {job_registry}, cannot be used in "
                              f"the sandbox's registry: {error}") from error
    return ids
