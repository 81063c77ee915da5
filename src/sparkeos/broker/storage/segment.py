"""One segment file: record batches back to back, exactly as Kafka lays out a .log file."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

from ..records import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, crc_of, parse_header

INDEX_INTERVAL_BYTES = 4096


def segment_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}.log"


class Segment:
    """An append-only file with a sparse in-memory offset index (offset -> file position)."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = -1
        # When the segment got its first batch (for a segment opened again, when it was last written): segment.ms
        # counts from it. Kafka counts from the first batch's timestamp, so that a producer's old timestamps roll
        # a segment per batch.
        self.first_append_ms = -1
        # The first data (non-control) batch holding the segment's largest data timestamp.
        self.max_data_timestamp = -1
        self.max_data_timestamp_position = -1
        self._index_offsets = array("q")
        self._index_positions = array("q")
        # Largest timestamp of the batches before each index entry: a time index, so a
        # timestamp lookup scans one index interval rather than the whole segment.
        self._index_timestamps_before = array("q")
        self._bytes_since_index = INDEX_INTERVAL_BYTES

    # -- loading -----------------------------------------------------------------------------

    def recover(self, verify_crc: bool) -> list[BatchHeader]:
        """Scan the file, rebuild the index, and cut off a torn or corrupt tail.

        Returns the headers of the batches kept, so the caller can rebuild producer state.
        """
        file_size = os.fstat(self.fd).st_size
        headers: list[BatchHeader] = []
        position = 0
        while position + HEADER_SIZE <= file_size:
            raw = os.pread(self.fd, HEADER_SIZE, position)
            if len(raw) < HEADER_SIZE or raw[16] != 2:
                break
            header = parse_header(raw)
            if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or position + header.size > file_size:
                break
            if header.base_offset < self.next_offset:
                break
            if verify_crc:
                batch = os.pread(self.fd, header.size, position)
                if crc_of(batch) != header.crc:
                    break
            self._track(header, position)
            headers.append(header)
            position += header.size
        if position != file_size:
            os.ftruncate(self.fd, position)
            os.fsync(self.fd)
        self.size = position
        if position:
            self.first_append_ms = os.fstat(self.fd).st_mtime_ns // 1_000_000
        return headers

    # -- writing -----------------------------------------------------------------------------

    def append(self, batches: list[memoryview | bytearray], headers: list[BatchHeader]) -> None:
        """Write `batches` (whole, in order) at the end in one gathered write, without joining them."""
        position = self.size
        expected = sum(len(batch) for batch in batches)
        written = os.pwritev(self.fd, batches, position)
        if written != expected:
            os.ftruncate(self.fd, position)  # a failed append leaves nothing behind for recovery to keep
            raise OSError(f"short write to {self.path}: {written} of {expected} bytes")
        for header in headers:
            self._track(header, position)
            position += header.size
        self.size = position

    def _track(self, header: BatchHeader, position: int) -> None:
        if self._bytes_since_index >= INDEX_INTERVAL_BYTES:
            self._index_offsets.append(header.base_offset)
            self._index_positions.append(position)
            self._index_timestamps_before.append(self.max_timestamp)
            self._bytes_since_index = 0
        self._bytes_since_index += header.size
        self.next_offset = header.next_offset
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
        if header.max_timestamp > self.max_data_timestamp and not header.is_control:
            self.max_data_timestamp = header.max_timestamp
            self.max_data_timestamp_position = position

    def sync(self) -> None:
        os.fsync(self.fd)

    # -- reading -----------------------------------------------------------------------------

    def _index_floor(self, offset: int) -> int:
        offsets = self._index_offsets
        lo, hi = 0, len(offsets) - 1
        found = 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if offsets[mid] <= offset:
                found = mid
                lo = mid + 1
            else:
                hi = mid - 1
        return self._index_positions[found] if offsets else 0

    def timestamp_floor(self, timestamp: int) -> int:
        """A position before which no batch has a timestamp >= `timestamp`."""
        before = self._index_timestamps_before
        lo, hi = 0, len(before) - 1
        found = 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if before[mid] < timestamp:
                found = mid
                lo = mid + 1
            else:
                hi = mid - 1
        return self._index_positions[found] if before else 0

    def iter_headers(self, start_position: int = 0):
        position = start_position
        while position + HEADER_SIZE <= self.size:
            header = parse_header(os.pread(self.fd, HEADER_SIZE, position))
            yield position, header
            position += header.size

    def position_of(self, offset: int) -> int | None:
        """File position of the batch that holds `offset` (or the first one after it)."""
        if offset >= self.next_offset:
            return None
        for position, header in self.iter_headers(self._index_floor(offset)):
            if header.next_offset > offset:
                return position
        return None

    def read(self, offset: int, max_bytes: int, max_position: int | None = None,
             min_one: bool = True) -> bytes | memoryview:
        """Whole batches starting with the one holding `offset`, up to `max_bytes`.

        With `min_one` the first batch is returned whole even when it is larger than
        `max_bytes`, as Kafka does for the first partition of a fetch, so a consumer can
        always make progress. A read that ends inside a batch comes back as a view of the
        bytes read, not a copy: a fetch sends about a megabyte of records at a time.
        """
        start = self.position_of(offset)
        end_limit = self.size if max_position is None else min(self.size, max_position)
        if start is None or start >= end_limit:
            return b""
        data = os.pread(self.fd, min(max_bytes, end_limit - start), start)
        cut = _whole_batches_length(data)
        if cut == 0 and min_one:
            first = parse_header(os.pread(self.fd, HEADER_SIZE, start))
            return os.pread(self.fd, first.size, start)
        return data if cut == len(data) else memoryview(data)[:cut]

    def read_range(self, start: int, end: int) -> bytes:
        return os.pread(self.fd, end - start, start)

    def close(self) -> None:
        os.close(self.fd)

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def _whole_batches_length(data: bytes) -> int:
    position = 0
    end = len(data)
    while position + LOG_OVERHEAD <= end:
        batch_length = int.from_bytes(data[position + 8 : position + 12], "big", signed=True)
        size = batch_length + LOG_OVERHEAD
        if position + size > end:
            break
        position += size
    return position
