"""Record batches (magic 2) as bytes: header fields, validation, and the broker's rewrites.

The broker stores batches as the producer sent them. The only bytes it rewrites are those Kafka's
broker rewrites: baseOffset, partitionLeaderEpoch, for LogAppendTime topics maxTimestamp plus the
timestamp-type bit (which changes the CRC), and the records of a batch whose codec is not the one
its topic's compression.type names (recompressed, with the attributes, length and CRC that go with them).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from .errors import CORRUPT_MESSAGE, INVALID_RECORD, UNSUPPORTED_FOR_MESSAGE_FORMAT

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes not counted in batchLength

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")


class InvalidBatch(Exception):
    """A batch Kafka would refuse; `error_code` is the code it answers with, `record_errors` the
    (index in the batch, message) of each record that failed on its own (Produce v8+ reports them)."""

    def __init__(self, error_code: int, message: str, record_errors: list[tuple[int, str]] | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.record_errors = record_errors or []


@dataclass(slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def last_sequence(self) -> int:
        return _add_sequence(self.base_sequence, self.last_offset_delta)


def _add_sequence(sequence: int, delta: int) -> int:
    """Sequences wrap at INT32_MAX back to 0."""
    return (sequence + delta) % (2**31)


def parse_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    return BatchHeader(*_HEADER.unpack_from(buf, pos))


def crc_of(batch: bytes | memoryview) -> int:
    return crc32c.crc32c(batch[21:])


def split_batches(records: bytes | memoryview) -> list[tuple[BatchHeader, memoryview]]:
    """Split a produce request's records into validated batches, or raise InvalidBatch."""
    view = memoryview(records)
    batches: list[tuple[BatchHeader, memoryview]] = []
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < HEADER_SIZE:
            raise InvalidBatch(CORRUPT_MESSAGE, "truncated record batch header")
        magic = view[pos + 16]
        if magic != 2:
            raise InvalidBatch(UNSUPPORTED_FOR_MESSAGE_FORMAT, f"record batch magic {magic} is not 2")
        header = parse_header(view, pos)
        size = header.size
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + size > end:
            raise InvalidBatch(CORRUPT_MESSAGE, "record batch length exceeds the request")
        batch = view[pos : pos + size]
        if crc_of(batch) != header.crc:
            raise InvalidBatch(CORRUPT_MESSAGE, "record batch CRC-32C mismatch")
        if header.records_count <= 0 or header.last_offset_delta != header.records_count - 1:
            raise InvalidBatch(INVALID_RECORD, "lastOffsetDelta does not match the record count")
        if header.is_control:
            raise InvalidBatch(INVALID_RECORD, "clients may not produce control batches")
        if header.producer_id >= 0 and header.base_sequence < 0:
            raise InvalidBatch(INVALID_RECORD, f"Invalid sequence number {header.base_sequence} in record batch "
                                               f"with producerId {header.producer_id}")
        batches.append((header, batch))
        pos += size
    if not batches:
        raise InvalidBatch(CORRUPT_MESSAGE, "no record batch in the request")
    return batches


def with_records(batch: bytes | memoryview, codec: int, records: bytes, count: int | None = None) -> bytearray:
    """`batch` with its records replaced by `records` (compressed with `codec`, 0 for none): the same header
    fields (offsets, last offset delta, timestamps, producer, sequence), its compression bits, length and CRC
    rewritten, and its record count when `count` is given (compaction keeps some of the records)."""
    out = bytearray(HEADER_SIZE + len(records))
    out[:HEADER_SIZE] = batch[:HEADER_SIZE]
    out[HEADER_SIZE:] = records
    _INT32.pack_into(out, 8, len(out) - LOG_OVERHEAD)
    if count is not None:
        _INT32.pack_into(out, 57, count)
    attributes = struct.unpack_from(">h", out, 21)[0] & ~ATTR_COMPRESSION_MASK | codec
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return out


def stamp_batch(
    batch: memoryview, base_offset: int, leader_epoch: int, log_append_time: int | None
) -> memoryview | bytearray:
    """The batch with the fields the broker owns rewritten.

    In place when `batch` is writable: a received request frame belongs to the broker, and
    stamping it where it lies spares a copy of every produced byte. A read-only batch is copied.
    """
    out = bytearray(batch) if batch.readonly else batch
    _INT64.pack_into(out, 0, base_offset)
    _INT32.pack_into(out, 12, leader_epoch)
    if log_append_time is not None:
        attributes = struct.unpack_from(">h", out, 21)[0] | ATTR_TIMESTAMP_TYPE
        struct.pack_into(">h", out, 21, attributes)
        _INT64.pack_into(out, 35, log_append_time)
        struct.pack_into(">I", out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return out


def build_control_batch(
    base_offset: int,
    producer_id: int,
    producer_epoch: int,
    control_type: int,
    coordinator_epoch: int,
    timestamp_ms: int,
    leader_epoch: int = 0,
) -> bytes:
    """One transaction marker (COMMIT or ABORT), laid out as Kafka writes it."""
    key = struct.pack(">hh", 0, control_type)
    value = struct.pack(">hi", 0, coordinator_epoch)
    record_body = (
        b"\x00"  # record attributes
        + _varint(0)  # timestamp delta
        + _varint(0)  # offset delta
        + _varint(len(key))
        + key
        + _varint(len(value))
        + value
        + _varint(0)  # header count
    )
    record = _varint(len(record_body)) + record_body
    attributes = ATTR_TRANSACTIONAL | ATTR_CONTROL
    after_crc = struct.pack(
        ">hiqqqhii", attributes, 0, timestamp_ms, timestamp_ms, producer_id, producer_epoch, -1, 1
    ) + record
    crc = crc32c.crc32c(after_crc)
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, batch_length, leader_epoch, 2, crc) + after_crc


def _varint(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = encoded & 0x7F
        encoded >>= 7
        if encoded:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
