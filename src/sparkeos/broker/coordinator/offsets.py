"""Durable committed offsets: an append-only log of commits, replayed into memory at startup.

Every record is `[length u32][crc32c u32][JSON payload]`. A commit is one record, so a
request's offsets become durable together. A torn or corrupt tail (a crash mid-write) ends
the replay and is cut off; everything before it was acknowledged only after an fsync. The
file is rewritten with just the live offsets once it has grown well past them.

Transactional offsets (TxnOffsetCommit) are staged per (group, producer id) in the same log
and become committed offsets only when their transaction commits; an abort drops them.
Staging is durable so that a transaction completed after a restart still publishes them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c

from ..storage.files import fsync_directory

log = logging.getLogger("sparkeos.broker.offsets")

_HEADER = struct.Struct(">II")
MAX_RECORD_BYTES = 64 * 1024 * 1024
DEFAULT_COMPACT_MIN_BYTES = 4 * 1024 * 1024

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp_ms: int


class OffsetStore:
    """Committed offsets per group, durable in one append-only file.

    `commit` is the single write path for offsets that become visible: the consumer-group
    OffsetCommit and, later, transactional offsets published when their transaction commits.
    """

    def __init__(self, path: Path, sync_on_commit: bool = True,
                 compact_min_bytes: int = DEFAULT_COMPACT_MIN_BYTES) -> None:
        self.path = path
        self.sync_on_commit = sync_on_commit
        self.compact_min_bytes = compact_min_bytes
        self.offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self.protocol_types: dict[str, str | None] = {}
        # group -> producer id -> staged {(topic, partition): CommittedOffset}
        self.staged: dict[str, dict[int, dict[TopicPartition, CommittedOffset]]] = {}
        self._written = 0  # records appended since open, to pair writers with the fsync covering them
        self._synced = 0
        self._sync_lock: asyncio.Lock | None = None
        self._syncing = False
        self._closed = False
        size = self._replay()
        self._file = open(path, "ab")  # noqa: SIM115 (kept open for the store's lifetime)
        self._file_bytes = size
        self._compacted_bytes = size

    # -- reading -----------------------------------------------------------------------------

    def _replay(self) -> int:
        """Load every intact record; cut the file after the last one. Returns the kept size."""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            fsync_directory(self.path.parent)
            return 0
        data = self.path.read_bytes()
        pos = 0
        while pos + _HEADER.size <= len(data):
            length, checksum = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length
            if length > MAX_RECORD_BYTES or end > len(data):
                break
            payload = data[pos + _HEADER.size:end]
            if crc32c.crc32c(payload) != checksum:
                break
            try:
                record = json.loads(payload)
            except ValueError:
                break
            self._apply(record)
            pos = end
        if pos != len(data):
            log.warning("offsets log %s: dropping %d bytes of torn or corrupt tail", self.path, len(data) - pos)
            with open(self.path, "r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())
        return pos

    def _apply(self, record: dict) -> None:
        group = record["g"]
        if "pt" in record:
            self.protocol_types[group] = record["pt"]
        if "x" in record:
            self._apply_transactional(group, record)
            return
        for topic, partition, offset, epoch, metadata, timestamp in record.get("c", ()):
            self.offsets.setdefault(group, {})[(topic, partition)] = CommittedOffset(offset, epoch, metadata, timestamp)
        if "d" in record:
            if record["d"] is None:
                self.offsets.pop(group, None)
                self.protocol_types.pop(group, None)
            else:
                committed = self.offsets.get(group, {})
                for topic, partition in record["d"]:
                    committed.pop((topic, partition), None)
                if not committed:
                    self.offsets.pop(group, None)

    def _apply_transactional(self, group: str, record: dict) -> None:
        producer_id = record["x"]
        if "end" in record:
            by_producer = self.staged.get(group, {})
            staged = by_producer.pop(producer_id, {})
            if not by_producer:
                self.staged.pop(group, None)
            if record["end"] and staged:
                self.offsets.setdefault(group, {}).update(staged)
            return
        staged = self.staged.setdefault(group, {}).setdefault(producer_id, {})
        for topic, partition, offset, epoch, metadata, timestamp in record.get("c", ()):
            staged[(topic, partition)] = CommittedOffset(offset, epoch, metadata, timestamp)

    def has_staged(self, group: str, topic: str, partition: int) -> bool:
        return any((topic, partition) in staged for staged in self.staged.get(group, {}).values())

    def get(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        return self.offsets.get(group, {}).get((topic, partition))

    def group_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        return self.offsets.get(group, {})

    # -- writing -----------------------------------------------------------------------------

    async def commit(self, group: str, offsets: dict[TopicPartition, tuple[int, str | None, int]],
                     timestamp_ms: int, protocol_type: str | None = None) -> None:
        """Make `offsets` ({(topic, partition): (offset, metadata, leader_epoch)}) visible and durable.

        Visible at once (so the file's order is the memory's order); returns once on disk.
        """
        record: dict = {
            "g": group,
            "c": [[t, p, o, e, m, timestamp_ms] for (t, p), (o, m, e) in offsets.items()],
        }
        if protocol_type is not None and self.protocol_types.get(group) != protocol_type:
            record["pt"] = protocol_type
        self._write(record)
        if self.sync_on_commit:
            await self._sync()

    async def stage(self, group: str, producer_id: int, offsets: dict[TopicPartition, tuple[int, str | None, int]],
                    timestamp_ms: int) -> None:
        """Durably stage a transaction's offsets; invisible until `complete(..., commit=True)`."""
        self._write({
            "g": group,
            "x": producer_id,
            "c": [[t, p, o, e, m, timestamp_ms] for (t, p), (o, m, e) in offsets.items()],
        })
        if self.sync_on_commit:
            await self._sync()

    def complete(self, group: str, producer_id: int, commit: bool) -> None:
        """Publish (commit) or drop (abort) the producer's staged offsets; durable on return."""
        if producer_id not in self.staged.get(group, {}):
            return
        self._write({"g": group, "x": producer_id, "end": commit})
        if self.sync_on_commit:
            self.sync_now()

    def delete(self, group: str, partitions: list[TopicPartition] | None) -> None:
        """Forget offsets (all of the group's when `partitions` is None); durable at the next sync."""
        self._write({"g": group, "d": None if partitions is None else [list(tp) for tp in partitions]})

    def _write(self, record: dict) -> None:
        if self._closed:
            raise RuntimeError("offset store is closed")
        payload = json.dumps(record, separators=(",", ":")).encode()
        self._file.write(_HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload)
        self._file.flush()
        self._file_bytes += _HEADER.size + len(payload)
        self._written += 1
        self._apply(record)

    async def _sync(self) -> None:
        """fsync covering this caller's write; concurrent committers share one fsync."""
        target = self._written
        if self._sync_lock is None:
            self._sync_lock = asyncio.Lock()
        async with self._sync_lock:
            if self._synced >= target:
                return
            covered = self._written
            self._syncing = True
            try:
                await asyncio.get_running_loop().run_in_executor(None, os.fsync, self._file.fileno())
            finally:
                self._syncing = False
            self._synced = max(self._synced, covered)

    def sync_now(self) -> None:
        """Blocking fsync, for callers that cannot wait on the event loop."""
        if not self._closed and self._synced < self._written:
            os.fsync(self._file.fileno())
            self._synced = self._written

    # -- compaction --------------------------------------------------------------------------

    def maybe_compact(self) -> bool:
        """Rewrite the file with only live offsets once it is mostly superseded records."""
        if self._syncing or self._closed:
            return False
        if self._file_bytes < max(self.compact_min_bytes, 2 * self._compacted_bytes):
            return False
        self.compact()
        return True

    def compact(self) -> None:
        tmp = self.path.with_name(self.path.name + ".compact")
        size = 0
        with open(tmp, "wb") as out:
            groups = set(self.offsets) | {g for g, t in self.protocol_types.items() if t is not None}
            records: list[dict] = []
            for group in sorted(groups):
                record: dict = {"g": group, "c": _entries(self.offsets.get(group, {}))}
                if self.protocol_types.get(group) is not None:
                    record["pt"] = self.protocol_types[group]
                records.append(record)
            for group, by_producer in sorted(self.staged.items()):
                for producer_id, staged in sorted(by_producer.items()):
                    records.append({"g": group, "x": producer_id, "c": _entries(staged)})
            for record in records:
                payload = json.dumps(record, separators=(",", ":")).encode()
                out.write(_HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload)
                size += _HEADER.size + len(payload)
            out.flush()
            os.fsync(out.fileno())
        self._file.close()
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._file_bytes = self._compacted_bytes = size
        self._synced = self._written

    @property
    def file_bytes(self) -> int:
        return self._file_bytes

    def close(self) -> None:
        if self._closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._closed = True


def _entries(offsets: dict[TopicPartition, CommittedOffset]) -> list[list]:
    return [[t, p, c.offset, c.leader_epoch, c.metadata, c.commit_timestamp_ms] for (t, p), c in offsets.items()]
