"""An append-only file of JSON records, each framed with its length and CRC-32C.

Coordinators keep their durable state here. `append` returns only after fsync, so a state
change acknowledged to a client survives `kill -9` and power loss; a torn or corrupt tail
left by a crash is cut off on open. `rewrite` replaces the file atomically with a compacted
set of records.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import crc32c

from .files import fsync_directory

_FRAME = struct.Struct(">II")  # length, crc32c of the payload


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.records_written = 0
        self._fd = -1

    def load(self) -> list[dict[str, Any]]:
        """Read every whole record, truncate a damaged tail, and open for appending."""
        records: list[dict[str, Any]] = []
        data = self.path.read_bytes() if self.path.exists() else b""
        position = 0
        while position + _FRAME.size <= len(data):
            length, checksum = _FRAME.unpack_from(data, position)
            payload = data[position + _FRAME.size : position + _FRAME.size + length]
            if len(payload) < length or crc32c.crc32c(payload) != checksum:
                break
            try:
                records.append(json.loads(payload))
            except ValueError:
                break
            position += _FRAME.size + length
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if position != len(data):
            os.ftruncate(self._fd, position)
            os.fsync(self._fd)
        os.lseek(self._fd, position, os.SEEK_SET)
        self.records_written = len(records)
        return records

    def append(self, records: list[dict[str, Any]], sync: bool = True) -> None:
        """Write `records`; with `sync` (the default) they are on disk when this returns.

        Without it they survive `kill -9` (the write reaches the page cache) and reach the disk
        with the next synced append, or the kernel's own writeback.
        """
        if not records:
            return
        frames = b"".join(_encode(record) for record in records)
        written = os.write(self._fd, frames)
        if written != len(frames):
            raise OSError(f"short write to {self.path}: {written} of {len(frames)} bytes")
        if sync:
            os.fsync(self._fd)
        self.records_written += len(records)

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Atomically replace the journal with `records` (compaction)."""
        encoded = [_encode(record) for record in records]
        tmp = self.path.with_suffix(".compacting")
        with open(tmp, "wb") as handle:
            handle.write(b"".join(encoded))
            handle.flush()
            os.fsync(handle.fileno())
        if self._fd >= 0:
            os.close(self._fd)
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self.records_written = len(encoded)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _encode(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, separators=(",", ":")).encode()
    return _FRAME.pack(len(payload), crc32c.crc32c(payload)) + payload

