"""The transaction coordinator at the wire: literal InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit, EndTxn and transactional Produce requests, and the exact
error code Kafka answers to each.

Real clients hide what these tests check: they retry, and librdkafka and the Java client map
INVALID_PRODUCER_EPOCH and PRODUCER_FENCED to the same fatal error, so a broker answering the
wrong code, or writing a second marker on a retried EndTxn, passes every client test. Expected
codes follow Apache Kafka's TransactionCoordinator with transaction version 1 (the only one
this broker offers; KIP-890 part 2 is not advertised) and its KIP-890 part 1 partition
verification, which is on by default since Kafka 3.6.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse, OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from kafka.record.memory_records import MemoryRecords

from sparkeos.broker import EmbeddedBroker
from support.wire import WireClient, build_batch

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
OPERATION_NOT_ATTEMPTED = 55
UNSTABLE_OFFSET_COMMIT = 88
PRODUCER_FENCED = 90

READ_UNCOMMITTED = 0
READ_COMMITTED = 1
ABORT_MARKER = 0
COMMIT_MARKER = 1

TopicPartition = tuple[str, int]


# -- a transactional producer driven by hand ---------------------------------------------------


@dataclass
class Txn:
    """One transactional.id over one connection: its producer id, epoch and per-partition sequences.

    Every call returns the broker's error code(s) instead of raising, and accepts an explicit
    `producer_id` / `producer_epoch` so a test can speak as a zombie or as another producer.
    """

    wire: WireClient
    transactional_id: str
    producer_id: int = -1
    producer_epoch: int = -1
    _next_sequence: dict[tuple[TopicPartition, int], int] = field(default_factory=dict)

    def _ids(self, producer_id: int | None, producer_epoch: int | None) -> tuple[int, int]:
        return (
            self.producer_id if producer_id is None else producer_id,
            self.producer_epoch if producer_epoch is None else producer_epoch,
        )

    def init(self, version: int = 1, producer_id: int = -1, producer_epoch: int = -1) -> int:
        """InitProducerId; on success the producer takes the returned id and epoch."""
        request = InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=60000,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
        )
        response = self.wire.request(request, InitProducerIdResponse, version)
        if response.error_code == NONE:
            self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch
        return response.error_code

    def init_like_a_client(self, timeout_s: float = 10.0) -> int:
        """InitProducerId retried on CONCURRENT_TRANSACTIONS, as every client does; returns the retries."""
        deadline = time.monotonic() + timeout_s
        retries = 0
        while (error := self.init()) == CONCURRENT_TRANSACTIONS and time.monotonic() < deadline:
            retries += 1
            time.sleep(0.05)
        assert error == NONE, f"InitProducerId failed with {error}"
        return retries

    def add_partitions(
        self,
        partitions: list[TopicPartition],
        version: int = 0,
        producer_id: int | None = None,
        producer_epoch: int | None = None,
    ) -> dict[TopicPartition, int]:
        pid, epoch = self._ids(producer_id, producer_epoch)
        Topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        topics = sorted({t for t, _ in partitions})
        request = AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.transactional_id,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[Topic(name=t, partitions=[p for name, p in partitions if name == t]) for t in topics],
        )
        response = self.wire.request(request, AddPartitionsToTxnResponse, version)
        return {
            (topic.name, result.partition_index): result.partition_error_code
            for topic in response.results_by_topic_v3_and_below
            for result in topic.results_by_partition
        }

    def add_offsets(
        self, group: str, version: int = 0, producer_id: int | None = None, producer_epoch: int | None = None
    ) -> int:
        pid, epoch = self._ids(producer_id, producer_epoch)
        request = AddOffsetsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=pid, producer_epoch=epoch, group_id=group
        )
        return self.wire.request(request, AddOffsetsToTxnResponse, version).error_code

    def commit_offsets(
        self,
        group: str,
        topic: str,
        offsets: dict[int, int],
        version: int = 0,
        producer_id: int | None = None,
        producer_epoch: int | None = None,
    ) -> dict[int, int]:
        """TxnOffsetCommit of `offsets` ({partition: next offset}); per-partition error codes."""
        pid, epoch = self._ids(producer_id, producer_epoch)
        Topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
        request = TxnOffsetCommitRequest(
            transactional_id=self.transactional_id,
            group_id=group,
            producer_id=pid,
            producer_epoch=epoch,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=[
                Topic(
                    name=topic,
                    partitions=[
                        Topic.TxnOffsetCommitRequestPartition(
                            partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=None
                        )
                        for p, o in offsets.items()
                    ],
                )
            ],
        )
        response = self.wire.request(request, TxnOffsetCommitResponse, version)
        return {p.partition_index: p.error_code for t in response.topics for p in t.partitions}

    def end(
        self, commit: bool, version: int = 0, producer_id: int | None = None, producer_epoch: int | None = None
    ) -> int:
        pid, epoch = self._ids(producer_id, producer_epoch)
        request = EndTxnRequest(
            transactional_id=self.transactional_id, producer_id=pid, producer_epoch=epoch, committed=commit
        )
        return self.wire.request(request, EndTxnResponse, version).error_code

    def produce(self, topic: str, partition: int, values: list[bytes], producer_epoch: int | None = None) -> int:
        """A transactional batch with the next sequence of (partition, epoch); the partition's error code."""
        pid, epoch = self._ids(None, producer_epoch)
        key = ((topic, partition), epoch)
        sequence = self._next_sequence.get(key, 0)
        batch = build_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=sequence, transactional=True)
        TopicData = ProduceRequest.TopicProduceData
        request = ProduceRequest(
            transactional_id=self.transactional_id,
            acks=-1,
            timeout_ms=10000,
            topic_data=[
                TopicData(name=topic, partition_data=[TopicData.PartitionProduceData(index=partition, records=batch)])
            ],
        )
        error = self.wire.request(request, ProduceResponse, 8).responses[0].partition_responses[0].error_code
        if error == NONE:
            self._next_sequence[key] = sequence + len(values)
        return error


