"""Record batches (magic 2) built byte by byte, malformed ones included.

kafka-python's builder only writes well-formed records; the tests of the broker's record
validation need records whose every length, count and varint is chosen by hand. A record is
given as its fields' bytes (`record_body`) and framed with a length that may lie (`record`);
`batch` wraps records in a header with the CRC-32C a producer computes, so a malformed record
reaches the broker's record checks and not only its CRC check.
"""

from __future__ import annotations

import gzip
import struct
import time

import crc32c

HEADER_SIZE = 61
GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4


def varint(value: int) -> bytes:
    """Zigzag varint, as Kafka writes lengths, deltas and counts in a record."""
    return uvarint((value << 1) ^ (value >> 63))


def uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(data: bytes | None) -> bytes:
    """A nullable bytes field: its varint length (-1 for null), then its bytes."""
    return varint(-1) if data is None else varint(len(data)) + data


def record_body(offset_delta: int, key: bytes | None = None, value: bytes | None = b"v",
                headers: list[tuple[bytes, bytes | None]] | None = None, timestamp_delta: int = 0) -> bytes:
    headers = headers or []
    body = b"\x00" + varint(timestamp_delta) + varint(offset_delta) + field(key) + field(value)
    body += varint(len(headers))
    for header_key, header_value in headers:
        body += field(header_key) + field(header_value)
    return body


def record(body: bytes, length: int | None = None) -> bytes:
    """A record: its length (the body's unless told) as a varint, then the body."""
    return varint(len(body) if length is None else length) + body


def well_formed(count: int, value: bytes = b"v") -> list[bytes]:
    return [record(record_body(i, value=value + str(i).encode())) for i in range(count)]


def compress(codec: int, data: bytes) -> bytes:
    if codec == GZIP:
        return gzip.compress(data)
    if codec == SNAPPY:
        import snappy

        return snappy.compress(data)
    if codec == LZ4:
        import lz4.frame

        return lz4.frame.compress(data)
    if codec == ZSTD:
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    raise ValueError(f"codec {codec}")


def batch(records: list[bytes] | bytes, count: int | None = None, codec: int = 0, attributes: int | None = None,
          producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
          last_offset_delta: int | None = None, compressed_payload: bytes | None = None) -> bytes:
    """A batch holding `records` (joined if a list), compressed with `codec` unless `compressed_payload`
    gives the bytes after the header; `count` and `last_offset_delta` default to what the records are."""
    if isinstance(records, list):
        count = len(records) if count is None else count
        payload = b"".join(records)
    else:
        payload = records
        assert count is not None
    if compressed_payload is not None:
        payload = compressed_payload
    elif codec:
        payload = compress(codec, payload)
    attributes = codec if attributes is None else attributes
    last_offset_delta = count - 1 if last_offset_delta is None else last_offset_delta
    timestamp = int(time.time() * 1000)  # now: a topic's retention.ms (7 days) must not delete the batch
    after_crc = struct.pack(">hiqqqhii", attributes, last_offset_delta, timestamp, timestamp, producer_id,
                            producer_epoch, base_sequence, count) + payload
    length = 4 + 1 + 4 + len(after_crc)  # partition leader epoch, magic, crc
    return struct.pack(">qiibI", 0, length, -1, 2, crc32c.crc32c(after_crc)) + after_crc


def fix_crc(data: bytearray | bytes) -> bytes:
    """The batch with its CRC-32C recomputed over what follows it (after a mutation)."""
    data = bytearray(data)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)
