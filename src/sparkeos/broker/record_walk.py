"""Reading every record of an uncompressed (or decompressed) batch: the hot path of record_validation.

This module is plain Python, and also compiled: where a C compiler is there at install time, setup.py builds
`_record_walk` from this very file with Cython, typing its variables as record_walk.pxd declares, and
record_validation uses the compiled module while its recorded digest of the two files is still theirs. The
checks, their order and their messages are the same in both; tests/broker/test_record_validation.py runs every
malformed shape through both and compares them.
"""

from __future__ import annotations

from .errors import INVALID_RECORD
from .records import InvalidBatch

# The shortest record: a length and six fields of one byte each (attributes, timestamp delta, offset
# delta, key length, value length, header count).
MIN_RECORD_SIZE = 7


def _invalid(message: str) -> InvalidBatch:
    return InvalidBatch(INVALID_RECORD, message)


def walk(data, pos: int, end: int, count: int, compacted: bool) -> list[int]:
    """Read `count` records from data[pos:end], which they must fill exactly; the indexes of keyless ones
    when `compacted`.

    The hot path of every produce, so written for CPython's speed rather than for reading: varints of one
    and two bytes (nearly every length and delta) are decoded inline, and a read past the end of `data`
    surfaces as IndexError (from CPython's bytes and memoryview, or from the compiled module's bounds
    checks) instead of being checked field by field. A read past the end of one record
    into the next cannot pass: the record must end exactly where its length says."""
    if count * MIN_RECORD_SIZE > end - pos:
        raise _invalid(f"Incorrect declared batch size: {count} records cannot fit in {end - pos} bytes")
    keyless: list[int] = []
    twice = 0
    try:
        # `twice` is the record's index zigzag-encoded (index * 2), the varint its offset delta must be:
        # compared byte by byte for deltas of up to three bytes. The index itself is needed only on the rare
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
            elif data[pos + 3] < 0x80:
                pos += 4
            else:
                _, pos = _varint(data, pos + 1, 64)
            if twice < 0x80 and data[pos] == twice:
                pos += 1
            elif twice < 0x4000 and data[pos] == twice & 0x7F | 0x80 and data[pos + 1] == twice >> 7:
                pos += 2
            elif (twice < 0x200000 and data[pos] == twice & 0x7F | 0x80 and data[pos + 1] == twice >> 7 & 0x7F | 0x80
                  and data[pos + 2] == twice >> 14):
                pos += 3
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
    """A zigzag varint of an int32 or int64 (`bits`): at most 5 or 10 bytes, and no value bits past `bits`.

    In the compiled form `value` is a 64-bit C integer, which drops what the tenth byte of an int64's varint
    shifts past its 64 bits: such a varint is refused here either way, so both forms answer alike."""
    value = 0
    shift = 0
    while shift < bits:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if shift == 63 and byte > 1 or bits == 32 and value >> 32:
                raise _invalid(f"Found invalid record structure: varint overflows {bits} bits")
            decoded = (value >> 1) ^ -(value & 1)
            return decoded, pos
        shift += 7
    raise _invalid(f"Found invalid record structure: varint of more than {(bits + 6) // 7} bytes")
