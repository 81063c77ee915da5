"""Transaction coordinator state and the aborted-transaction index survive `kill -9` in every phase.

Each phase is checked by an independent read_committed reader (confluent-kafka) that must see
exactly the committed records, plus the last stable offset reported by ListOffsets:
- Ongoing: the open transaction still holds the LSO back after a restart, until its timeout
  or a new producer with the same transactional.id aborts it.
- Decided (PrepareCommit / PrepareAbort) with markers on only some partitions: recovery on
  startup finishes it in the decided direction.
- Completed: committed stays committed, aborted stays filtered.
Plus transactional.id expiration: an id idle longer than transactional.id.expiration.ms is
forgotten and gets a new producer id.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from sparkeos.broker import BrokerProcess, EmbeddedBroker
from sparkeos.broker.coordinator.producer_ids import ProducerIdManager
from sparkeos.broker.coordinator.transactions import (
    PREPARE_ABORT,
    PREPARE_COMMIT,
    TransactionCoordinator,
    TransactionSettings,
)
from sparkeos.broker.storage.topics import TopicStore
from sparkeos.verify import READ_COMMITTED, read_values

PARTITIONS = 2


def _producer(bootstrap: str, transactional_id: str, timeout_ms: int = 60000) -> Producer:
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": transactional_id,
        "transaction.timeout.ms": timeout_ms,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
    })
    producer.init_transactions(20)
    return producer


def _start(data_dir: Path) -> BrokerProcess:
    return BrokerProcess(data_dir).start()


def _create(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(15)


def _transaction(producer: Producer, topic: str, prefix: str, count: int, commit: bool = True) -> list[str]:
    """One transaction spreading `count` records over both partitions; returns their values."""
    values = [f"{prefix}-{i}" for i in range(count)]
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=i % PARTITIONS)
    if commit:
        producer.commit_transaction(20)
    else:
        assert producer.flush(20) == 0
        producer.abort_transaction(20)
    return values


def _committed_before(broker: BrokerProcess, topic: str) -> list[str]:
    """The test topic, created with one committed transaction of two records in it; returns their values."""
    _create(broker.bootstrap_servers, topic)
    return _transaction(_producer(broker.bootstrap_servers, "dur-setup"), topic, "before", 2)


def _open_transaction(producer: Producer, topic: str, prefix: str, count: int) -> list[str]:
    """Records of a transaction that is written to both partitions but never ended."""
    values = [f"{prefix}-{i}" for i in range(count)]
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=i % PARTITIONS)
    assert producer.flush(20) == 0
    return values


def _read(bootstrap: str, topic: str, isolation: str = READ_COMMITTED) -> list[str]:
    """Everything a fresh consumer sees up to the end (the LSO for read_committed) of each partition."""
    return [value.decode() for value in read_values(bootstrap, topic, isolation_level=isolation)]


def _end_offsets(bootstrap: str, topic: str, committed: bool) -> list[int]:
    """ListOffsets latest: the last stable offset for read_committed, else the high watermark."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)},
                                 isolation_level=level, request_timeout=15)
    return [futures[tp].result().offset for tp in sorted(futures, key=lambda tp: tp.partition)]


def _wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# -- phase 1: Ongoing ------------------------------------------------------------------------


