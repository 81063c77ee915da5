"""Every record of a produced batch, checked before the batch is appended (Kafka's LogValidator).

Kafka reads each record of a batch a client appends (DefaultRecord.readFrom, or readPartiallyFrom
through the decompressing stream of a compressed batch) and refuses the batch with INVALID_RECORD
when one cannot be read: a record length that runs past the batch or that the record's fields do
not fill exactly, a bad varint, a negative header count or header key length, fewer records than
the batch header counts, or bytes after the last one. On a compacted topic a record without a key
fails the batch too, reported per record (`record_errors`).

These checks are stricter than Kafka's, because this broker serves batches exactly as they arrived
and Kafka's leniency there would reach consumers that cannot read the result, or read it otherwise:
- a record's offset delta must be its index in the batch (Kafka rewrites a compressed batch whose
  deltas are not, and stores an uncompressed one as it is);
- key, value and header value lengths must be -1 (null) or more (Kafka reads any negative length
  as null; librdkafka stops reading the partition at such a record, with no error), and varints
  must fit their 32 or 64 bits (Kafka drops the extra bits, Python clients keep them);
- a record's attributes byte (unused in v2) must be below 0x80: kafka-python and aiokafka read it
  as a varint, and one with its high bit set takes the next byte with it;
- a header key must be UTF-8 (Kafka's String type; Kafka replaces what does not decode,
  kafka-python fails on it).

Uncompressed batches, nearly all of what clients send, are checked in place on the received bytes;
compressed ones are decompressed first (compression.py), within `max_uncompressed_bytes`.
"""

from __future__ import annotations

from .compression import CODEC_NAMES, decompress
from .errors import INVALID_RECORD, UNKNOWN_SERVER_ERROR
from .records import HEADER_SIZE, BatchHeader, InvalidBatch

# The shortest record: a length and six fields of one byte each (attributes, timestamp delta, offset
# delta, key length, value length, header count).
MIN_RECORD_SIZE = 7


def validate_records(header: BatchHeader, batch: memoryview, compacted: bool, max_uncompressed_bytes: int,
                     partition_name: str) -> bytes | memoryview:
    """Raise InvalidBatch unless every record of `batch` (a whole batch whose header is valid) can be read; return
    the records, uncompressed."""
    codec = header.compression
    count = header.records_count
    if codec == 0:
        records: bytes | memoryview = batch[HEADER_SIZE:]
        keyless = _walk(batch, HEADER_SIZE, len(batch), count, compacted)
    else:
        if codec not in CODEC_NAMES:
            # Kafka fails on it in CompressionType.forId, with an exception it answers as an unknown error.
            raise InvalidBatch(UNKNOWN_SERVER_ERROR, f"Unknown compression type id: {codec}")
        records = decompress(codec, batch[HEADER_SIZE:], max_uncompressed_bytes)
        keyless = _walk(records, 0, len(records), count, compacted)
    if keyless:
        message = f"Compacted topic cannot accept message without key in topic partition {partition_name}"
        shown = ", ".join(f"RecordError(batchIndex={index}, message='{message}')" for index in keyless[:3])
        raise InvalidBatch(
            INVALID_RECORD,
            f"One or more records have been rejected due to {len(keyless)} record errors in total, and only "
            f"showing the first three errors at most: [{shown}]",
            record_errors=[(index, message) for index in keyless],
        )
    return records


def _invalid(message: str) -> InvalidBatch:
    return InvalidBatch(INVALID_RECORD, message)


