"""Idempotent-producer state of one partition: epoch and the last five batches per producer id.

The rules are Kafka's (ProducerAppendInfo): a lower epoch is fenced, a new epoch must start at
sequence 0, an exact duplicate of a cached batch is answered with its original offset and not
written again, and anything but the next sequence is out of order.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER
from ..records import BatchHeader

BATCHES_KEPT = 5
SEQUENCE_MODULUS = 2**31


class SequenceError(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(slots=True)
class CachedBatch:
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[CachedBatch] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    last_timestamp: int = -1
    # First offset of this producer's open transaction on the partition, or -1.
    current_txn_first_offset: int = -1

    def to_json(self) -> dict:
        return {
            "epoch": self.epoch,
            "batches": [[b.first_sequence, b.last_sequence, b.base_offset, b.last_offset] for b in self.batches],
            "last_timestamp": self.last_timestamp,
            "current_txn_first_offset": self.current_txn_first_offset,
        }

    @classmethod
    def from_json(cls, data: dict) -> ProducerEntry:
        entry = cls(epoch=data["epoch"], last_timestamp=data["last_timestamp"])
        entry.current_txn_first_offset = data.get("current_txn_first_offset", -1)
        for first, last, base, last_offset in data["batches"]:
            entry.batches.append(CachedBatch(first, last, base, last_offset))
        return entry


class ProducerStateTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # producer id -> first offset of its open transaction on this partition
        self.open_transactions: dict[int, int] = {}

    def check(self, header: BatchHeader) -> int | None:
        """Validate a batch before it is written.

        Returns the original base offset when the batch is a duplicate of a cached one, None
        when it is new and must be appended. Raises SequenceError when Kafka would refuse it.
        """
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return None
        if header.producer_epoch < entry.epoch:
            raise SequenceError(
                INVALID_PRODUCER_EPOCH,
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than {entry.epoch}",
            )
        if header.producer_epoch > entry.epoch:
            if header.base_sequence != 0:
                raise SequenceError(
                    OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"new epoch {header.producer_epoch} must start at sequence 0, "
                    f"got {header.base_sequence}",
                )
            return None
        for cached in entry.batches:
            if cached.first_sequence == header.base_sequence and cached.last_sequence == header.last_sequence:
                return cached.base_offset
        expected = (entry.batches[-1].last_sequence + 1) % SEQUENCE_MODULUS if entry.batches else 0
        if header.base_sequence != expected:
            raise SequenceError(
                OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {header.producer_id} sent sequence {header.base_sequence}, expected {expected}",
            )
        return None

    def record(self, header: BatchHeader) -> ProducerEntry:
        """Remember a batch that was written (header carries its assigned base offset)."""
        entry = self.producers.get(header.producer_id)
        if entry is None or header.producer_epoch > entry.epoch:
            previous_txn = entry.current_txn_first_offset if entry else -1
            entry = ProducerEntry(epoch=header.producer_epoch)
            entry.current_txn_first_offset = previous_txn
            self.producers[header.producer_id] = entry
        if header.is_control:
            # A marker ends the producer's transaction on this partition.
            entry.current_txn_first_offset = -1
            self.open_transactions.pop(header.producer_id, None)
        else:
            entry.batches.append(
                CachedBatch(header.base_sequence, header.last_sequence, header.base_offset, header.last_offset)
            )
            if header.is_transactional and entry.current_txn_first_offset < 0:
                entry.current_txn_first_offset = header.base_offset
                self.open_transactions[header.producer_id] = header.base_offset
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        return entry

    # -- snapshots ---------------------------------------------------------------------------

    def save(self, path: Path, offset: int) -> None:
        data = {"offset": offset, "producers": {str(pid): e.to_json() for pid, e in self.producers.items()}}
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as handle:
            json.dump(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    @staticmethod
    def load(path: Path) -> tuple[int, ProducerStateTable] | None:
        try:
            with open(path) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return None
        table = ProducerStateTable()
        table.producers = {int(pid): ProducerEntry.from_json(e) for pid, e in data["producers"].items()}
        table.open_transactions = {
            pid: e.current_txn_first_offset for pid, e in table.producers.items() if e.current_txn_first_offset >= 0
        }
        return data["offset"], table