def test_ongoing_transaction_survives_kill_and_times_out(tmp_path: Path) -> None:
    topic = f"dur-{uuid.uuid4().hex[:8]}"
    broker = _start(tmp_path / "broker")
    try:
        _create(broker.bootstrap_servers, topic)
        before = _transaction(_producer(broker.bootstrap_servers, "dur-setup"), topic, "before", 4)
        # Small enough to expire within the test, large enough to still be open right after restart.
        hanging = _producer(broker.bootstrap_servers, "dur-ongoing", timeout_ms=12000)
        opened_at = time.monotonic()
        pending = _open_transaction(hanging, topic, "open", 6)
        stable_before_kill = _end_offsets(broker.bootstrap_servers, topic, committed=True)
        assert stable_before_kill == [3, 3]  # two committed records and their COMMIT marker on each partition

        broker.restart()  # kill -9
        assert time.monotonic() - opened_at < 10, "restart too slow to observe the open transaction"
        # Still open after the crash: the LSO is held at its first record on both partitions.
        assert _end_offsets(broker.bootstrap_servers, topic, committed=True) == [3, 3]
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(before)
        assert sorted(_read(broker.bootstrap_servers, topic, "read_uncommitted")) == sorted(before + pending)

        # The restarted broker still knows when the transaction began and aborts it on time.
        _wait_until(lambda: _end_offsets(broker.bootstrap_servers, topic, committed=True)
                    == _end_offsets(broker.bootstrap_servers, topic, committed=False), 20, "timeout abort")
        assert time.monotonic() - opened_at > 11  # not before its timeout
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(before)

        # The abort itself is durable: after another crash the records stay filtered.
        broker.restart()
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(before)
        after = _transaction(_producer(broker.bootstrap_servers, "dur-ongoing"), topic, "after", 2)
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(before + after)
        del hanging
    finally:
        broker.kill()


def test_ongoing_transaction_survives_kill_and_new_producer_aborts_it(tmp_path: Path) -> None:
    topic = f"dur-{uuid.uuid4().hex[:8]}"
    broker = _start(tmp_path / "broker")
    try:
        before = _committed_before(broker, topic)
        hanging = _producer(broker.bootstrap_servers, "dur-fenced", timeout_ms=600000)
        pending = _open_transaction(hanging, topic, "open", 4)

        broker.restart()
        assert _end_offsets(broker.bootstrap_servers, topic, committed=True) == [2, 2]
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(before)

        successor = _producer(broker.bootstrap_servers, "dur-fenced")  # aborts the open transaction
        stable = _end_offsets(broker.bootstrap_servers, topic, committed=True)
        assert stable == _end_offsets(broker.bootstrap_servers, topic, committed=False)
        assert stable == [5, 5]  # record + COMMIT, 2 records of the open transaction + ABORT
        after = _transaction(successor, topic, "after", 4)
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(before + after)
        assert sorted(_read(broker.bootstrap_servers, topic, "read_uncommitted")) == sorted(before + pending + after)
        del hanging
    finally:
        broker.kill()


def _lose_unsynced_add_partitions(journal: Path, transactional_id: str) -> int:
    """Cut the journal back to before `transactional_id`'s AddPartitionsToTxn records, which are not fsynced:
    what a power cut may leave. Returns how many records were cut; every one must be such an Ongoing record."""
    data = journal.read_bytes()
    frames = []
    position = 0
    while position + 8 <= len(data):
        length = int.from_bytes(data[position:position + 4], "big")
        frames.append((position, json.loads(data[position + 8:position + 8 + length])))
        position += 8 + length
    last_init = max(i for i, (_, record) in enumerate(frames)
                    if record.get("id") == transactional_id and record.get("state") == "Empty")
    cut = frames[last_init + 1:]
    assert cut and all(r["id"] == transactional_id and r["state"] == "Ongoing" for _, r in cut), cut
    with open(journal, "r+b") as handle:
        handle.truncate(cut[0][0])
    return len(cut)


def test_records_whose_add_partitions_record_was_lost_are_aborted_and_their_producer_fenced(tmp_path: Path) -> None:
    topic = f"dur-{uuid.uuid4().hex[:8]}"
    data_dir = tmp_path / "broker"
    broker = _start(data_dir)
    try:
        before = _committed_before(broker, topic)
        orphaned = _producer(broker.bootstrap_servers, "dur-orphan")
        written = _open_transaction(orphaned, topic, "orphan", 4)  # acknowledged on both partitions
        broker.kill()
        assert _lose_unsynced_add_partitions(data_dir / "transactions" / "transactions.journal", "dur-orphan") >= 1

        broker.start()
        # Nothing lists the partitions in a transaction any more; without recovery their LSO would stay at 1.
        assert _end_offsets(broker.bootstrap_servers, topic, committed=True) == _end_offsets(
            broker.bootstrap_servers, topic, committed=False)
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(before)
        assert sorted(_read(broker.bootstrap_servers, topic, "read_uncommitted")) == sorted(before + written)
        # The producer was told its records were written: it must not commit the transaction without them.
        with pytest.raises(KafkaException):
            orphaned.commit_transaction(20)
        successor = _producer(broker.bootstrap_servers, "dur-orphan")
        after = _transaction(successor, topic, "after", 4)
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(before + after)
        broker.restart()
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(before + after)
    finally:
        broker.kill()


