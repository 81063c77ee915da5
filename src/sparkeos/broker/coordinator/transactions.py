"""Transaction coordinator: transactional ids, producer epochs, and the two-phase end of a txn.

State machine (Kafka's TransactionCoordinator): Empty -> Ongoing (first AddPartitions /
AddOffsets) -> PrepareCommit | PrepareAbort (EndTxn, made durable first) -> markers written
to every partition of the transaction and staged group offsets published or dropped ->
CompleteCommit | CompleteAbort. A crash between Prepare and Complete is finished on restart
in the direction already decided, so a transaction is never half visible.

Fencing: InitProducerId for a known id bumps the epoch (aborting an open transaction with the
new epoch), so every later request of the older producer fails. A transaction older than its
timeout is aborted the same way.

This module knows nothing of sockets or of partition logs: markers and group offsets go
through the `TransactionEffects` the broker passes in.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..errors import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_EPOCH,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_REQUEST,
    INVALID_TRANSACTION_TIMEOUT,
    INVALID_TXN_STATE,
    NONE,
    OPERATION_NOT_ATTEMPTED,
    PRODUCER_FENCED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ..storage.journal import Journal
from .producer_ids import ProducerIdManager

log = logging.getLogger("sparkeos.broker.transactions")

MAX_EPOCH = 32767 - 1  # Short.MaxValue - 1: the last epoch Kafka hands out before a new id

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"

TopicPartition = tuple[str, int]


class TransactionEffects(Protocol):
    """What ending a transaction does outside the coordinator."""

    def write_markers(self, partitions: list[TopicPartition], producer_id: int, producer_epoch: int,
                      commit: bool, sync: bool = True) -> None: ...

    async def sync_markers(self, partitions: list[TopicPartition]) -> None:
        """Make markers written with `sync=False` durable."""

    def complete_group_offsets(self, group: str, producer_id: int, commit: bool) -> None: ...

    def partition_exists(self, topic: str, partition: int) -> bool: ...

    def open_transactions(self) -> list[tuple[TopicPartition, int, int]]:
        """(partition, producer id, producer epoch) of every transaction open in a partition log."""


class TransactionError(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


def fenced_error(version: int, first_version_with_fenced: int) -> int:
    """The error a fenced producer gets from an API at `version`: older clients do not know
    PRODUCER_FENCED (KIP-588) and get INVALID_PRODUCER_EPOCH instead."""
    return PRODUCER_FENCED if version >= first_version_with_fenced else INVALID_PRODUCER_EPOCH


@dataclass
class TransactionState:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str = EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    started_ms: int = -1
    updated_ms: int = -1

    def to_record(self) -> dict:
        return {
            "id": self.transactional_id,
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "timeout": self.timeout_ms,
            "state": self.state,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "groups": sorted(self.groups),
            "started": self.started_ms,
            "updated": self.updated_ms,
        }

    @classmethod
    def from_record(cls, record: dict) -> TransactionState:
        return cls(
            transactional_id=record["id"],
            producer_id=record["pid"],
            producer_epoch=record["epoch"],
            timeout_ms=record["timeout"],
            state=record["state"],
            partitions={(t, p) for t, p in record["partitions"]},
            groups=set(record["groups"]),
            started_ms=record["started"],
            updated_ms=record["updated"],
        )


@dataclass(frozen=True)
class TransactionSettings:
    max_timeout_ms: int = 900_000
    id_expiration_ms: int = 7 * 24 * 3600 * 1000


class TransactionCoordinator:
    def __init__(self, directory: Path, producer_ids: ProducerIdManager, effects: TransactionEffects,
                 settings: TransactionSettings) -> None:
        self.producer_ids = producer_ids
        self.effects = effects
        self.settings = settings
        self.transactions: dict[str, TransactionState] = {}
        self._by_producer: dict[int, TransactionState] = {}
        self._journal = Journal(directory / "transactions.journal")
        # EndTxn answered, markers being made durable: the id's next request waits for these.
        self._completing: dict[str, asyncio.Task[None]] = {}
        for record in self._journal.load():
            if record.get("deleted"):
                self._forget(record["id"])
            else:
                self._remember(TransactionState.from_record(record))

    # -- recovery ----------------------------------------------------------------------------

    def recover(self, now_ms: int) -> None:
        """Finish transactions a crash left between Prepare and Complete."""
        for txn in list(self.transactions.values()):
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                log.info("completing %s of %s after restart", txn.state, txn.transactional_id)
                self._complete(txn, txn.state == PREPARE_COMMIT, now_ms)
        self._abort_orphans(now_ms)
        self._compact()

    def _abort_orphans(self, now_ms: int) -> None:
        """Abort transactional data no open transaction accounts for, and fence the producer that wrote it.

        AddPartitionsToTxn is answered before its record is fsynced (see `add_partitions`). A power cut can
        then keep a partition's records, fsynced before their Produce was answered, and lose the record that
        put the partition in the transaction. Nothing would ever end that transaction on the partition, and
        its last stable offset would stay where the records begin. After a `kill -9` the record is never
        lost (it reached the page cache), so this finds nothing.
        """
        fenced: dict[str, TransactionState] = {}
        for partition, producer_id, data_epoch in self.effects.open_transactions():
            txn = self._by_producer.get(producer_id)
            if txn is not None and txn.state == ONGOING and partition in txn.partitions:
                continue
            log.warning("aborting records of producer %d on %s-%d that no open transaction lists", producer_id,
                        *partition)
            epoch = data_epoch if txn is None else max(data_epoch, txn.producer_epoch)
            self.effects.write_markers([partition], producer_id, epoch, commit=False)
            if txn is not None:
                fenced[txn.transactional_id] = txn
        for txn in fenced.values():
            # The producer was told its records were written: it must not go on to commit the transaction
            # without them. A newer epoch fails its next request, as after a transaction timeout.
            self._bump_epoch(txn)
            if txn.state == ONGOING:
                self._end(txn, commit=False, now_ms=now_ms)
            else:
                txn.updated_ms = now_ms
                self._persist(txn)

    # -- lookups -----------------------------------------------------------------------------

    def for_producer(self, producer_id: int) -> TransactionState | None:
        return self._by_producer.get(producer_id)

    # -- InitProducerId ----------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int, expected_pid: int, expected_epoch: int,
                         now_ms: int, fenced_error: int = PRODUCER_FENCED) -> tuple[int, int]:
        if not transactional_id:
            raise TransactionError(INVALID_REQUEST, "transactional.id must not be empty")
        if timeout_ms <= 0 or timeout_ms > self.settings.max_timeout_ms:
            raise TransactionError(
                INVALID_TRANSACTION_TIMEOUT,
                f"transaction timeout {timeout_ms} ms is outside (0, transaction.max.timeout.ms="
                f"{self.settings.max_timeout_ms}]",
            )
        txn = self.transactions.get(transactional_id)
        if txn is None:
            txn = TransactionState(transactional_id, self.producer_ids.next_id(), 0, timeout_ms,
                                   updated_ms=now_ms)
            self._persist(txn)
            return txn.producer_id, txn.producer_epoch
        if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
            raise TransactionError(CONCURRENT_TRANSACTIONS, f"{transactional_id} is completing a transaction")
        if expected_pid >= 0 and not (
            expected_pid == txn.producer_id and expected_epoch in (txn.producer_epoch, txn.producer_epoch - 1)
        ):
            raise TransactionError(fenced_error, f"producer {expected_pid}/{expected_epoch} of "
                                                 f"{transactional_id} has been fenced")
        if txn.state == ONGOING:
            # Fence the older producer first: its open transaction is aborted with a newer epoch.
            self._bump_epoch(txn)
            self._end(txn, commit=False, now_ms=now_ms)
        self._bump_epoch(txn)
        txn.timeout_ms = timeout_ms
        txn.state = EMPTY
        txn.partitions.clear()
        txn.groups.clear()
        txn.updated_ms = now_ms
        self._persist(txn)
        return txn.producer_id, txn.producer_epoch

    def _bump_epoch(self, txn: TransactionState) -> None:
        if txn.producer_epoch >= MAX_EPOCH:
            self._by_producer.pop(txn.producer_id, None)
            txn.producer_id = self.producer_ids.next_id()
            txn.producer_epoch = 0
            self._by_producer[txn.producer_id] = txn
        else:
            txn.producer_epoch += 1

    # -- adding to a transaction -------------------------------------------------------------

    def _check_producer(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        fenced_error: int) -> TransactionState:
        txn = self.transactions.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            raise TransactionError(INVALID_PRODUCER_ID_MAPPING,
                                   f"producer id {producer_id} does not belong to {transactional_id!r}")
        if producer_epoch != txn.producer_epoch:
            raise TransactionError(fenced_error, f"producer epoch {producer_epoch} of {transactional_id!r} "
                                                 f"is not the current epoch {txn.producer_epoch}")
        if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
            raise TransactionError(CONCURRENT_TRANSACTIONS, f"{transactional_id} is completing a transaction")
        return txn

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: list[TopicPartition], now_ms: int,
                       fenced_error: int = PRODUCER_FENCED) -> dict[TopicPartition, int]:
        """Per-partition error codes; all-or-nothing, like Kafka."""
        try:
            txn = self._check_producer(transactional_id, producer_id, producer_epoch, fenced_error)
        except TransactionError as exc:
            return {tp: exc.error_code for tp in partitions}
        unknown = [tp for tp in partitions if not self.effects.partition_exists(*tp)]
        if unknown:
            return {tp: UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else OPERATION_NOT_ATTEMPTED
                    for tp in partitions}
        self._begin_if_needed(txn, now_ms)
        txn.partitions.update(partitions)
        txn.updated_ms = now_ms
        # Not fsynced: the transaction's records on these partitions are fsynced before their Produce is
        # answered, and EndTxn's synced Prepare record covers this one. If a power cut keeps the records but
        # loses this record, restart recovery aborts them and fences the producer (`_abort_orphans`). The
        # previous transaction's Complete record is already on disk (`_finish_when_durable`), so recovery
        # never writes that transaction's markers again over this one's records.
        self._persist(txn, sync=False)
        return {tp: NONE for tp in partitions}

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group: str,
                    now_ms: int, fenced_error: int = PRODUCER_FENCED) -> None:
        txn = self._check_producer(transactional_id, producer_id, producer_epoch, fenced_error)
        self._begin_if_needed(txn, now_ms)
        txn.groups.add(group)
        txn.updated_ms = now_ms
        self._persist(txn)

    def check_offset_commit(self, transactional_id: str, producer_id: int, producer_epoch: int, group: str,
                            fenced_error: int = PRODUCER_FENCED) -> None:
        """TxnOffsetCommit is allowed only for a group added with AddOffsetsToTxn."""
        txn = self._check_producer(transactional_id, producer_id, producer_epoch, fenced_error)
        if txn.state != ONGOING or group not in txn.groups:
            raise TransactionError(INVALID_TXN_STATE, f"group {group!r} was not added to the transaction of "
                                                      f"{transactional_id!r}")

    def _begin_if_needed(self, txn: TransactionState, now_ms: int) -> None:
        if txn.state != ONGOING:
            txn.state = ONGOING
            txn.partitions.clear()
            txn.groups.clear()
            txn.started_ms = now_ms  # the timeout counts from the first add

    # -- EndTxn ------------------------------------------------------------------------------

    def end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                        now_ms: int, fenced_error: int = PRODUCER_FENCED) -> None:
        # A retried EndTxn whose abort the broker already finished with a bumped epoch (timeout)
        # is fenced too: the producer must not believe it committed.
        txn = self._check_producer(transactional_id, producer_id, producer_epoch, fenced_error)
        if txn.state == ONGOING:
            self._end(txn, commit, now_ms)
            return
        done = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        if txn.state == done:
            return  # a retry of an EndTxn that already completed
        raise TransactionError(INVALID_TXN_STATE, f"cannot {'commit' if commit else 'abort'} "
                                                  f"{transactional_id!r} in state {txn.state}")

    def end_transaction_in_background(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                      commit: bool, now_ms: int, fenced_error: int = PRODUCER_FENCED) -> None:
        """EndTxn as clients are answered: once the decision is durable and the markers written.

        Like Kafka's coordinator, which answers after the Prepare record and sends markers
        afterwards, the markers' fsync and the Complete record follow in a task; `wait_completed`
        holds the transactional id's next request until then. A crash before they are done
        leaves the durable Prepare state, which restart recovery finishes in the same direction.
        """
        txn = self._check_producer(transactional_id, producer_id, producer_epoch, fenced_error)
        if txn.state != ONGOING:
            self.end_transaction(transactional_id, producer_id, producer_epoch, commit, now_ms, fenced_error)
            return
        self._prepare(txn, commit, now_ms)
        partitions = sorted(txn.partitions)
        self._write_effects(txn, commit, sync=False)
        task = asyncio.get_running_loop().create_task(self._finish_when_durable(txn, partitions, commit, now_ms))
        self._completing[transactional_id] = task

    async def _finish_when_durable(self, txn: TransactionState, partitions: list[TopicPartition], commit: bool,
                                   now_ms: int) -> None:
        try:
            await self.effects.sync_markers(partitions)
            # Synced: the id's next AddPartitionsToTxn record is not (see `add_partitions`), and a restart
            # that found this transaction still in its Prepare state would write its markers again, after
            # the next transaction's records, and end that one too.
            self._finish(txn, commit, now_ms, sync=True)
        except Exception:  # the Prepare state stays; a restart completes it
            log.exception("completing the transaction of %s failed", txn.transactional_id)
        finally:
            self._completing.pop(txn.transactional_id, None)

    async def wait_completed(self, transactional_id: str) -> None:
        """Return once no background completion of `transactional_id` is running."""
        task = self._completing.get(transactional_id)
        if task is not None:
            await asyncio.wait([task])

    async def wait_all_completed(self) -> None:
        if self._completing:
            await asyncio.wait(list(self._completing.values()))

    def _end(self, txn: TransactionState, commit: bool, now_ms: int) -> None:
        self._prepare(txn, commit, now_ms)
        self._complete(txn, commit, now_ms)

    def _prepare(self, txn: TransactionState, commit: bool, now_ms: int) -> None:
        txn.state = PREPARE_COMMIT if commit else PREPARE_ABORT
        txn.updated_ms = now_ms
        self._persist(txn)  # the decision is durable before any marker is written

    def _complete(self, txn: TransactionState, commit: bool, now_ms: int) -> None:
        self._write_effects(txn, commit, sync=True)
        self._finish(txn, commit, now_ms)

    def _write_effects(self, txn: TransactionState, commit: bool, sync: bool) -> None:
        if txn.partitions:
            self.effects.write_markers(sorted(txn.partitions), txn.producer_id, txn.producer_epoch, commit, sync)
        for group in sorted(txn.groups):
            self.effects.complete_group_offsets(group, txn.producer_id, commit)

    def _finish(self, txn: TransactionState, commit: bool, now_ms: int, sync: bool = False) -> None:
        txn.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        txn.partitions.clear()
        txn.groups.clear()
        txn.updated_ms = now_ms
        # Unsynced unless asked: the markers and group offsets above are already durable, so losing
        # this record to a power cut only leaves the durable Prepare state, which a restart finishes
        # again (as after kill -9 between the markers and this record). The id's next request that
        # can start a transaction is InitProducerId, whose synced record covers this one, when the
        # transaction was ended here rather than by its producer's EndTxn.
        self._persist(txn, sync=sync)

    # -- timers ------------------------------------------------------------------------------

    def expire(self, now_ms: int) -> None:
        for txn in list(self.transactions.values()):
            if txn.state == ONGOING and now_ms - txn.started_ms > txn.timeout_ms:
                log.info("aborting transaction of %s after its %d ms timeout", txn.transactional_id,
                         txn.timeout_ms)
                self._bump_epoch(txn)  # the late producer is fenced
                self._end(txn, commit=False, now_ms=now_ms)
            elif txn.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) and (
                now_ms - txn.updated_ms > self.settings.id_expiration_ms
            ):
                self._forget(txn.transactional_id)
                self._journal.append([{"id": txn.transactional_id, "deleted": True}])
        if self._journal.records_written > 2 * len(self.transactions) + 1000:
            self._compact()

    # -- persistence -------------------------------------------------------------------------

    def _remember(self, txn: TransactionState) -> None:
        previous = self.transactions.get(txn.transactional_id)
        if previous is not None:
            self._by_producer.pop(previous.producer_id, None)
        self.transactions[txn.transactional_id] = txn
        self._by_producer[txn.producer_id] = txn

    def _forget(self, transactional_id: str) -> None:
        txn = self.transactions.pop(transactional_id, None)
        if txn is not None:
            self._by_producer.pop(txn.producer_id, None)

    def _persist(self, txn: TransactionState, sync: bool = True) -> None:
        self._remember(txn)
        self._journal.append([txn.to_record()], sync=sync)

    def _compact(self) -> None:
        self._journal.rewrite([txn.to_record() for txn in self.transactions.values()])

    def close(self) -> None:
        # Completions still running finish on restart from their durable Prepare state.
        self._journal.close()
