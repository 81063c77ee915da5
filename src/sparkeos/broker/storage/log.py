"""One partition's log: segments, offsets, retention, producer state and crash recovery.

Durability contract: `append` writes straight to the segment file (no user-space buffering),
so a `kill -9` after `append` returns loses nothing; `sync` makes it survive a power loss too.
On open, the newest segment is re-validated batch by batch (CRC-32C), a torn tail is cut off,
indexes are rebuilt and producer state is replayed from the last snapshot.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ... import failpoints
from ..compression import TOPIC_CODECS, compress
from ..errors import INVALID_RECORD, MESSAGE_TOO_LARGE, OFFSET_OUT_OF_RANGE
from ..leader_epoch import LEADER_EPOCH
from ..record_validation import validate_records
from ..records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    HEADER_SIZE,
    BatchHeader,
    InvalidBatch,
    build_control_batch,
    parse_header,
    split_batches,
    stamp_batch,
    with_records,
)
from . import cleaner
from .cleaner import CompactionConfig
from .files import fsync_directory
from .journal import Journal
from .producer_state import ProducerStateTable
from .segment import Segment, segment_path

CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
LOG_START_FILE = "log-start-offset"
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 3
ABORTED_INDEX_FILE = "aborted-transactions.journal"
# Kafka's socket.request.max.bytes: what an uncompressed batch of the same records could have weighed.
DEFAULT_MAX_UNCOMPRESSED_BYTES = 100 * 1024 * 1024


@dataclass(slots=True)
class LogConfig:
    segment_bytes: int = 1024**3
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    log_append_time: bool = False
    max_message_bytes: int = 1048588
    compacted: bool = False  # cleanup.policy has compact: every produced record needs a key
    segment_ms: int = 7 * 24 * 3600 * 1000
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    compression: str = "producer"  # the topic's compression.type
    compression_level: int | None = None  # its compression.<codec>.level; None: the codec's default


@dataclass(slots=True, frozen=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int
    last_offset: int  # offset of the ABORT marker


@dataclass(slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int
    duplicate: bool
    headers: list[BatchHeader]


class OffsetOutOfRange(Exception):
    error_code = OFFSET_OUT_OF_RANGE


class PartitionLog:
    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.directory = directory
        self.config = config
        self.segments: list[Segment] = []
        self.producers = ProducerStateTable()
        self.log_start_offset = 0
        self.aborted: list[AbortedTransaction] = []
        self.cleaned_upto = 0  # the offset below which the cleaner has compacted the log
        # When tombstones or markers the last pass kept may go; after a restart, a pass is due at once.
        self.next_cleaning_ms: int | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self._aborted_index = Journal(directory / ABORTED_INDEX_FILE)
        self._open()

    # -- opening and recovery ----------------------------------------------------------------

    def _open(self) -> None:
        clean_marker = self.directory / CLEAN_SHUTDOWN_FILE
        clean = clean_marker.exists()
        clean_marker.unlink(missing_ok=True)
        cleaner.remove_leftovers(self.directory)
        self.cleaned_upto = cleaner.read_checkpoint(self.directory)
        self.next_cleaning_ms = 0 if self.cleaned_upto else None
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log"))
        if not bases:
            bases = [self._read_log_start()]
        recovered: list[list[BatchHeader]] = []
        for i, base in enumerate(bases):
            segment = Segment(segment_path(self.directory, base), base)
            if self.segments and segment.base_offset < self.segments[-1].next_offset:
                segment.delete()  # overlapping leftover of an interrupted roll
                continue
            is_last = i == len(bases) - 1
            headers = segment.recover(verify_crc=is_last and not clean)
            recovered.append(headers)
            self.segments.append(segment)
        self.log_start_offset = max(self._read_log_start(), self.segments[0].base_offset)
        self._rebuild_producer_state(recovered)
        self._load_aborted_index()

    def _load_aborted_index(self) -> None:
        # An entry whose marker never reached the log (crash in between) is dropped from the
        # file too: the transaction coordinator writes that marker again on restart and indexes
        # it anew, and a stale copy left behind would later cover offsets it never aborted. A
        # reader given an entry twice (librdkafka) would drop the producer's next committed
        # records, so each is kept once.
        end = self.log_end_offset
        records = self._aborted_index.load()
        self.aborted = list(dict.fromkeys(
            AbortedTransaction(r["pid"], r["first"], r["last"]) for r in records if r["last"] < end
        ))
        if len(self.aborted) != len(records):
            self._aborted_index.rewrite(
                [{"pid": a.producer_id, "first": a.first_offset, "last": a.last_offset} for a in self.aborted]
            )

    def _read_log_start(self) -> int:
        try:
            return int((self.directory / LOG_START_FILE).read_text())
        except (OSError, ValueError):
            return 0

    def _write_log_start(self) -> None:
        path = self.directory / LOG_START_FILE
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as handle:
            handle.write(str(self.log_start_offset))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    def _snapshots(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.directory.glob(f"*{SNAPSHOT_SUFFIX}"):
            try:
                found.append((int(path.stem), path))
            except ValueError:
                continue
        return sorted(found)

    def _rebuild_producer_state(self, headers_per_segment: list[list[BatchHeader]]) -> None:
        end = self.log_end_offset
        snapshot_offset = -1
        for offset, path in reversed(self._snapshots()):
            if offset > end:
                path.unlink(missing_ok=True)  # the log was cut below it
                continue
            loaded = ProducerStateTable.load(path)
            if loaded is not None:
                snapshot_offset, self.producers = loaded
                break
        for segment, headers in zip(self.segments, headers_per_segment, strict=True):
            if segment.next_offset <= snapshot_offset:
                continue
            for header in headers:
                if header.base_offset >= snapshot_offset:
                    self._replay(header)

    def _replay(self, header: BatchHeader) -> None:
        if header.producer_id < 0:
            return
        self.producers.record(header)

    # -- offsets -----------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        # A single replica: everything written is replicated.
        return self.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the earliest open transaction, else the high watermark."""
        open_transactions = self.producers.open_transactions
        if open_transactions:
            return min(self.high_watermark, min(open_transactions.values()))
        return self.high_watermark

    def aborted_between(self, start: int, end: int) -> list[AbortedTransaction]:
        """Aborted transactions overlapping offsets [start, end)."""
        return [a for a in self.aborted if a.first_offset < end and a.last_offset >= start]

    def write_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int = 0,
                     now_ms: int | None = None, sync: bool = True) -> int:
        """Append a COMMIT or ABORT marker ending `producer_id`'s transaction; returns its offset.

        With `sync` it is on disk when this returns; otherwise the caller syncs the log later."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        first_offset = self.producers.open_transactions.get(producer_id)
        marker_offset = self.log_end_offset
        if not commit and first_offset is not None:
            # Indexed before the marker is written, so a reader never sees the marker without it.
            self._aborted_index.append([{"pid": producer_id, "first": first_offset, "last": marker_offset}])
            self.aborted.append(AbortedTransaction(producer_id, first_offset, marker_offset))
        marker = build_control_batch(marker_offset, producer_id, producer_epoch,
                                     CONTROL_COMMIT if commit else CONTROL_ABORT, coordinator_epoch, now_ms)
        self.append_batches([marker], None, now_ms)
        if sync:
            self.sync()
        return marker_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- appending ---------------------------------------------------------------------------

    def append(self, records: bytes | memoryview, now_ms: int | None = None,
               max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES) -> AppendResult:
        """Validate and append a produce request's records for this partition; nothing is appended
        unless every record can be read (`max_uncompressed_bytes` bounds a compressed batch's records)."""
        if len(records) > self.config.max_message_bytes + 12 * 1024:
            raise InvalidBatch(MESSAGE_TOO_LARGE, "record batch is larger than max.message.bytes")
        batches = split_batches(records)
        if len(batches) != 1:
            raise InvalidBatch(INVALID_RECORD, "a produce request must hold exactly one record batch per partition")
        (header, batch), = batches
        uncompressed = validate_records(header, batch, self.config.compacted, max_uncompressed_bytes,
                                        self.directory.name)
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if header.producer_id >= 0:
            duplicate_offset = self.producers.check(header)
            if duplicate_offset is not None:
                return AppendResult(duplicate_offset, duplicate_offset + header.last_offset_delta, -1, True, [])
        codec = TOPIC_CODECS[self.config.compression]
        stored: bytes | memoryview | bytearray = batch
        if codec is not None and codec != header.compression:
            stored = with_records(batch, codec, compress(codec, uncompressed, self.config.compression_level)
                                  if codec else bytes(uncompressed))
        if len(stored) > self.config.max_message_bytes:
            raise InvalidBatch(MESSAGE_TOO_LARGE, "record batch is larger than max.message.bytes")
        append_time = now_ms if self.config.log_append_time else None
        return self.append_batches([stored], append_time, now_ms)

    def append_batches(
        self, batches: list[memoryview | bytes], append_time: int | None, now_ms: int
    ) -> AppendResult:
        """Assign offsets and write; used for producer batches and broker-written markers."""
        self._maybe_roll(sum(len(b) for b in batches), now_ms)
        next_offset = self.log_end_offset
        stamped: list[memoryview | bytearray] = []
        headers: list[BatchHeader] = []
        for batch in batches:
            out = stamp_batch(memoryview(batch), next_offset, LEADER_EPOCH, append_time)
            header = parse_header(out)
            stamped.append(out)
            headers.append(header)
            next_offset = header.next_offset
        if self.segments[-1].size == 0:
            self.segments[-1].first_append_ms = now_ms
        self.segments[-1].append(stamped, headers)
        for header in headers:
            if header.producer_id >= 0:
                self.producers.record(header)
        return AppendResult(
            headers[0].base_offset,
            headers[-1].last_offset,
            append_time if append_time is not None else -1,
            False,
            headers,
        )

    def _maybe_roll(self, incoming: int, now_ms: int) -> None:
        active = self.segments[-1]
        if active.size == 0:
            return
        if (active.size + incoming > self.config.segment_bytes
                or now_ms - active.first_append_ms > self.config.segment_ms):
            self.roll()

    def roll(self) -> None:
        active = self.segments[-1]
        active.sync()
        base = active.next_offset
        self.producers.save(self.directory / f"{base:020d}{SNAPSHOT_SUFFIX}", base)
        for _, path in self._snapshots()[:-SNAPSHOTS_KEPT]:
            path.unlink(missing_ok=True)
        self.segments.append(Segment(segment_path(self.directory, base), base))
        fsync_directory(self.directory)

    def sync(self) -> int:
        """Make every appended batch durable; returns the offset synced up to."""
        end = self.log_end_offset
        self.segments[-1].sync()
        return end

    # -- reading -----------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None,
             min_one: bool = True) -> bytes | memoryview:
        """Whole batches from the one holding `offset`, not reaching past `upper_bound`."""
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRange(f"offset {offset} outside [{self.log_start_offset}, {self.log_end_offset}]")
        limit = self.log_end_offset if upper_bound is None else upper_bound
        if offset >= limit:
            return b""
        for segment in self._segments_from(offset):
            if segment.base_offset >= limit:
                return b""
            max_position = None
            if limit < segment.next_offset:
                max_position = segment.position_of(limit)
            data = segment.read(offset, max_bytes, max_position, min_one)
            if data or segment.position_of(offset) is not None:
                return data
            offset = segment.next_offset
        return b""

    def _segments_from(self, offset: int) -> list[Segment]:
        segments = self.segments
        lo, hi = 0, len(segments) - 1
        found = 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if segments[mid].base_offset <= offset:
                found = mid
                lo = mid + 1
            else:
                hi = mid - 1
        return segments[found:]

    def iter_batches_from(self, offset: int):
        """(segment, position, header) for every batch from the one holding `offset`."""
        for segment in self._segments_from(offset):
            start = segment.position_of(offset)
            if start is None:
                continue
            for position, header in segment.iter_headers(start):
                yield segment, position, header

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp`."""
        from kafka.record.default_records import DefaultRecordBatch

        for segment in self._segments_from(self.log_start_offset):
            if segment.max_timestamp < timestamp:
                continue
            start = max(segment.position_of(self.log_start_offset) or 0, segment.timestamp_floor(timestamp))
            for position, header in segment.iter_headers(start):
                if header.max_timestamp < timestamp or header.is_control:
                    continue
                batch = DefaultRecordBatch(segment.read_range(position, position + header.size))
                for record in batch:
                    if record.offset >= self.log_start_offset and record.timestamp >= timestamp:
                        return record.offset, record.timestamp
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3)."""
        from kafka.record.default_records import DefaultRecordBatch

        # Each segment knows its first batch with the largest timestamp, so only one batch is
        # decoded rather than the whole log.
        newest: Segment | None = None
        for segment in self._segments_from(self.log_start_offset):
            if segment.max_data_timestamp >= 0 and (
                newest is None or segment.max_data_timestamp > newest.max_data_timestamp
            ):
                newest = segment
        if newest is not None:
            position = newest.max_data_timestamp_position
            header = parse_header(newest.read_range(position, position + HEADER_SIZE))
            if header.base_offset >= self.log_start_offset:
                for record in DefaultRecordBatch(newest.read_range(position, position + header.size)):
                    if record.timestamp == header.max_timestamp:
                        return record.offset, record.timestamp
        # Records below the log start offset may hold the maximum: scan what is still readable.
        best: tuple[int, int] | None = None
        for segment, position, header in self.iter_batches_from(self.log_start_offset):
            if header.is_control or (best is not None and header.max_timestamp <= best[1]):
                continue
            for record in DefaultRecordBatch(segment.read_range(position, position + header.size)):
                if record.offset >= self.log_start_offset and (best is None or record.timestamp > best[1]):
                    best = (record.offset, record.timestamp)
        return best

    # -- deletion ----------------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """Advance the log start offset (DeleteRecords); returns the new low watermark."""
        if offset == -1:
            offset = self.high_watermark
        if offset < 0 or offset > self.high_watermark:
            raise OffsetOutOfRange(f"offset {offset} is beyond the high watermark {self.high_watermark}")
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            self._write_log_start()
            self._drop_segments_below(offset)
        return self.log_start_offset

    def _drop_segments_below(self, offset: int) -> None:
        while len(self.segments) > 1 and self.segments[1].base_offset <= offset:
            self.segments.pop(0).delete()

    def apply_retention(self, now_ms: int) -> bool:
        """Delete whole old segments by retention.ms / retention.bytes; True if any went."""
        deleted = False
        while len(self.segments) > 1 and self._breaches_retention(self.segments[0], now_ms):
            self.segments.pop(0).delete()
            deleted = True
        active = self.segments[-1]
        if len(self.segments) == 1 and active.size > 0 and self._breaches_retention(active, now_ms):
            # Kafka expires the active segment too. Rolling makes it an old segment that the
            # next pass deletes; by then no fsync of it can still be running in the sync pool.
            self.roll()
        if deleted and self.segments[0].base_offset > self.log_start_offset:
            self.log_start_offset = self.segments[0].base_offset
            self._write_log_start()
        return deleted

    def _breaches_retention(self, segment: Segment, now_ms: int) -> bool:
        config = self.config
        # A closed segment the cleaner emptied has no timestamp left: nothing in it to keep.
        too_old = config.retention_ms >= 0 and (segment.size == 0 or segment.max_timestamp >= 0 and (
            now_ms - segment.max_timestamp > config.retention_ms))
        too_big = config.retention_bytes >= 0 and self.size_bytes - segment.size >= config.retention_bytes
        return too_old or too_big

    # -- compaction --------------------------------------------------------------------------

    def plan_cleaning(self, now_ms: int) -> cleaner.Plan | None:
        """A compaction pass over the closed segments below the first uncleanable offset, if they are dirty enough
        (storage/cleaner.py); None otherwise, or when the topic is not compacted."""
        config = self.config.compaction
        if not self.config.compacted:
            return None
        uncleanable = min(self.last_stable_offset, self.segments[-1].base_offset)
        cleanable: list[Segment] = []
        for segment in self.segments[:-1]:
            if segment.next_offset > uncleanable or (
                    segment.max_timestamp >= 0 and now_ms - segment.max_timestamp < config.min_compaction_lag_ms):
                break
            cleanable.append(segment)
        if not cleaner.dirty_enough(cleanable, self.cleaned_upto, now_ms, config, self.next_cleaning_ms):
            return None
        return cleaner.Plan(
            [cleaner.SegmentToClean(s, s.path, s.base_offset, s.size, os.fstat(s.fd).st_mtime_ns // 1_000_000)
             for s in cleanable],
            [(a.producer_id, a.first_offset, a.last_offset) for a in self.aborted],
            frozenset(e.batches[-1].base_offset for e in self.producers.producers.values() if e.batches),
            now_ms, config)

    def finish_cleaning(self, plan: cleaner.Plan) -> bool:
        """Put the segments `plan` cleaned in place of the log's, if they are still its own and unchanged; False
        (and the cleaned files removed) if not."""
        current = {id(s): s for s in self.segments[:-1]}
        if any(current.get(id(item.segment)) is not item.segment or item.segment.size != item.size
               for item in plan.segments):
            cleaner.abandon(plan)
            return False
        failpoints.fire(cleaner.STEP_WRITTEN)
        if plan.removed_abort_markers:
            # The index entries first: a reader told of an aborted transaction must find its marker.
            self.aborted = [a for a in self.aborted
                            if (a.producer_id, a.last_offset) not in plan.removed_abort_markers]
            self._aborted_index.rewrite(
                [{"pid": a.producer_id, "first": a.first_offset, "last": a.last_offset} for a in self.aborted])
            failpoints.fire(cleaner.STEP_INDEX_REWRITTEN)
        for item, replacement in zip(plan.segments, plan.replacements, strict=True):
            # The replacement was opened and indexed on the cleaner's thread; the old segment is closed only once
            # the replacement stands in the log, so no reader ever meets a closed one.
            os.replace(replacement.path, item.path)
            replacement.path = item.path
            position = self.segments.index(item.segment)
            if replacement.size == 0 and position > 0:
                # Nothing left in it: gone, as Kafka's cleaner leaves no empty segment behind (the first stays, so
                # that the log start offset does not move).
                self.segments.pop(position)
                replacement.delete()
            else:
                self.segments[position] = replacement
            item.segment.close()
            failpoints.fire(cleaner.STEP_SEGMENT_SWAPPED)
        fsync_directory(self.directory)
        self.cleaned_upto = plan.segments[-1].segment.next_offset
        self.next_cleaning_ms = plan.next_pass_ms
        cleaner.write_checkpoint(self.directory, self.cleaned_upto)
        return True

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        self._aborted_index.close()
        for segment in self.segments:
            segment.sync()
        end = self.log_end_offset
        self.producers.save(self.directory / f"{end:020d}{SNAPSHOT_SUFFIX}", end)
        for segment in self.segments:
            segment.close()
        (self.directory / CLEAN_SHUTDOWN_FILE).write_text(json.dumps({"log_end_offset": end}))
        fsync_directory(self.directory)

    def close_without_marker(self) -> None:
        self._aborted_index.close()
        for segment in self.segments:
            segment.close()
