"""EndTxn is answered once the decision is durable and the markers are written; the markers'
fsync and the Complete record follow in the background, and the transactional id's next
request waits for them instead of failing with CONCURRENT_TRANSACTIONS.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)

from sparkeos.broker import BrokerProcess, EmbeddedBroker
from sparkeos.broker.coordinator.transactions import COMPLETE_COMMIT, ONGOING
from sparkeos.verify import read_values
from support.wire import WireClient, build_batch

NONE = 0


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)


def init_transactional(wire: WireClient, transactional_id: str) -> tuple[int, int]:
    request = InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=60000)
    response = wire.request(request, InitProducerIdResponse, 1)
    assert response.error_code == NONE
    return response.producer_id, response.producer_epoch


def add_partition_request(transactional_id: str, producer_id: int, epoch: int, topic: str) -> AddPartitionsToTxnRequest:
    Topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
    return AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=transactional_id,
        v3_and_below_producer_id=producer_id,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[Topic(name=topic, partitions=[0])],
    )


def add_partition_error(response: AddPartitionsToTxnResponse) -> int:
    return response.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code


def produce_transactional(
    wire: WireClient, transactional_id: str, producer_id: int, epoch: int, topic: str, values: list[bytes], seq: int
) -> None:
    batch = build_batch(values, producer_id=producer_id, producer_epoch=epoch, base_sequence=seq, transactional=True)
    TopicData = ProduceRequest.TopicProduceData
    request = ProduceRequest(
        transactional_id=transactional_id,
        acks=-1,
        timeout_ms=10000,
        topic_data=[TopicData(name=topic, partition_data=[TopicData.PartitionProduceData(index=0, records=batch)])],
    )
    error = wire.request(request, ProduceResponse, 8).responses[0].partition_responses[0].error_code
    assert error == NONE


def end_request(transactional_id: str, producer_id: int, epoch: int, commit: bool) -> EndTxnRequest:
    return EndTxnRequest(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch, committed=commit
    )


def test_next_transaction_pipelined_behind_end_txn_waits_instead_of_failing(
    broker: EmbeddedBroker, topic_name: str
) -> None:
    create_topic(broker.bootstrap_servers, topic_name)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    with WireClient(broker.bootstrap_servers) as wire:
        pid, epoch = init_transactional(wire, transactional_id)
        add = add_partition_request(transactional_id, pid, epoch, topic_name)
        assert add_partition_error(wire.request(add, AddPartitionsToTxnResponse, 0)) == NONE
        produce_transactional(wire, transactional_id, pid, epoch, topic_name, [b"a", b"b"], 0)
        # Sent back to back: the second transaction's AddPartitionsToTxn reaches the broker while
        # the first one's completion may still be running.
        end_id = wire.send(end_request(transactional_id, pid, epoch, True), 0)
        add_id = wire.send(add, 0)
        assert wire.receive(EndTxnResponse, 0, end_id).error_code == NONE
        assert add_partition_error(wire.receive(AddPartitionsToTxnResponse, 0, add_id)) == NONE
        assert broker.broker.transactions.transactions[transactional_id].state == ONGOING
        produce_transactional(wire, transactional_id, pid, epoch, topic_name, [b"c"], 2)
        assert wire.request(end_request(transactional_id, pid, epoch, True), EndTxnResponse, 0).error_code == NONE
    assert read_values(broker.bootstrap_servers, topic_name) == [b"a", b"b", b"c"]


def test_commit_answered_then_kill_9_stays_committed(tmp_path: Path, topic_name: str) -> None:
    process = BrokerProcess(tmp_path / "data").start()
    try:
        create_topic(process.bootstrap_servers, topic_name)
        transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
        with WireClient(process.bootstrap_servers) as wire:
            pid, epoch = init_transactional(wire, transactional_id)
            add = add_partition_request(transactional_id, pid, epoch, topic_name)
            assert add_partition_error(wire.request(add, AddPartitionsToTxnResponse, 0)) == NONE
            produce_transactional(wire, transactional_id, pid, epoch, topic_name, [b"x", b"y"], 0)
            assert wire.request(end_request(transactional_id, pid, epoch, True), EndTxnResponse, 0).error_code == NONE
        process.kill()
        process.restart()
        assert read_values(process.bootstrap_servers, topic_name) == [b"x", b"y"]
    finally:
        process.kill()


def test_broker_close_waits_for_background_completions(tmp_path: Path, topic_name: str) -> None:
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    with EmbeddedBroker(tmp_path / "data") as broker:
        create_topic(broker.bootstrap_servers, topic_name)
        with WireClient(broker.bootstrap_servers) as wire:
            pid, epoch = init_transactional(wire, transactional_id)
            add = add_partition_request(transactional_id, pid, epoch, topic_name)
            assert add_partition_error(wire.request(add, AddPartitionsToTxnResponse, 0)) == NONE
            produce_transactional(wire, transactional_id, pid, epoch, topic_name, [b"z"], 0)
            assert wire.request(end_request(transactional_id, pid, epoch, True), EndTxnResponse, 0).error_code == NONE
    with EmbeddedBroker(tmp_path / "data") as reopened:
        # A clean shutdown leaves nothing for recovery to finish: the Complete record was written.
        assert reopened.broker.transactions.transactions[transactional_id].state == COMPLETE_COMMIT
        assert read_values(reopened.bootstrap_servers, topic_name) == [b"z"]