def _walk(data, pos: int, end: int, count: int, compacted: bool) -> list[int]:
    """Read `count` records from data[pos:end], which they must fill exactly; the indexes of keyless ones
    when `compacted`.

    The hot path of every produce, so written for CPython's speed rather than for reading: varints of one
    and two bytes (nearly every length and delta) are decoded inline, and a read past the end of `data`
    surfaces as IndexError instead of being checked field by field. A read past the end of one record
    into the next cannot pass: the record must end exactly where its length says."""
    if count * MIN_RECORD_SIZE > end - pos:
        raise _invalid(f"Incorrect declared batch size: {count} records cannot fit in {end - pos} bytes")
    keyless: list[int] = []
    twice = 0
    try:
        # `twice` is the record's index zigzag-encoded (index * 2), the varint its offset delta must be:
        # compared byte by byte for one- and two-byte deltas. The index itself is needed only on the rare
        # paths, as twice >> 1.
        for twice in range(0, count << 1, 2):
            byte = data[pos]
            if byte < 0x80:
                if byte & 1:
                    raise _invalid(f"Invalid record size {-(byte + 1) >> 1}")
                size = byte >> 1
                pos += 1
            else:
                low = data[pos + 1]
                if low < 0x80:
                    size = (byte & 0x7F) | low << 7
                    if size & 1:
                        raise _invalid(f"Invalid record size {-(size + 1) >> 1}")
                    size >>= 1
                    pos += 2
                else:
                    size, pos = _varint(data, pos, 32)
                    if size < 0:
                        raise _invalid(f"Invalid record size {size}")
            stop = pos + size
            if stop > end:
                raise _invalid(f"Invalid record size: expected {size} bytes in record payload, but instead the "
                               f"buffer has only {end - pos} remaining bytes.")
            if data[pos] >= 0x80:
                raise _invalid(f"record {twice >> 1} has attributes {data[pos]:#04x}")
            # The timestamp delta after the attributes byte: any value.
            if data[pos + 1] < 0x80:
                pos += 2
            elif data[pos + 2] < 0x80:
                pos += 3
            else:
                _, pos = _varint(data, pos + 1, 64)
            if twice < 0x80 and data[pos] == twice:
                pos += 1
            elif twice < 0x4000 and data[pos] == twice & 0x7F | 0x80 and data[pos + 1] == twice >> 7:
                pos += 2
            else:
                delta, pos = _varint(data, pos, 32)
                if delta != twice >> 1:
                    raise _invalid(f"record {twice >> 1} has offset delta {delta}")
            byte = data[pos]  # key length
            if byte == 1:  # null
                if compacted:
                    keyless.append(twice >> 1)
                pos += 1
            elif byte < 0x80:
                if byte & 1:
                    raise _invalid(f"record {twice >> 1} has key length {-(byte + 1) >> 1}")
                pos += 1 + (byte >> 1)
            else:
                length, pos = _varint(data, pos, 32)
                if length < 0:
                    raise _invalid(f"record {twice >> 1} has key length {length}")
                pos += length
            byte = data[pos]  # value length
            if byte >= 0x80:
                low = data[pos + 1]
                if low < 0x80:
                    length = (byte & 0x7F) | low << 7
                    if length & 1:
                        raise _invalid(f"record {twice >> 1} has value length {-(length + 1) >> 1}")
                    pos += 2 + (length >> 1)
                else:
                    length, pos = _varint(data, pos, 32)
                    if length < -1:
                        raise _invalid(f"record {twice >> 1} has value length {length}")
                    if length > 0:
                        pos += length
            elif byte & 1:
                if byte != 1:
                    raise _invalid(f"record {twice >> 1} has value length {-(byte + 1) >> 1}")
                pos += 1
            else:
                pos += 1 + (byte >> 1)
            if pos + 1 == stop and not data[pos]:  # no headers, the end of the record
                pos = stop
                continue
            byte = data[pos]  # header count
            if byte < 0x80 and not byte & 1:
                pos = _headers(data, pos + 1, stop, byte >> 1)
            else:
                headers, pos = _varint(data, pos, 32)
                pos = _headers(data, pos, stop, headers)
            if pos != stop:
                raise _invalid(f"Invalid record size: expected to read {size} bytes in record payload, but instead "
                               f"read {size + pos - stop}")
    except IndexError:
        raise _invalid(f"Found invalid record structure: record {twice >> 1} runs past the end of the "
                       "batch") from None
    if pos != end:
        raise _invalid("Incorrect declared batch size, records still remaining in file")
    return keyless


def _headers(data, pos: int, stop: int, count: int) -> int:
    if count < 0:
        raise _invalid(f"Found invalid number of record headers {count}")
    if count > stop - pos:
        raise _invalid(f"Found invalid number of record headers. {count} is larger than the remaining size of the "
                       "buffer")
    for _ in range(count):
        byte = data[pos]  # key length: never null
        if byte < 0x80 and not byte & 1:
            length = byte >> 1
            pos += 1
        else:
            length, pos = _varint(data, pos, 32)
            if length < 0:
                raise _invalid(f"Invalid negative header key size {length}")
        if length:
            try:
                str(data[pos : pos + length], "utf-8")
            except UnicodeDecodeError:
                raise _invalid(f"header key {bytes(data[pos : pos + length])!r} is not UTF-8") from None
            pos += length
        byte = data[pos]  # value length
        if byte < 0x80 and (not byte & 1 or byte == 1):
            pos += 1 + (byte >> 1)
        else:
            length, pos = _varint(data, pos, 32)
            if length < -1:
                raise _invalid(f"header value length {length}")
            if length > 0:
                pos += length
    return pos


def _varint(data, pos: int, bits: int) -> tuple[int, int]:
    """A zigzag varint of an int32 or int64 (`bits`): at most 5 or 10 bytes, and no value bits past `bits`."""
    value = 0
    shift = 0
    while shift < bits:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value >> bits:
                raise _invalid(f"Found invalid record structure: varint {value} overflows {bits} bits")
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
    raise _invalid(f"Found invalid record structure: varint of more than {(bits + 6) // 7} bytes")