# -- reading what a consumer would see ---------------------------------------------------------


@dataclass
class Marker:
    commit: bool
    producer_id: int
    producer_epoch: int


@dataclass
class Fetched:
    values: list[bytes]  # what a consumer delivers, aborted transactions filtered out
    markers: list[Marker]
    high_watermark: int
    last_stable_offset: int


def fetch(wire: WireClient, topic: str, isolation_level: int, partition: int = 0) -> Fetched:
    """One Fetch v4 from offset 0, filtered the way Kafka consumers filter it: a transactional
    batch of a producer listed in AbortedTransactions is dropped until that producer's ABORT marker."""
    FetchTopic = FetchRequest.FetchTopic
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=isolation_level,
        topics=[
            FetchTopic(
                topic=topic,
                partitions=[
                    FetchTopic.FetchPartition(partition=partition, fetch_offset=0, partition_max_bytes=1 << 20)
                ],
            )
        ],
    )
    answer = wire.request(request, FetchResponse, 4).responses[0].partitions[0]
    assert answer.error_code == NONE
    pending_aborts = sorted((a.first_offset, a.producer_id) for a in answer.aborted_transactions or [])
    aborted_producers: set[int] = set()
    values, markers = [], []
    records = MemoryRecords(bytes(answer.records or b""))
    while (batch := records.next_batch()) is not None:
        while pending_aborts and pending_aborts[0][0] <= batch.last_offset:
            aborted_producers.add(pending_aborts.pop(0)[1])
        if batch.is_control_batch:
            (control,) = list(batch)
            markers.append(Marker(control.type == COMMIT_MARKER, batch.producer_id, batch.producer_epoch))
            if control.type == ABORT_MARKER:
                aborted_producers.discard(batch.producer_id)
            continue
        if batch.is_transactional and batch.producer_id in aborted_producers:
            continue
        values.extend(record.value for record in batch)
    return Fetched(values, markers, answer.high_watermark, answer.last_stable_offset)


def committed_offset(
    wire: WireClient, group: str, topic: str, require_stable: bool, partition: int = 0
) -> tuple[int, int]:
    """OffsetFetch v7: (committed offset, partition error code)."""
    Topic = OffsetFetchRequest.OffsetFetchRequestTopic
    request = OffsetFetchRequest(
        group_id=group, topics=[Topic(name=topic, partition_indexes=[partition])], require_stable=require_stable
    )
    response = wire.request(request, OffsetFetchResponse, 7)
    assert response.error_code == NONE
    (answer,) = response.topics[0].partitions
    return answer.committed_offset, answer.error_code


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def wire(broker: EmbeddedBroker) -> Any:
    with WireClient(broker.bootstrap_servers) as client:
        yield client