# -- phase 2: decided, markers not all written ---------------------------------------------


class _CrashAfterFirstMarker:
    """Transaction effects of a broker that dies after the first partition's marker, or (abort,
    `index_only`) after indexing that partition's aborted transaction but before its marker."""

    def __init__(self, store: TopicStore, index_only: bool = False) -> None:
        self.store = store
        self.index_only = index_only
        self.markers_written: list[tuple[str, int]] = []

    def write_markers(self, partitions: list[tuple[str, int]], producer_id: int, producer_epoch: int,
                      commit: bool, sync: bool = True) -> None:
        partition_log = self.store.partition(*partitions[0])
        if self.index_only:
            # The first half of PartitionLog.write_marker for an abort; no public way to stop there.
            first = partition_log.producers.open_transactions[producer_id]
            partition_log._aborted_index.append(
                [{"pid": producer_id, "first": first, "last": partition_log.log_end_offset}])
        else:
            partition_log.write_marker(producer_id, producer_epoch, commit)
        self.markers_written.append(partitions[0])
        raise _SimulatedCrash

    def complete_group_offsets(self, group: str, producer_id: int, commit: bool) -> None:
        raise AssertionError("no group is part of this transaction")

    def partition_exists(self, topic: str, partition: int) -> bool:
        return self.store.partition(topic, partition) is not None


class _SimulatedCrash(Exception):
    pass


def _decide_and_crash_midway(data_dir: Path, transactional_id: str, commit: bool, index_only: bool) -> None:
    """End the open transaction with the real coordinator and storage, dying after one marker."""
    store = TopicStore(data_dir / "topics")
    effects = _CrashAfterFirstMarker(store, index_only)
    coordinator = TransactionCoordinator(data_dir / "transactions", ProducerIdManager(data_dir / "producer-id-block"),
                                         effects, TransactionSettings())
    try:
        txn = coordinator.transactions[transactional_id]
        assert len(txn.partitions) == PARTITIONS
        with pytest.raises(_SimulatedCrash):
            coordinator.end_transaction(transactional_id, txn.producer_id, txn.producer_epoch, commit,
                                        int(time.time() * 1000))
        assert len(effects.markers_written) == 1
    finally:
        # No clean shutdown: no snapshot, no clean-shutdown file, as after kill -9.
        coordinator.close()
        for topic in store.topics.values():
            for partition_log in topic.partitions:
                partition_log.close_without_marker()
    reloaded = TransactionCoordinator(data_dir / "transactions", ProducerIdManager(data_dir / "producer-id-block"),
                                      _CrashAfterFirstMarker(store), TransactionSettings())
    try:
        assert reloaded.transactions[transactional_id].state == (PREPARE_COMMIT if commit else PREPARE_ABORT)
    finally:
        reloaded.close()


@pytest.mark.parametrize(("commit", "index_only"), [(True, False), (False, False), (False, True)],
                         ids=["commit", "abort", "abort-indexed-before-marker"])
