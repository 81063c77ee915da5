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
compressed ones are decompressed first (compression.py), within `max_uncompressed_bytes`. The reading
itself is record_walk.py's, compiled where the install could.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import record_walk
from .compression import CODEC_NAMES, decompress
from .errors import INVALID_RECORD, UNKNOWN_SERVER_ERROR
from .records import HEADER_SIZE, BatchHeader, InvalidBatch


def source_digest() -> str:
    """The digest setup.py records in the compiled record walk: of record_walk.py and record_walk.pxd (its C types)
    as they were compiled."""
    source = Path(record_walk.__file__)
    return hashlib.sha256(source.read_bytes() + source.with_suffix(".pxd").read_bytes()).hexdigest()


def _compiled_walk():
    """The compiled record walk, unless it was not built (no C compiler at install time) or was built from
    another record_walk.py or .pxd than these (an edit since the last install)."""
    try:
        from . import _record_walk  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        return _record_walk.walk if _record_walk.SOURCE_DIGEST == source_digest() else None
    except OSError:  # an install without the source files: nothing says the module is theirs
        return None


_COMPILED = _compiled_walk()
# Whether produced records are read by the compiled walk (the benchmarks say which).
COMPILED = _COMPILED is not None
_walk = _COMPILED or record_walk.walk


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