def _topics(wire: WireClient, count: int) -> list[str]:
    """`count` fresh one-partition topics, created up front so AddPartitionsToTxn can find them."""
    names = [f"txw-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    response = wire.metadata(names)
    assert sorted((t.name, t.error_code) for t in response.topics) == sorted((n, NONE) for n in names)
    return names


def _begin(wire: WireClient, topic: str, values: list[bytes], transactional_id: str | None = None) -> Txn:
    """A producer with an open transaction that wrote `values` to `topic`-0."""
    txn = Txn(wire, transactional_id or f"txid-{uuid.uuid4().hex[:8]}")
    assert txn.init() == NONE
    assert txn.add_partitions([(topic, 0)]) == {(topic, 0): NONE}
    assert txn.produce(topic, 0, values) == NONE
    return txn


# -- 1. EndTxn retries ------------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_end_txn_retry_is_idempotent_and_the_opposite_end_is_refused(wire: WireClient, commit: bool) -> None:
    """Kafka (TransactionCoordinator.endTransaction, TV1): in CompleteCommit a retried commit
    answers NONE and an abort INVALID_TXN_STATE; in CompleteAbort the reverse. Neither writes
    anything: the partition keeps exactly one marker."""
    (topic,) = _topics(wire, 1)
    values = [b"a", b"b", b"c"]
    txn = _begin(wire, topic, values)
    assert fetch(wire, topic, READ_COMMITTED).values == [], "nothing is visible before EndTxn"

    assert txn.end(commit) == NONE
    assert txn.end(commit) == NONE, "a retried EndTxn in the same direction succeeds"
    assert txn.end(not commit) == INVALID_TXN_STATE
    assert txn.end(commit, version=3) == NONE, "the wrong-direction attempt changed nothing"

    everything = fetch(wire, topic, READ_UNCOMMITTED)
    assert [(m.commit, m.producer_id, m.producer_epoch) for m in everything.markers] == [
        (commit, txn.producer_id, txn.producer_epoch)
    ], "exactly one marker, in the decided direction, whatever the retries"
    assert everything.high_watermark == len(values) + 1
    committed = fetch(wire, topic, READ_COMMITTED)
    assert committed.values == (values if commit else [])
    assert committed.last_stable_offset == len(values) + 1


def test_end_txn_without_a_transaction_is_invalid_state(wire: WireClient) -> None:
    """Kafka answers INVALID_TXN_STATE to EndTxn in state Empty, for commit and abort alike (TV1)."""
    (topic,) = _topics(wire, 1)
    txn = Txn(wire, f"txid-{uuid.uuid4().hex[:8]}")
    assert txn.init() == NONE
    assert txn.end(True) == INVALID_TXN_STATE
    assert txn.end(False) == INVALID_TXN_STATE
    # ...and it stays refused after a transaction completed and the producer re-initialised.
    assert txn.add_partitions([(topic, 0)]) == {(topic, 0): NONE}
    assert txn.end(True) == NONE
    assert txn.init() == NONE
    assert txn.end(True) == INVALID_TXN_STATE
    assert fetch(wire, topic, READ_UNCOMMITTED).high_watermark == 1, "one COMMIT marker, nothing else"


# -- 2. CONCURRENT_TRANSACTIONS and fencing an ongoing transaction -----------------------------


def test_init_producer_id_aborts_the_ongoing_transaction_with_a_fence_epoch(
    broker: EmbeddedBroker, wire: WireClient
) -> None:
    """What Kafka does: while a transaction is PrepareCommit / PrepareAbort (markers being
    written), InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and a same-direction EndTxn
    answer CONCURRENT_TRANSACTIONS (51) and clients retry; an opposite-direction EndTxn answers
    INVALID_TXN_STATE. InitProducerId against an Ongoing transaction moves it to
    PrepareEpochFence: the epoch is bumped, ABORT markers are written with the bumped epoch, and
    the request itself answers CONCURRENT_TRANSACTIONS; the client's retry finds CompleteAbort
    and bumps once more, so the new producer gets epoch + 2.

    This broker writes the markers inside the EndTxn / InitProducerId handler before it answers,
    and handlers never interleave, so no request can see a Prepare state: the observable case is
    the one below. The test retries on 51 as a client would, so it holds for both behaviours,
    and checks the outcome Kafka guarantees: epoch + 2, one ABORT marker at epoch + 1, the
    pending records invisible, the old producer fenced.
    """
    (topic,) = _topics(wire, 1)
    zombie = _begin(wire, topic, [b"zombie"])
    old_epoch = zombie.producer_epoch

    with WireClient(broker.bootstrap_servers) as other:
        successor = Txn(other, zombie.transactional_id)
        successor.init_like_a_client()
        assert (successor.producer_id, successor.producer_epoch) == (zombie.producer_id, old_epoch + 2)

        aborted = fetch(wire, topic, READ_UNCOMMITTED)
        assert [(m.commit, m.producer_id, m.producer_epoch) for m in aborted.markers] == [
            (False, zombie.producer_id, old_epoch + 1)
        ]
        assert fetch(wire, topic, READ_COMMITTED).values == []
        assert zombie.end(True, version=2) == PRODUCER_FENCED

        assert successor.add_partitions([(topic, 0)]) == {(topic, 0): NONE}
        assert successor.produce(topic, 0, [b"successor"]) == NONE
        assert successor.end(True) == NONE
    assert fetch(wire, topic, READ_COMMITTED).values == [b"successor"]


def test_add_partitions_is_all_or_nothing(wire: WireClient) -> None:
    """Kafka: one unknown partition fails with UNKNOWN_TOPIC_OR_PARTITION and every other partition
    of the request with OPERATION_NOT_ATTEMPTED; none of them joins the transaction."""
    (topic,) = _topics(wire, 1)
    txn = Txn(wire, f"txid-{uuid.uuid4().hex[:8]}")
    assert txn.init() == NONE
    assert txn.add_partitions([(topic, 0), (topic, 7)]) == {
        (topic, 0): OPERATION_NOT_ATTEMPTED,
        (topic, 7): UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert txn.produce(topic, 0, [b"x"]) == INVALID_TXN_STATE, "the good partition was not added either"
    assert fetch(wire, topic, READ_UNCOMMITTED).high_watermark == 0


# -- 3. transactional Produce outside the transaction ------------------------------------------


def test_transactional_produce_to_a_partition_not_added_is_rejected(wire: WireClient) -> None:
    """Kafka (KIP-890 part 1): the partition leader verifies with the coordinator that the partition
    is in the transaction; the coordinator answers TRANSACTION_ABORTABLE, which the broker returns
    as INVALID_TXN_STATE (48) to Produce versions below 11 (this broker offers 0-9). Nothing of the
    rejected batch is written."""
    added, not_added = _topics(wire, 2)
    txn = Txn(wire, f"txid-{uuid.uuid4().hex[:8]}")
    assert txn.init() == NONE
    assert txn.produce(added, 0, [b"before-any-add"]) == INVALID_TXN_STATE, "no transaction is open yet"
    assert txn.add_partitions([(added, 0)]) == {(added, 0): NONE}
    assert txn.produce(not_added, 0, [b"stray"]) == INVALID_TXN_STATE
    assert txn.produce(added, 0, [b"inside"]) == NONE
    plain = build_batch(
        [b"not-transactional"], producer_id=txn.producer_id, producer_epoch=txn.producer_epoch, base_sequence=1
    )
    assert wire.produce(added, 0, plain).error_code == INVALID_TXN_STATE, "idempotent write inside an open txn"
    assert txn.end(True) == NONE
    assert txn.produce(added, 0, [b"after-commit"]) == INVALID_TXN_STATE, "the commit closed the transaction"

    stray = fetch(wire, not_added, READ_UNCOMMITTED)
    assert (stray.high_watermark, stray.values, stray.markers) == (0, [], [])
    assert fetch(wire, added, READ_COMMITTED).values == [b"inside"]
    assert fetch(wire, added, READ_UNCOMMITTED).high_watermark == 2  # the record and its COMMIT marker


# -- 4. fencing --------------------------------------------------------------------------------


def test_old_epoch_is_fenced_with_the_code_of_each_request_version(wire: WireClient) -> None:
    """After a second InitProducerId the older epoch is refused everywhere. Kafka's codes:
    - transaction-coordinator requests answer PRODUCER_FENCED (90) from the version that added it
      (KIP-588: AddPartitionsToTxn v2, AddOffsetsToTxn v2, EndTxn v2, InitProducerId v4) and
      INVALID_PRODUCER_EPOCH (47) below it;
    - Produce answers INVALID_PRODUCER_EPOCH at every version;
    - TxnOffsetCommit answers INVALID_PRODUCER_EPOCH at every version: it goes to the group
      coordinator, whose partition verification turns the coordinator's PRODUCER_FENCED into 47
      ("producers expect to handle INVALID_PRODUCER_EPOCH"), and no TxnOffsetCommit version
      added PRODUCER_FENCED.
    A higher epoch than the coordinator's is fenced too (client requests need an exact match).
    """
    topic, group = _topics(wire, 1)[0], f"g-{uuid.uuid4().hex[:8]}"
    zombie = _begin(wire, topic, [b"zombie"])
    assert zombie.add_offsets(group) == NONE
    old = zombie.producer_epoch
    current = Txn(wire, zombie.transactional_id)
    assert current.init() == NONE
    assert current.producer_epoch == old + 2
    assert current.add_partitions([(topic, 0)]) == {(topic, 0): NONE}
    assert current.add_offsets(group) == NONE

    def fenced_code(version: int, first_with_fenced: int) -> int:
        return PRODUCER_FENCED if version >= first_with_fenced else INVALID_PRODUCER_EPOCH

    assert zombie.produce(topic, 0, [b"late"], producer_epoch=old) == INVALID_PRODUCER_EPOCH
    for version in range(4):
        expected = fenced_code(version, 2)
        assert zombie.add_partitions([(topic, 0)], version=version) == {(topic, 0): expected}, version
        assert zombie.add_offsets(group, version=version) == expected, version
        assert zombie.end(True, version=version) == expected, version
        assert zombie.end(False, version=version) == expected, version
        assert zombie.commit_offsets(group, topic, {0: 5}, version=version) == {0: INVALID_PRODUCER_EPOCH}, version
    future = current.producer_epoch + 3
    assert current.add_partitions([(topic, 0)], version=2, producer_epoch=future) == {(topic, 0): PRODUCER_FENCED}
    assert current.end(True, version=2, producer_epoch=future) == PRODUCER_FENCED
    # KIP-360 InitProducerId (v3+) with a stale pid/epoch must not take over the id.
    assert zombie.init(version=3, producer_id=zombie.producer_id, producer_epoch=old) == INVALID_PRODUCER_EPOCH
    assert zombie.init(version=4, producer_id=zombie.producer_id, producer_epoch=old) == PRODUCER_FENCED

    assert current.produce(topic, 0, [b"current"]) == NONE
    assert current.commit_offsets(group, topic, {0: 2}) == {0: NONE}
    assert current.end(True) == NONE
    assert fetch(wire, topic, READ_COMMITTED).values == [b"current"]
    assert committed_offset(wire, group, topic, require_stable=True) == (2, NONE)


# -- 5. a producer id that does not belong to the transactional id -----------------------------


def test_producer_id_of_another_transactional_id_is_refused(wire: WireClient) -> None:
    """Kafka answers INVALID_PRODUCER_ID_MAPPING (49) when the producer id is not the one the
    coordinator holds for the transactional id, or when the id is unknown; it checks the id
    before the epoch, and the refused request changes nothing."""
    topic, group = _topics(wire, 1)[0], f"g-{uuid.uuid4().hex[:8]}"
    owner = _begin(wire, topic, [b"owner"])
    stranger = Txn(wire, f"txid-{uuid.uuid4().hex[:8]}")
    assert stranger.init() == NONE
    assert stranger.producer_id != owner.producer_id
    wrong = {"producer_id": stranger.producer_id, "producer_epoch": owner.producer_epoch}

    for version in (0, 2, 3):
        assert owner.add_partitions([(topic, 0)], version=version, **wrong) == {
            (topic, 0): INVALID_PRODUCER_ID_MAPPING
        }, version
        assert owner.add_offsets(group, version=version, **wrong) == INVALID_PRODUCER_ID_MAPPING, version
        assert owner.end(True, version=version, **wrong) == INVALID_PRODUCER_ID_MAPPING, version
        assert owner.end(False, version=version, **wrong) == INVALID_PRODUCER_ID_MAPPING, version
    assert owner.commit_offsets(group, topic, {0: 1}, **wrong) == {0: INVALID_PRODUCER_ID_MAPPING}

    unknown = Txn(wire, f"never-initialised-{uuid.uuid4().hex[:8]}", owner.producer_id, owner.producer_epoch)
    assert unknown.add_partitions([(topic, 0)]) == {(topic, 0): INVALID_PRODUCER_ID_MAPPING}
    assert unknown.end(True) == INVALID_PRODUCER_ID_MAPPING

    assert fetch(wire, topic, READ_UNCOMMITTED).markers == [], "no refused EndTxn wrote a marker"
    assert owner.end(True) == NONE
    assert fetch(wire, topic, READ_COMMITTED).values == [b"owner"]


# -- 6. transactional offsets --------------------------------------------------------------------


def test_txn_offset_commit_needs_add_offsets_to_txn(wire: WireClient) -> None:
    """Kafka: TxnOffsetCommit for a group whose offsets partition was not added with AddOffsetsToTxn
    fails partition verification with TRANSACTION_ABORTABLE, returned as INVALID_TXN_STATE (48) to
    TxnOffsetCommit versions below 4. The offsets are never published."""
    topic, group = _topics(wire, 1)[0], f"g-{uuid.uuid4().hex[:8]}"
    txn = Txn(wire, f"txid-{uuid.uuid4().hex[:8]}")
    assert txn.init() == NONE
    assert txn.commit_offsets(group, topic, {0: 3}) == {0: INVALID_TXN_STATE}, "no transaction is open"
    assert txn.add_partitions([(topic, 0)]) == {(topic, 0): NONE}
    for version in range(4):
        assert txn.commit_offsets(group, topic, {0: 3}, version=version) == {0: INVALID_TXN_STATE}, version
    assert txn.add_offsets(f"{group}-other") == NONE
    assert txn.commit_offsets(group, topic, {0: 3}) == {0: INVALID_TXN_STATE}, "another group was added"
    assert committed_offset(wire, group, topic, require_stable=True) == (-1, NONE), "nothing was staged"
    assert txn.end(True) == NONE
    assert committed_offset(wire, group, topic, require_stable=True) == (-1, NONE)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_txn_offsets_are_published_only_by_commit(wire: WireClient, commit: bool) -> None:
    """Kafka: offsets staged by TxnOffsetCommit are invisible to OffsetFetch until the COMMIT marker;
    meanwhile an OffsetFetch with require_stable (v7+) answers UNSTABLE_OFFSET_COMMIT (88) for that
    partition and one without it answers the last published offset. ABORT drops them."""
    topic, group = _topics(wire, 1)[0], f"g-{uuid.uuid4().hex[:8]}"
    earlier = _begin(wire, topic, [b"earlier"])
    assert earlier.add_offsets(group) == NONE
    assert earlier.commit_offsets(group, topic, {0: 1}, version=3) == {0: NONE}
    assert earlier.end(True) == NONE
    assert committed_offset(wire, group, topic, require_stable=True) == (1, NONE)

    txn = Txn(wire, earlier.transactional_id)
    assert txn.init() == NONE
    assert txn.add_offsets(group) == NONE
    assert txn.commit_offsets(group, topic, {0: 7}) == {0: NONE}
    assert committed_offset(wire, group, topic, require_stable=True) == (-1, UNSTABLE_OFFSET_COMMIT)
    assert committed_offset(wire, group, topic, require_stable=False) == (1, NONE)

    assert txn.end(commit) == NONE
    expected = 7 if commit else 1
    assert committed_offset(wire, group, topic, require_stable=True) == (expected, NONE)
    assert committed_offset(wire, group, topic, require_stable=False) == (expected, NONE)
    assert txn.end(commit) == NONE, "a retried EndTxn"
    assert committed_offset(wire, group, topic, require_stable=True) == (expected, NONE)