def test_decided_transaction_with_missing_markers_completes_on_restart(tmp_path: Path, commit: bool,
                                                                       index_only: bool) -> None:
    topic = f"dur-{uuid.uuid4().hex[:8]}"
    data_dir = tmp_path / "broker"
    broker = _start(data_dir)
    try:
        before = _committed_before(broker, topic)
        pending = _open_transaction(_producer(broker.bootstrap_servers, "dur-decided"), topic, "decided", 6)
        broker.kill()

        _decide_and_crash_midway(data_dir, "dur-decided", commit, index_only)

        broker.start()
        expected = before + pending if commit else before
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(expected)
        # Every partition is stable again: both markers are in place (partition 0 has two).
        assert _end_offsets(broker.bootstrap_servers, topic, committed=True) == _end_offsets(
            broker.bootstrap_servers, topic, committed=False)
        # read_uncommitted sees the records exactly once either way: markers are not records.
        assert sorted(_read(broker.bootstrap_servers, topic, "read_uncommitted")) == sorted(before + pending)

        # The completion is itself durable, and the transactional id is usable again. Its later
        # committed transactions stay visible: an aborted transaction indexed twice (before the
        # crash and again by recovery) would make the reader drop them.
        broker.restart()
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(expected)
        successor = _producer(broker.bootstrap_servers, "dur-decided")
        after = _transaction(successor, topic, "after", 2) + _transaction(successor, topic, "later", 2)
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(expected + after)
    finally:
        broker.kill()


# -- phase 3: completed --------------------------------------------------------------------


def test_completed_transactions_unchanged_after_kill(tmp_path: Path) -> None:
    topic = f"dur-{uuid.uuid4().hex[:8]}"
    broker = _start(tmp_path / "broker")
    try:
        _create(broker.bootstrap_servers, topic)
        producer = _producer(broker.bootstrap_servers, "dur-complete")
        committed: list[str] = []
        written: list[str] = []
        for n in range(6):
            commit = n % 2 == 0
            values = _transaction(producer, topic, f"txn{n}", 4, commit=commit)
            written += values
            if commit:
                committed += values
        visible = _read(broker.bootstrap_servers, topic)
        assert sorted(visible) == sorted(committed)
        stable = _end_offsets(broker.bootstrap_servers, topic, committed=True)

        broker.restart()
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(visible)
        assert _end_offsets(broker.bootstrap_servers, topic, committed=True) == stable
        assert sorted(_read(broker.bootstrap_servers, topic, "read_uncommitted")) == sorted(written)

        # The producer whose broker died carries on with the epoch the coordinator remembered;
        # then a new instance with the same id fences it and works.
        committed += _transaction(producer, topic, "survivor", 2)
        successor = _producer(broker.bootstrap_servers, "dur-complete")
        more = _transaction(successor, topic, "after", 4)
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(committed + more)
        broker.restart()
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(committed + more)
        del producer
    finally:
        broker.kill()


# -- transactional.id expiration -------------------------------------------------------------


def test_idle_transactional_id_expires(tmp_path: Path) -> None:
    topic = f"dur-{uuid.uuid4().hex[:8]}"
    with EmbeddedBroker(tmp_path / "broker", transactional_id_expiration_ms=2000) as broker:
        coordinator = broker.broker.transactions
        _create(broker.bootstrap_servers, topic)
        first = _producer(broker.bootstrap_servers, "dur-expiring")
        _transaction(first, topic, "first", 2)
        first_id = coordinator.transactions["dur-expiring"].producer_id
        del first

        # Used again within the expiration: same producer id, next epoch.
        second = _producer(broker.bootstrap_servers, "dur-expiring")
        state = coordinator.transactions["dur-expiring"]
        assert (state.producer_id, state.producer_epoch) == (first_id, 1)
        _transaction(second, topic, "second", 2)
        del second

        _wait_until(lambda: "dur-expiring" not in coordinator.transactions, 10, "the idle id to expire")
        third = _producer(broker.bootstrap_servers, "dur-expiring")
        state = coordinator.transactions["dur-expiring"]
        assert state.producer_id != first_id and state.producer_epoch == 0
        third_values = _transaction(third, topic, "third", 2)
        assert sorted(_read(broker.bootstrap_servers, topic)) == sorted(
            ["first-0", "first-1", "second-0", "second-1", *third_values])
