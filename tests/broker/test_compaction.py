"""Log compaction (cleanup.policy=compact), read by real clients: librdkafka (confluent-kafka) and kafka-python
(support/wire.py, which also shows the batches the log holds, markers included).

Small segments and a cleanable ratio near zero make the cleaner run within a second or two of a segment rolling;
every test waits for what a pass leaves, never for a fixed time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
    ResourceType,
)

from sparkeos import failpoints
from sparkeos.broker import BrokerProcess, EmbeddedBroker
from sparkeos.broker.storage.cleaner import STEP_INDEX_REWRITTEN, STEP_SEGMENT_SWAPPED, STEP_WRITTEN
from sparkeos.verify import READ_COMMITTED, READ_UNCOMMITTED, read_records
from support.spark import create_topic, unique, wait_for
from support.wire import WireClient

# Segments of a few batches, cleaned as soon as they roll.
EAGER = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01"}
# Tombstones and the markers of emptied transactions go at the first pass after them.
NO_DELETE_RETENTION = {**EAGER, "delete.retention.ms": "0"}


Written = dict[int, tuple[bytes, bytes | None]]  # offset -> (key, value)


def produce(bootstrap: str, topic: str, pairs: list[tuple[bytes, bytes | None]], **config) -> Written:
    """(key, value) pairs, idempotently (with librdkafka's `config`); returns what each offset holds."""
    written: dict[int, tuple[bytes, bytes | None]] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0, **config})
    for key, value in pairs:
        producer.produce(topic, value, key=key, partition=0,
                         on_delivery=lambda error, message: written.__setitem__(
                             message.offset(), (message.key(), message.value())) if error is None else None)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert len(written) == len(pairs)
    return written


def roll_past(bootstrap: str, topic: str) -> Written:
    """Records of unique keys, enough to roll the active segment: everything before them becomes cleanable."""
    return produce(bootstrap, topic, [(unique("filler").encode(), b"x" * 400) for _ in range(12)])


def on_log(bootstrap: str, topic: str) -> list:
    with WireClient(bootstrap) as wire:
        return wire.log_batches(topic)


def read(bootstrap: str, topic: str, isolation: str = READ_COMMITTED) -> Written:
    return {r.offset: (r.key, r.value) for r in read_records(bootstrap, topic, isolation_level=isolation)}


def set_compaction_lag(bootstrap: str, topic: str, lag_ms: int) -> None:
    """min.compaction.lag.ms: the cleaner leaves segments with records younger than that."""
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", str(lag_ms), incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.incremental_alter_configs([resource])  # held until the result: the client must outlive it
    futures[resource].result(30)


def last_per_key(written: Written) -> Written:
    last: dict[bytes, int] = {}
    for offset in sorted(written):
        last[written[offset][0]] = offset
    return {offset: written[offset] for offset in sorted(last.values())}


def overwritten(bootstrap: str, keys: int, records: int) -> tuple[str, Written]:
    """A compacted topic where `records` records overwrite `keys` keys in turn, all in segments that rolled."""
    topic = create_topic(bootstrap, unique("compacted"), config=EAGER)
    written = produce(bootstrap, topic, [(b"key-%d" % (i % keys), b"value-%d" % i) for i in range(records)])
    return topic, written | roll_past(bootstrap, topic)


