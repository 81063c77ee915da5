"""A dedicated encoder for Fetch responses v4-v12.

kafka-python's generic encoder copies the record bytes of a response into its own buffer, and
the server then copied the body once more to put the frame header in front. Records are nearly
all of a Fetch response, so this encoder returns the body as a list of buffers instead: the
small fields packed together, and each partition's records as the very buffer storage handed
over (a memoryview of one read from the segment file). The server writes them to the socket one
after the other without joining them. tests/broker/test_fetch_encoding.py checks the bytes against
kafka-python's encoder for every version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FIRST_FLEXIBLE_VERSION = 12
NO_PREFERRED_READ_REPLICA = -1

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_TOP_V4 = struct.Struct(">i")  # throttle_time_ms
_TOP_V7 = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION_V4 = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable_offset
_PARTITION_V5 = struct.Struct(">ihqqq")  # ... log_start_offset
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_NO_TAGS = b"\x00"


@dataclass(slots=True)
class FetchedPartition:
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int = -1
    log_start_offset: int = -1
    # (producer_id, first_offset) pairs; None is sent as a null array (read_uncommitted).
    aborted_transactions: list[tuple[int, int]] | None = None
    records: bytes | memoryview = b""


@dataclass(slots=True)
class FetchResult:
    """A Fetch response body; `encode_buffers` turns it into wire bytes for one version."""

    topics: list[tuple[str, list[FetchedPartition]]]
    error_code: int = 0
    session_id: int = 0
    throttle_time_ms: int = 0

    def encode_buffers(self, version: int) -> list[bytes | memoryview]:
        """The body as consecutive buffers: small fields joined, records passed through."""
        if not 4 <= version <= FIRST_FLEXIBLE_VERSION:
            raise ValueError(f"Fetch v{version} is not encoded here")
        flexible = version >= FIRST_FLEXIBLE_VERSION
        parts: list[bytes | memoryview] = []
        head = bytearray()
        if version >= 7:
            head += _TOP_V7.pack(self.throttle_time_ms, self.error_code, self.session_id)
        else:
            head += _TOP_V4.pack(self.throttle_time_ms)
        head += _array_length(len(self.topics), flexible)
        for topic, partitions in self.topics:
            head += _string(topic, flexible)
            head += _array_length(len(partitions), flexible)
            for partition in partitions:
                head = _encode_partition(partition, version, flexible, head, parts)
            if flexible:
                head += _NO_TAGS
        if flexible:
            head += _NO_TAGS
        parts.append(bytes(head))
        return parts


def _encode_partition(
    partition: FetchedPartition, version: int, flexible: bool, head: bytearray, parts: list[bytes | memoryview]
) -> bytearray:
    """Append one partition; returns the buffer the fields that follow go to."""
    if version >= 5:
        head += _PARTITION_V5.pack(
            partition.partition_index,
            partition.error_code,
            partition.high_watermark,
            partition.last_stable_offset,
            partition.log_start_offset,
        )
    else:
        head += _PARTITION_V4.pack(
            partition.partition_index, partition.error_code, partition.high_watermark, partition.last_stable_offset
        )
    aborted = partition.aborted_transactions
    if aborted is None:
        head += _null_array(flexible)
    else:
        head += _array_length(len(aborted), flexible)
        for producer_id, first_offset in aborted:
            head += _ABORTED.pack(producer_id, first_offset)
            if flexible:
                head += _NO_TAGS
    if version >= 11:
        head += _INT32.pack(NO_PREFERRED_READ_REPLICA)
    records = partition.records
    head += _unsigned_varint(len(records) + 1) if flexible else _INT32.pack(len(records))
    if len(records) < SMALL_RECORDS:
        head += records
    else:
        # The records go out as they are; the fields after them start a new buffer.
        parts.append(bytes(head))
        parts.append(records)
        head = bytearray()
    if flexible:
        head += _NO_TAGS
    return head


# Below this many bytes records are cheaper to copy than to send as a buffer of their own.
SMALL_RECORDS = 4096


def _array_length(count: int, flexible: bool) -> bytes:
    return _unsigned_varint(count + 1) if flexible else _INT32.pack(count)


def _null_array(flexible: bool) -> bytes:
    return b"\x00" if flexible else _INT32.pack(-1)


def _string(value: str, flexible: bool) -> bytes:
    data = value.encode()
    return (_unsigned_varint(len(data) + 1) if flexible else _INT16.pack(len(data))) + data


def _unsigned_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
