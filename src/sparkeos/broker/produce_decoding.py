"""A dedicated decoder for Produce request bodies v3-v9.

kafka-python's generic decoder copies each partition's records out of the request into bytes of
their own. Records are nearly all of a Produce request, so this decoder returns them as
memoryview slices of the body it is given instead: the broker stamps offsets into that buffer in
place and writes it to the log from there, and the records are never copied on the way. Kafka
closes the connection on a request it cannot read, so any malformed body raises MalformedRequest
naming the field rather than letting an IndexError or struct.error escape.
tests/broker/test_produce_decoding.py checks the result against kafka-python's decoder for every version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .protocol import MalformedRequest, read_unsigned_varint

MIN_VERSION = 3
FIRST_FLEXIBLE_VERSION = 9
MAX_VERSION = 9

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


@dataclass(slots=True)
class PartitionProduceData:
    index: int
    # A slice of the body passed in, never a copy; None for a null (length -1).
    records: memoryview | None


@dataclass(slots=True)
class TopicProduceData:
    name: str
    partition_data: list[PartitionProduceData]


@dataclass(slots=True)
class ProduceRequestData:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


def decode_produce_request(body: memoryview, version: int) -> ProduceRequestData:
    """Decode a Produce request body (the bytes after the request header) of `version`."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise MalformedRequest(f"Produce v{version} is not decoded here")
    reader = _Reader(body if isinstance(body, memoryview) else memoryview(body), version)
    transactional_id = reader.string("transactional_id", nullable=True)
    acks, timeout_ms = reader.unpack(_ACKS_TIMEOUT, "acks/timeout_ms")
    topic_data = []
    for _ in range(reader.array_length("topic_data")):
        name = reader.string("topic_data.name", nullable=False)
        partition_data = []
        for _ in range(reader.array_length("topic_data.partition_data")):
            (index,) = reader.unpack(_INT32, "topic_data.partition_data.index")
            records = reader.nullable_bytes("topic_data.partition_data.records")
            reader.skip_tagged_fields("topic_data.partition_data")
            partition_data.append(PartitionProduceData(index, records))
        reader.skip_tagged_fields("topic_data")
        topic_data.append(TopicProduceData(name, partition_data))
    reader.skip_tagged_fields("request")
    # Bytes after the body are ignored, as Kafka's generated readers and the generic decoder do.
    return ProduceRequestData(transactional_id, acks, timeout_ms, topic_data)


class _Reader:
    """A position in the body; every read checks the bounds first and names its field when it fails."""

    __slots__ = ("buf", "pos", "end", "version", "flexible")

    def __init__(self, buf: memoryview, version: int) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.version = version
        self.flexible = version >= FIRST_FLEXIBLE_VERSION

    def fail(self, field: str, problem: str) -> MalformedRequest:
        return MalformedRequest(f"Produce v{self.version}: {field} {problem}")

    def take(self, size: int, field: str) -> memoryview:
        start = self.pos
        if start + size > self.end:
            raise self.fail(field, f"runs past the end of the body ({size} bytes at offset {start} of {self.end})")
        self.pos = start + size
        return self.buf[start : self.pos]

    def unpack(self, fmt: struct.Struct, field: str) -> tuple[int, ...]:
        start = self.pos
        if start + fmt.size > self.end:
            raise self.fail(field, "is truncated")
        self.pos = start + fmt.size
        return fmt.unpack_from(self.buf, start)

    def uvarint(self, field: str) -> int:
        try:
            value, self.pos = read_unsigned_varint(self.buf, self.pos)
        except MalformedRequest as e:
            raise self.fail(field, f"has a bad length ({e})") from None
        return value

    def length(self, field: str, prefix: struct.Struct) -> int:
        """A length or count prefix, -1 meaning null: compact (uvarint of n + 1) in flexible versions.

        Like Kafka's generated readers, any negative length reads as null."""
        if self.flexible:
            return self.uvarint(field) - 1
        (size,) = self.unpack(prefix, field)
        return max(size, -1)

    def string(self, field: str, nullable: bool) -> str | None:
        size = self.length(field, _INT16)
        if size == -1:
            if nullable:
                return None
            raise self.fail(field, "is null")
        if size > 0x7FFF:
            raise self.fail(field, f"has invalid length {size}")  # Kafka's limit for every string
        try:
            return str(self.take(size, field), "utf-8")
        except UnicodeDecodeError:
            raise self.fail(field, "is not valid UTF-8") from None

    def nullable_bytes(self, field: str) -> memoryview | None:
        size = self.length(field, _INT32)
        return None if size == -1 else self.take(size, field)

    def array_length(self, field: str) -> int:
        # No array in a Produce request is nullable; Kafka refuses a null one.
        count = self.length(field, _INT32)
        if count == -1:
            raise self.fail(field, "is null")
        return count

    def skip_tagged_fields(self, struct_name: str) -> None:
        # No tagged fields are defined for Produce v9; unknown ones are skipped, as Kafka does.
        if not self.flexible:
            return
        field = f"{struct_name} tagged fields"
        for _ in range(self.uvarint(field)):
            self.uvarint(field)
            self.take(self.uvarint(field), field)
