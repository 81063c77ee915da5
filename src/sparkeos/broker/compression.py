"""Decompressing a produced batch's records to validate them, and compressing them again for a topic whose
`compression.type` names another codec than the producer's.

Kafka's codec ids: 1 gzip (any number of members), 2 snappy (raw, or in xerial's framing as the Java
client writes it), 3 lz4 (frames), 4 zstd (frames). Compressed here as Kafka's broker compresses: gzip
streams, snappy in xerial's framing with 32 KiB blocks, lz4 frames of independent 64 KiB blocks with no
checksums but the header's (what Kafka's own lz4 reader takes), zstd frames.

The output is bounded: a batch whose records decompress to more than `limit` bytes is refused with
MESSAGE_TOO_LARGE before more than about that much has been produced, whatever the ratio. A stream
that cannot be decompressed is refused with UNKNOWN_SERVER_ERROR, Kafka's answer to the exception
its decompressing reader throws then.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import lz4.frame as _lz4
import snappy as _snappy
import zstandard as _zstd

from .errors import MESSAGE_TOO_LARGE, UNKNOWN_SERVER_ERROR
from .records import InvalidBatch

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
CODEC_NAMES = {0: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
# A topic's compression.type: the codec its batches are stored in, None for `producer` (as sent).
TOPIC_CODECS = {"uncompressed": 0, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD, "producer": None}
XERIAL_BLOCK_SIZE = 32 * 1024
XERIAL_VERSION = 1

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER_SIZE = 16  # magic, then the version and the minimum compatible version (int32 each)
# zstd gives no bound on the output of one call: its input is fed in slices this small, so the
# output of a call stays within a few MiB however well the slice compresses.
ZSTD_INPUT_SLICE = 256


class _Output:
    """Decompressed chunks, refusing to grow past `limit` bytes."""

    __slots__ = ("chunks", "size", "limit")

    def __init__(self, limit: int) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit

    @property
    def room(self) -> int:
        """How much more may be asked for: one byte past the limit shows it was exceeded."""
        return self.limit - self.size + 1

    def check(self, more: int) -> None:
        if self.size + more > self.limit:
            raise InvalidBatch(MESSAGE_TOO_LARGE, f"the records of the batch decompress to more than {self.limit} "
                                                  "bytes")

    def add(self, chunk: bytes) -> None:
        self.check(len(chunk))
        self.size += len(chunk)
        self.chunks.append(chunk)

    def join(self) -> bytes:
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)


def _corrupt(codec: int, problem: str) -> InvalidBatch:
    return InvalidBatch(UNKNOWN_SERVER_ERROR, f"Failed to decompress record stream ({CODEC_NAMES[codec]}): {problem}")


def _gzip(data: bytes, out: _Output) -> None:
    while True:
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out.add(stream.decompress(data, out.room))
            while stream.unconsumed_tail and not stream.eof:
                out.add(stream.decompress(stream.unconsumed_tail, out.room))
        except zlib.error as exc:
            raise _corrupt(GZIP, str(exc)) from None
        if not stream.eof:
            raise _corrupt(GZIP, "the stream is truncated")
        data = stream.unused_data
        # Another member may follow; zero padding after the last one is tolerated, as by Python's gzip module.
        if not data.strip(b"\x00"):
            return


def _raw_snappy(block: bytes, out: _Output) -> None:
    # A raw snappy block starts with its uncompressed length (a varint): checked before decompressing.
    length, shift = 0, 0
    for position in range(min(5, len(block))):
        byte = block[position]
        length |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    else:
        raise _corrupt(SNAPPY, "bad block length")
    out.check(length)
    try:
        out.add(_snappy.decompress(block))
    except Exception as exc:  # python-snappy raises several types for bad input
        raise _corrupt(SNAPPY, str(exc) or type(exc).__name__) from None


def _snappy_stream(data: bytes, out: _Output) -> None:
    if not data.startswith(XERIAL_MAGIC):
        _raw_snappy(data, out)
        return
    position = XERIAL_HEADER_SIZE
    if len(data) < position:
        raise _corrupt(SNAPPY, "truncated xerial header")
    while position < len(data):
        if position + 4 > len(data):
            raise _corrupt(SNAPPY, "truncated xerial block length")
        size = int.from_bytes(data[position : position + 4], "big", signed=True)
        position += 4
        if size < 0 or position + size > len(data):
            raise _corrupt(SNAPPY, f"xerial block of {size} bytes runs past the end of the batch")
        _raw_snappy(data[position : position + size], out)
        position += size


def _lz4_stream(data: bytes, out: _Output) -> None:
    stream = _lz4.LZ4FrameDecompressor()
    try:
        out.add(stream.decompress(data, max_length=out.room))
        while not stream.eof and not stream.needs_input:
            out.add(stream.decompress(b"", max_length=out.room))
    except RuntimeError as exc:  # lz4.frame reports corrupt input as RuntimeError
        raise _corrupt(LZ4, str(exc)) from None
    if not stream.eof:
        raise _corrupt(LZ4, "the frame is truncated")
    if stream.unused_data:
        raise _corrupt(LZ4, f"{len(stream.unused_data)} bytes follow the frame")


def _zstd_stream(data: bytes, out: _Output) -> None:
    decompressor = _zstd.ZstdDecompressor()
    position = 0
    while position < len(data):  # one frame per pass; frames may follow one another
        stream = decompressor.decompressobj()
        try:
            while position < len(data) and not stream.eof:
                out.add(stream.decompress(data[position : position + ZSTD_INPUT_SLICE]))
                position += ZSTD_INPUT_SLICE
        except _zstd.ZstdError as exc:
            raise _corrupt(ZSTD, str(exc)) from None
        if not stream.eof:
            raise _corrupt(ZSTD, "the frame is truncated")
        position = min(position, len(data)) - len(stream.unused_data)


_DECOMPRESSORS: dict[int, Callable[[bytes, _Output], None]] = {
    GZIP: _gzip,
    SNAPPY: _snappy_stream,
    LZ4: _lz4_stream,
    ZSTD: _zstd_stream,
}


def decompress(codec: int, payload: bytes | memoryview, limit: int) -> bytes:
    """The decompressed records of a batch of `codec` (1-4).

    Raises InvalidBatch: MESSAGE_TOO_LARGE past `limit` bytes, UNKNOWN_SERVER_ERROR for a corrupt stream."""
    out = _Output(limit)
    _DECOMPRESSORS[codec](bytes(payload), out)
    return out.join()


def compress(codec: int, records: bytes | memoryview, level: int | None = None) -> bytes:
    """`records` (a batch's records, uncompressed) compressed with `codec` (1-4) at `level` (the topic's
    compression.<codec>.level; None for the codec's default)."""
    data = bytes(records)
    if codec == GZIP:
        stream = zlib.compressobj(-1 if level is None else level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return stream.compress(data) + stream.flush()
    if codec == SNAPPY:
        header = XERIAL_MAGIC + XERIAL_VERSION.to_bytes(4, "big") + XERIAL_VERSION.to_bytes(4, "big")
        blocks = [header]
        for start in range(0, len(data), XERIAL_BLOCK_SIZE):
            block = _snappy.compress(data[start : start + XERIAL_BLOCK_SIZE])
            blocks += [len(block).to_bytes(4, "big"), block]
        return b"".join(blocks)
    if codec == LZ4:
        return _lz4.compress(data, compression_level=9 if level is None else level,
                             block_size=_lz4.BLOCKSIZE_MAX64KB, block_linked=False, content_checksum=False,
                             block_checksum=False, store_size=False)
    if codec == ZSTD:
        return _zstd.ZstdCompressor(level=3 if level is None else level).compress(data)
    raise ValueError(f"unknown codec {codec}")