def test_keys_overwritten_many_times_shrink_to_one_record_each_at_their_offsets(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        topic, written = overwritten(bootstrap, 20, 2000)
        expected = last_per_key(written)
        # Until the cleaner has been through every closed segment: each overwritten key once.
        wait_for(lambda: len([kv for kv in read(bootstrap, topic).values() if kv[0].startswith(b"key-")]) == 20,
                 timeout_s=60, what="the topic to be compacted")
        seen = read(bootstrap, topic)
        keys = [kv[0] for kv in seen.values() if kv[0].startswith(b"key-")]
        assert sorted(keys) == sorted(b"key-%d" % i for i in range(20)), keys
        # Offsets never move: each record read is the one written at that offset, and the last of its key.
        assert all(written[offset] == kv for offset, kv in seen.items())
        assert all(expected.get(offset) == kv for offset, kv in seen.items())
        # kafka-python reads the rewritten batches too, and sees the same records.
        logged = {b.base_offset: b for b in on_log(bootstrap, topic) if not b.control}
        assert sum(len(b.values) for b in logged.values()) == len(seen)
        # The log end is where it was; a producer carries on from it.
        more = produce(bootstrap, topic, [(b"key-0", b"after")])
        assert list(more) == [max(written) + 1]


def test_tombstones_go_after_delete_retention_ms_and_stay_before(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        kept = create_topic(bootstrap, unique("keeps-tombstones"), config=EAGER)
        dropped = create_topic(bootstrap, unique("drops-tombstones"), config=NO_DELETE_RETENTION)
        for topic in (kept, dropped):
            produce(bootstrap, topic, [(b"gone", b"1"), (b"stays", b"1"), (b"gone", b"2"), (b"gone", None)])
            roll_past(bootstrap, topic)
        wait_for(lambda: b"gone" not in {k for k, _ in read(bootstrap, dropped).values()}, timeout_s=60,
                 what="the tombstone to go")
        wait_for(lambda: [v for k, v in read(bootstrap, kept).values() if k == b"gone"] == [None], timeout_s=60,
                 what="the overwritten values to go")
        assert [v for k, v in read(bootstrap, dropped).values() if k == b"stays"] == [b"1"]


def test_a_cleaned_log_survives_kill_9_and_a_producer_carries_on(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        topic, written = overwritten(bootstrap, 10, 1500)
        wait_for(lambda: len(read(bootstrap, topic)) < 100, timeout_s=60, what="the topic to be compacted")
        before = read(bootstrap, topic)
        broker.restart()  # kill -9, then start on the same data
        bootstrap = broker.bootstrap_servers
        assert read(bootstrap, topic) == before
        assert not list((tmp_path / "broker").rglob("*.cleaned"))
        # The producer state survived the cleaning: a new idempotent producer appends at the log end.
        more = produce(bootstrap, topic, [(b"key-0", b"after the restart")])
        assert list(more) == [max(written) + 1]


class Transactions:
    """A transactional producer writing rounds of the same keys to a topic, committing two rounds in three and
    aborting the third (its records on the log first); what a read_committed reader must see at any time."""

    KEYS = 5

    def __init__(self, bootstrap: str, topic: str, transactional_id: str) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                  "linger.ms": 0})
        self.producer.init_transactions(30)
        self.committed: dict[bytes, bytes] = {}
        self.aborted: set[bytes] = set()
        self.rounds = 0

    def write(self, rounds: int) -> None:
        for _ in range(rounds):
            n = self.rounds
            self.rounds += 1
            values = {b"key-%d" % k: b"round-%d-%d" % (n, k) for k in range(self.KEYS)}
            self.producer.begin_transaction()
            for key, value in values.items():
                self.producer.produce(self.topic, value, key=key, partition=0)
            if n % 3 == 2:
                self.producer.flush(30)  # on the log before the abort (librdkafka would purge them unsent)
                self.producer.abort_transaction(30)
                self.aborted |= set(values.values())
            else:
                self.producer.commit_transaction(30)
                self.committed |= values

    def check(self, bootstrap: str) -> Written:
        """What a read_committed reader from offset 0 reads must be right; returns it."""
        seen = read(bootstrap, self.topic)
        last: dict[bytes, bytes | None] = {}
        for _, (key, value) in sorted(seen.items()):
            last[key] = value
        assert not self.aborted & {v for _, v in seen.values()}, "an aborted record was read under read_committed"
        assert {k: v for k, v in last.items() if k.startswith(b"key-")} == self.committed
        return seen

    def compacted(self, bootstrap: str) -> bool:
        """Every overwritten key once and no aborted record, even read uncommitted."""
        uncommitted = read(bootstrap, self.topic, READ_UNCOMMITTED)
        return (len([k for k, _ in uncommitted.values() if k.startswith(b"key-")]) == self.KEYS
                and not self.aborted & {v for _, v in uncommitted.values()})


def test_transactions_compact_to_the_last_committed_value_and_markers_follow_their_records(tmp_path: Path) -> None:
    """Aborted records go; a marker goes once no record of its transaction is left (and never before the index
    entry of an aborted transaction it ends): a read_committed reader from offset 0 sees the last committed value
    of each key, at every step, and nothing of an aborted transaction."""
    with EmbeddedBroker(tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("transactional"), config=NO_DELETE_RETENTION)
        transactions = Transactions(bootstrap, topic, unique("txn"))
        transactions.write(60)
        roll_past(bootstrap, topic)
        transactions.check(bootstrap)
        # Cleaned: each key once, no aborted record even read uncommitted, and only the markers of transactions
        # that still have a batch (the producer's last one, kept without records if need be).
        wait_for(lambda: transactions.compacted(bootstrap) and sum(b.control for b in on_log(bootstrap, topic)) <= 2,
                 timeout_s=60, what="the transactions to be compacted")
        transactions.check(bootstrap)
        # Later transactions of the same producer read as committed: no stale aborted-transaction entry hides them.
        transactions.write(3)
        transactions.check(bootstrap)


@pytest.mark.parametrize("step", [STEP_WRITTEN, STEP_INDEX_REWRITTEN, STEP_SEGMENT_SWAPPED])
def test_a_broker_killed_at_each_step_of_a_cleaning_pass_restarts_with_the_committed_view_intact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """kill -9 while the cleaner is held at `step` (the broker's own thread stops there), then a restart on the same
    data: a read_committed reader sees the last committed value of each key and nothing aborted, the cleaner
    finishes the job, and the producer carries on."""
    holds_dir = tmp_path / "failpoints"
    monkeypatch.setenv(failpoints.ENV, str(holds_dir))
    with BrokerProcess(tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("transactional"),
                             config={**NO_DELETE_RETENTION, "segment.bytes": "1024"})
        transactional_id = unique("txn")
        transactions = Transactions(bootstrap, topic, transactional_id)
        if step == STEP_INDEX_REWRITTEN:
            # Only a pass that removes ABORT markers rewrites the index: the one after the pass that emptied their
            # transactions.
            transactions.write(30)
            roll_past(bootstrap, topic)
            wait_for(lambda: transactions.compacted(bootstrap), timeout_s=60, what="a first pass")
        # The cleaner waits while the input is written (the hold stops the broker's own thread, so a pass held
        # while a client waits for an answer would time it out), then takes it at once.
        set_compaction_lag(bootstrap, topic, 3_600_000)
        transactions.write(30)
        roll_past(bootstrap, topic)
        known = failpoints.arm_hold(holds_dir, step)
        set_compaction_lag(bootstrap, topic, 0)
        wait_for(lambda: failpoints.holds(holds_dir, step) - known, timeout_s=60, what=f"the cleaner to reach {step}")
        broker.restart()  # kill -9 while held, then start on the same data
        for held in failpoints.holds(holds_dir, step):
            held.unlink()
        bootstrap = broker.bootstrap_servers
        transactions.check(bootstrap)
        assert not list((tmp_path / "broker").rglob("*.cleaned"))
        wait_for(lambda: transactions.compacted(bootstrap), timeout_s=60,
                 what="the cleaner to finish after the restart")
        transactions.check(bootstrap)
        carrying_on = Transactions(bootstrap, topic, transactional_id)
        carrying_on.committed, carrying_on.aborted, carrying_on.rounds = (
            transactions.committed, transactions.aborted, transactions.rounds)
        carrying_on.write(3)
        carrying_on.check(bootstrap)


def test_segments_the_cleaner_emptied_still_expire_under_compact_delete(tmp_path: Path) -> None:
    """compact,delete: the cleaner empties the segments whose keys were all overwritten later, and retention.ms
    then deletes old segments from the start of the log as usual (an emptied segment has no timestamp left: it
    must not stop retention there)."""
    config = {**NO_DELETE_RETENTION, "cleanup.policy": "compact,delete", "retention.ms": "6000"}
    with EmbeddedBroker(tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        topic = create_topic(bootstrap, unique("compact-delete"), config=config)
        # One record per batch: the segments before the last of them hold no producer's last batch, and empty.
        written = produce(bootstrap, topic, [(b"key-%d" % (i % 5), b"value-%d" % i) for i in range(400)],
                          **{"batch.num.messages": 1})
        rolled = roll_past(bootstrap, topic)
        produce(bootstrap, topic, [(b"late", b"in the active segment")])
        admin = AdminClient({"bootstrap.servers": bootstrap})
        partition = TopicPartition(topic, 0)

        def log_start() -> int:
            return admin.list_offsets({partition: OffsetSpec.earliest()})[partition].result(30).offset

        wait_for(lambda: log_start() > max(written), timeout_s=60, what="retention to pass the emptied segments")
        assert log_start() <= max(rolled) + 1
