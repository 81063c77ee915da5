"""Log compaction for topics whose cleanup.policy has `compact` (Kafka's log cleaner).

What a pass keeps, of the closed segments below the first uncleanable offset (the active segment's base, the
last stable offset, and segments newer than `min.compaction.lag.ms`):
- of the records that carry a key, the last one per key; records without a key go;
- nothing of an aborted transaction: its batches go whole (readers never saw them under read_committed);
- a tombstone (null value) and a transaction marker whose transaction has no batch left are kept until their
  segment was last written `delete.retention.ms` ago, then go (Kafka's delete horizon), so that a reader that
  started before them still sees them. The entry of the aborted-transaction index that a removed ABORT marker
  ended goes first, so no reader is ever told of an aborted transaction whose marker it will not find;
- each producer's last batch in the log, if need be with no record left (Kafka's empty batch): a restart that
  rebuilds producer state from the log still finds the producer's last sequence.

Offsets never move: a batch keeps its base offset and last offset delta, its kept records their bytes (and so
their offset and timestamp deltas); only its record count, length and CRC change. A segment keeps its base offset
and file name, and its last modified time (the delete horizon's clock).

A pass is cut in two so that its work does not hold up the broker's clients: `plan` (on the broker's thread:
what to clean, from state only that thread changes), `write` (on a worker thread: reads the segments through file
descriptors of its own and writes each cleaned segment next to it, as `<base>.log.cleaned`), then `swap` (on the
broker's thread: if the segments are still the log's, each cleaned file replaces its segment with one atomic
rename). A crash in between leaves each segment either cleaned or not, both whole; leftover `.cleaned` files are
removed when the log opens. The cleaning is started when the cleanable part's dirty share (what was not cleaned
before) reaches `min.cleanable.dirty.ratio`, or when a dirty segment is older than `max.compaction.lag.ms`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..compression import compress, decompress
from ..records import HEADER_SIZE, BatchHeader, parse_header, with_records
from .segment import Segment

# The steps of a pass where the crash tests stop the broker (sparkeos.failpoints): the cleaned files written; the
# aborted-transaction index rewritten; one segment swapped (of several).
STEP_WRITTEN = "cleaner.written"
STEP_INDEX_REWRITTEN = "cleaner.index_rewritten"
STEP_SEGMENT_SWAPPED = "cleaner.segment_swapped"
CLEANED_SUFFIX = ".cleaned"
CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"
# Cleaning reads whole batches; a batch's records decompress to at most this (Kafka's socket.request.max.bytes).
MAX_UNCOMPRESSED_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1


@dataclass(slots=True)
class SegmentToClean:
    segment: Segment  # the log's object: the swap checks it is still there
    path: Path
    base_offset: int
    size: int
    last_modified_ms: int


@dataclass(slots=True)
class Plan:
    """One pass over a partition's cleanable segments, made on the broker's thread."""

    segments: list[SegmentToClean]
    aborted: list[tuple[int, int, int]]  # (producer id, first offset, marker offset) of the aborted index
    producers_last_batches: frozenset[int]  # base offsets of each producer's last batch
    now_ms: int
    config: CompactionConfig
    def wait_for(self, horizon_ms: int) -> None:
        self.next_pass_ms = horizon_ms if self.next_pass_ms is None else min(self.next_pass_ms, horizon_ms)

    # Filled in by `write`:
    cleaned: list[Path] = field(default_factory=list)
    replacements: list[Segment] = field(default_factory=list)  # the cleaned files, opened and indexed
    removed_abort_markers: set[tuple[int, int]] = field(default_factory=set)  # (producer id, marker offset)
    records_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    # When a tombstone or a marker this pass kept may go (its delete horizon): the log needs another pass then,
    # dirty or not (Kafka's KIP-534). None if nothing waits.
    next_pass_ms: int | None = None


def dirty_enough(segments: list[Segment], cleaned_upto: int, now_ms: int, config: CompactionConfig,
                 next_pass_ms: int | None) -> bool:
    """Whether the cleanable `segments` are worth a pass (Kafka's LogCleanerManager)."""
    if segments and next_pass_ms is not None and now_ms >= next_pass_ms:
        return True
    total = sum(s.size for s in segments)
    dirty = [s for s in segments if s.next_offset > cleaned_upto and s.size > 0]
    if not dirty or total == 0:
        return False
    if any(now_ms - s.max_timestamp > config.max_compaction_lag_ms for s in dirty if s.max_timestamp >= 0):
        return True
    return sum(s.size for s in dirty) / total >= config.min_cleanable_dirty_ratio


def read_checkpoint(directory: Path) -> int:
    try:
        return int((directory / CLEANER_CHECKPOINT_FILE).read_text())
    except (OSError, ValueError):
        return 0


def write_checkpoint(directory: Path, offset: int) -> None:
    path = directory / CLEANER_CHECKPOINT_FILE
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as handle:
        handle.write(str(offset))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def remove_leftovers(directory: Path) -> None:
    for leftover in directory.glob(f"*{CLEANED_SUFFIX}"):
        leftover.unlink(missing_ok=True)


# -- write: on a worker thread ------------------------------------------------------------------------------------


def write(plan: Plan) -> Plan:
    """Write each segment of `plan` cleaned, next to it, and open it; fills in what the swap needs."""
    aborted: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, last in plan.aborted:
        aborted.setdefault(producer_id, []).append((first, last))
    keys_last = _last_offset_per_key(plan, aborted)
    horizon_ms = plan.now_ms - plan.config.delete_retention_ms
    # Producers with a batch of their current transaction in the log as it was before this pass: a marker goes only
    # in a pass after the one that removed the last batch of its transaction, so that a crash in the middle of a
    # pass never leaves a transaction's batches without its marker, nor an aborted one's without its index entry.
    had_batches: set[int] = set()
    keeps_batches: set[int] = set()  # the same, in the log as this pass leaves it
    for item in plan.segments:
        past_horizon = item.last_modified_ms <= horizon_ms
        horizon_of_segment = item.last_modified_ms + plan.config.delete_retention_ms
        out: list[bytes] = []
        for header, batch in _batches(item.path, item.size):
            plan.bytes_before += header.size
            if header.is_control:
                if header.producer_id in had_batches or not past_horizon:
                    if header.producer_id not in keeps_batches:
                        plan.wait_for(horizon_of_segment)
                    had_batches.discard(header.producer_id)
                    keeps_batches.discard(header.producer_id)
                    out.append(batch)
                elif _is_abort(batch):
                    plan.removed_abort_markers.add((header.producer_id, header.base_offset))
                continue
            if header.is_transactional:
                had_batches.add(header.producer_id)
            last_of_producer = header.base_offset in plan.producers_last_batches
            if _aborted(aborted, header):
                kept: bytes | None = None
                plan.records_removed += header.records_count
            else:
                kept = _compacted(header, batch, keys_last, past_horizon, horizon_of_segment, plan)
            if kept is None and last_of_producer:
                # Kept, without records: a restart that rebuilds producer state from the log finds the producer's
                # last sequence and epoch there.
                kept = bytes(with_records(batch, 0, b"", count=0))
            if kept is not None:
                out.append(kept)
                if header.is_transactional:
                    keeps_batches.add(header.producer_id)
        cleaned = item.path.with_name(item.path.name + CLEANED_SUFFIX)
        with open(cleaned, "wb") as handle:
            for batch in out:
                handle.write(batch)
            handle.flush()
            os.fsync(handle.fileno())
        os.utime(cleaned, ns=(item.last_modified_ms * 1_000_000, item.last_modified_ms * 1_000_000))
        plan.bytes_after += sum(len(b) for b in out)
        plan.cleaned.append(cleaned)
        replacement = Segment(cleaned, item.base_offset)
        plan.replacements.append(replacement)
        replacement.recover(verify_crc=False)
    return plan


def abandon(plan: Plan) -> None:
    """Drop what a pass wrote: it is not to be swapped in (the log changed meanwhile, or writing failed)."""
    for replacement in plan.replacements:
        replacement.close()
    for path in plan.cleaned:
        path.unlink(missing_ok=True)


def _batches(path: Path, size: int) -> Iterator[tuple[BatchHeader, bytes]]:
    """The segment's batches as it was planned (`size` bytes), read through a descriptor of this thread's own."""
    fd = os.open(path, os.O_RDONLY)
    try:
        position = 0
        while position + HEADER_SIZE <= size:
            header = parse_header(os.pread(fd, HEADER_SIZE, position))
            yield header, os.pread(fd, header.size, position)
            position += header.size
    finally:
        os.close(fd)


def _records(header: BatchHeader, batch: bytes) -> bytes:
    payload = memoryview(batch)[HEADER_SIZE:]
    return bytes(payload) if header.compression == 0 else decompress(header.compression, payload,
                                                                     MAX_UNCOMPRESSED_BYTES)


def _spans(records: bytes, count: int) -> Iterator[tuple[int, int, int, bytes | None, bool]]:
    """(start, end, offset delta, key, is a tombstone) of each record."""
    position = 0
    for _ in range(count):
        length, body = _varint(records, position)
        end = body + length
        cursor = body + 1  # attributes
        _, cursor = _varint(records, cursor)  # timestamp delta
        offset_delta, cursor = _varint(records, cursor)
        key_length, cursor = _varint(records, cursor)
        key = None if key_length < 0 else records[cursor : cursor + key_length]
        cursor += max(key_length, 0)
        value_length, _ = _varint(records, cursor)
        yield position, end, offset_delta, key, value_length < 0
        position = end


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """A zigzag varint at `position`: (value, position after it)."""
    shift = raw = 0
    while True:
        byte = data[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7


def _last_offset_per_key(plan: Plan, aborted: dict[int, list[tuple[int, int]]]) -> dict[bytes, int]:
    last: dict[bytes, int] = {}
    for item in plan.segments:
        for header, batch in _batches(item.path, item.size):
            if header.is_control or _aborted(aborted, header):
                continue
            for _, _, delta, key, _ in _spans(_records(header, batch), header.records_count):
                if key is not None:
                    last[key] = header.base_offset + delta
    return last


def _aborted(by_producer: dict[int, list[tuple[int, int]]], header: BatchHeader) -> bool:
    if not header.is_transactional:
        return False
    return any(first <= header.base_offset <= last for first, last in by_producer.get(header.producer_id, ()))


def _is_abort(control_batch: bytes) -> bool:
    # The one record's key is (version int16, type int16); type 0 is ABORT. The record starts after the header:
    # length, attributes, timestamp delta, offset delta (one byte each for a marker), key length, then the key.
    records = memoryview(control_batch)[HEADER_SIZE:]
    _, cursor = _varint(records, 0)
    cursor += 1
    _, cursor = _varint(records, cursor)
    _, cursor = _varint(records, cursor)
    _, cursor = _varint(records, cursor)
    return int.from_bytes(records[cursor + 2 : cursor + 4], "big") == 0


def _compacted(header: BatchHeader, batch: bytes, keys_last: dict[bytes, int], past_horizon: bool,
               horizon_ms: int, plan: Plan) -> bytes | None:
    """The batch with only the records to keep; None when none is."""
    records = _records(header, batch)
    kept: list[bytes] = []
    for start, end, delta, key, tombstone in _spans(records, header.records_count):
        if key is not None and keys_last.get(key) == header.base_offset + delta and not (tombstone and past_horizon):
            kept.append(records[start:end])
            if tombstone:
                plan.wait_for(horizon_ms)
    plan.records_removed += header.records_count - len(kept)
    if len(kept) == header.records_count:
        return batch
    if not kept:
        return None
    payload = b"".join(kept)
    out = with_records(batch, header.compression,
                       compress(header.compression, payload) if header.compression else payload, count=len(kept))
    return bytes(out)
