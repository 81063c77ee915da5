"""Consumer groups (classic protocol) and committed offsets, with real clients over TCP.

confluent-kafka, kafka-python and aiokafka consumers join, rebalance, commit and resume; a
small raw-protocol client checks the error codes that the libraries hide.
"""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from confluent_kafka import Consumer, ConsumerGroupState, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

from sparkeos.broker import BrokerProcess, EmbeddedBroker

PARTITIONS = 6
SESSION_MS = 6000


# -- helpers -------------------------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], timeout: float, step: Callable[[], None] | None = None,
             what: str = "condition") -> float:
    """Run `step` until `condition` holds; returns the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if step is not None:
            step()
        else:
            time.sleep(0.05)
        if condition():
            return time.monotonic() - start
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def produce(bootstrap: str, topic: str, per_partition: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, f"{partition}-{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def group_consumer(bootstrap: str, group: str, **extra: object) -> Consumer:
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": 300,
    }
    config.update(extra)
    return Consumer(config)


def partitions_of(consumer: Consumer) -> list[int]:
    return sorted(tp.partition for tp in consumer.assignment())


def balanced(assignments: list[list[int]], partitions: int = PARTITIONS) -> bool:
    """Every member has work and every partition has exactly one owner."""
    return all(assignments) and sorted(p for a in assignments for p in a) == list(range(partitions))


def committed_with_metadata(bootstrap: str, group: str, topic: str, partitions: list[int]) -> list[tuple]:
    """(offset, metadata) per partition, read with kafka-python.

    confluent-kafka's `TopicPartition.metadata` strdup()s the buffer librdkafka read, which
    has no terminating NUL, so metadata committed by other clients can come back with
    trailing garbage. confluent-kafka itself commits the NUL (strlen + 1 bytes), which is why
    its own commits read back cleanly.
    """
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        found = [consumer.committed(KafkaTopicPartition(topic, p), metadata=True) for p in partitions]
        return [(f.offset, f.metadata) if f is not None else None for f in found]
    finally:
        consumer.close()


def describe(admin: AdminClient, group: str):
    return admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)


CHILD_CONSUMER = """
import json, sys
from confluent_kafka import Consumer
config, topic = json.loads(sys.argv[1]), sys.argv[2]
consumer = Consumer(config)
consumer.subscribe([topic])
last = None
while True:
    consumer.poll(0.1)
    current = sorted(tp.partition for tp in consumer.assignment())
    if current != last:
        print(json.dumps(current), flush=True)
        last = current
"""


class ChildConsumer:
    """A confluent consumer in its own process, so it can die without leaving the group."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        config = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 300}
        self.process = subprocess.Popen([sys.executable, "-c", CHILD_CONSUMER, json.dumps(config), topic],
                                        stdout=subprocess.PIPE, text=True)
        self.assignment: list[int] = []
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)

    def refresh(self) -> list[int]:
        while not self._lines.empty():
            self.assignment = json.loads(self._lines.get_nowait())
        return self.assignment

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


class RawClient:
    """One connection speaking the Kafka protocol directly, for exact error codes."""

    def __init__(self, bootstrap: str, client_id: str = "raw") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.client_id = client_id
        self.correlation = 0

    def call(self, request_class, response_class, version: int, **fields):
        self.correlation += 1
        request = request_class(**fields)
        request.with_header(correlation_id=self.correlation, client_id=self.client_id)
        self.sock.sendall(request.encode(version=version, header=True, framed=True))
        (size,) = struct.unpack(">i", self._read(4))
        response = response_class.decode(self._read(size), version=version, header=True)
        assert response.header.correlation_id == self.correlation
        return response

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            data += chunk
        return data

    def join(self, group: str, member_id: str = "", version: int = 5, session_ms: int = 10000,
             rebalance_ms: int = 10000, protocols: tuple[str, ...] = ("range",), instance_id: str | None = None):
        return self.call(JoinGroupRequest, JoinGroupResponse, version, group_id=group, session_timeout_ms=session_ms,
                         rebalance_timeout_ms=rebalance_ms, member_id=member_id, group_instance_id=instance_id,
                         protocol_type="consumer",
                         protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name=p, metadata=f"{p}-meta".encode())
                                    for p in protocols])

    def join_with_id(self, group: str, **kwargs):
        """JoinGroup v4+: the first attempt hands out a member id (MEMBER_ID_REQUIRED)."""
        first = self.join(group, **kwargs)
        assert first.error_code == 79 and first.member_id
        return self.join(group, member_id=first.member_id, **kwargs)

    def sync(self, group: str, generation: int, member_id: str, assignments: dict[str, bytes] | None = None,
             version: int = 5, protocol_name: str | None = "range"):
        return self.call(SyncGroupRequest, SyncGroupResponse, version, group_id=group, generation_id=generation,
                         member_id=member_id, protocol_type="consumer", protocol_name=protocol_name,
                         assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=m, assignment=a)
                                      for m, a in (assignments or {}).items()])

    def heartbeat(self, group: str, generation: int, member_id: str, version: int = 4) -> int:
        return self.call(HeartbeatRequest, HeartbeatResponse, version, group_id=group, generation_id=generation,
                         member_id=member_id).error_code

    def commit(self, group: str, topic: str, offsets: dict[int, int], generation: int = -1, member_id: str = "",
               metadata: str | None = "", version: int = 8) -> dict[int, int]:
        Topic = OffsetCommitRequest.OffsetCommitRequestTopic
        response = self.call(OffsetCommitRequest, OffsetCommitResponse, version, group_id=group,
                             generation_id_or_member_epoch=generation, member_id=member_id, topics=[Topic(
                                 name=topic, partitions=[
                                     Topic.OffsetCommitRequestPartition(partition_index=p, committed_offset=o,
                                                                        committed_metadata=metadata)
                                     for p, o in offsets.items()])])
        return {p.partition_index: p.error_code for t in response.topics for p in t.partitions}

    def describe(self, group: str, version: int = 5):
        response = self.call(DescribeGroupsRequest, DescribeGroupsResponse, version, groups=[group],
                             include_authorized_operations=False)
        return response.groups[0]

    def close(self) -> None:
        self.sock.close()


# -- rebalancing with real consumers -------------------------------------------------------------


def test_assignments_rebalance_as_members_join_leave_and_die(tmp_path: Path, topic_name: str) -> None:
    with EmbeddedBroker(tmp_path / "broker", num_partitions=PARTITIONS) as broker:
        bootstrap = broker.bootstrap_servers
        produce(bootstrap, topic_name, 2, PARTITIONS)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        group = "rebalancing"

        first = group_consumer(bootstrap, group)
        first.subscribe([topic_name])
        wait_for(lambda: partitions_of(first) == list(range(PARTITIONS)), 20, lambda: first.poll(0.1),
                 "the first member to own every partition")

        second = group_consumer(bootstrap, group)
        second.subscribe([topic_name])

        def poll_both() -> None:
            first.poll(0.05)
            second.poll(0.05)

        wait_for(lambda: balanced([partitions_of(first), partitions_of(second)]), 30, poll_both,
                 "two members to split the partitions")
        assert len(partitions_of(first)) == len(partitions_of(second)) == 3

        child = ChildConsumer(bootstrap, group, topic_name)
        try:
            wait_for(lambda: balanced([partitions_of(first), partitions_of(second), child.refresh()]), 40,
                     poll_both, "three members to split the partitions")
            assert [len(partitions_of(first)), len(partitions_of(second)), len(child.assignment)] == [2, 2, 2]
            # The broker's view of the stable generation agrees with the members'.
            description = describe(admin, group)
            assert description.state == ConsumerGroupState.STABLE
            assert description.partition_assignor == "range"
            broker_view = [sorted(tp.partition for tp in m.assignment.topic_partitions)
                           for m in description.members]
            assert len(broker_view) == 3 and balanced(broker_view)

            # A clean close sends LeaveGroup: the others take over without waiting for a timeout.
            second.close()
            took = wait_for(lambda: balanced([partitions_of(first), child.refresh()]), 20,
                            lambda: first.poll(0.05), "two members after one left")
            assert took < SESSION_MS / 1000, "a leaving member must not cost a session timeout"
            assert len(partitions_of(first)) == len(child.assignment) == 3

            # A crashed member is noticed once its session expires.
            child.kill()
            killed_at = time.monotonic()
            wait_for(lambda: partitions_of(first) == list(range(PARTITIONS)), 30, lambda: first.poll(0.05),
                     "the survivor to own every partition")
            assert time.monotonic() - killed_at >= SESSION_MS / 1000 - 1.5
            description = describe(admin, group)
            assert description.state == ConsumerGroupState.STABLE and len(description.members) == 1
        finally:
            child.kill()
            first.close()


def test_committed_offsets_with_metadata_survive_kill_9(tmp_path: Path, topic_name: str) -> None:
    process = BrokerProcess(tmp_path / "broker", extra_args=["--num-partitions", "2"])
    process.start()
    try:
        produce(process.bootstrap_servers, topic_name, 10, 2)
        consumer = group_consumer(process.bootstrap_servers, "resumable")
        consumer.subscribe([topic_name])
        seen: list[tuple[int, int]] = []

        def consume() -> None:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                seen.append((message.partition(), message.offset()))

        wait_for(lambda: len(seen) == 20, 30, consume, "all 20 records")
        commits = [TopicPartition(topic_name, 0, 4, metadata="checkpoint-0"),
                   TopicPartition(topic_name, 1, 7, metadata="checkpoint-1")]
        result = consumer.commit(offsets=commits, asynchronous=False)
        assert all(tp.error is None for tp in result)
        consumer.close()

        process.kill()
        # A crash in the middle of a later commit leaves a torn record at the tail.
        with open(tmp_path / "broker" / "groups" / "offsets.log", "ab") as log_file:
            log_file.write(b"\x00\x00\x01\x00\xde\xad")
        process.start()

        resumed = group_consumer(process.bootstrap_servers, "resumable")
        try:
            committed = resumed.committed([TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)], timeout=20)
            assert [(tp.partition, tp.offset, tp.metadata) for tp in committed] == [
                (0, 4, "checkpoint-0"), (1, 7, "checkpoint-1")]
            # The broker keeps the exact bytes, including the NUL that confluent-kafka commits.
            assert committed_with_metadata(process.bootstrap_servers, "resumable", topic_name, [0, 1]) == [
                (4, "checkpoint-0\x00"), (7, "checkpoint-1\x00")]
            resumed.subscribe([topic_name])
            first_offsets: dict[int, int] = {}

            def consume_resumed() -> None:
                message = resumed.poll(0.1)
                if message is not None and message.error() is None:
                    first_offsets.setdefault(message.partition(), message.offset())

            wait_for(lambda: len(first_offsets) == 2, 30, consume_resumed, "records from both partitions")
            assert first_offsets == {0: 4, 1: 7}
        finally:
            resumed.close()
    finally:
        process.kill()


def test_offsets_of_an_empty_group_expire_after_retention(tmp_path: Path, topic_name: str) -> None:
    retention_ms = 1500
    with EmbeddedBroker(tmp_path / "broker", offsets_retention_ms=retention_ms,
                        offsets_retention_check_interval_ms=100) as broker:
        bootstrap = broker.bootstrap_servers
        produce(bootstrap, topic_name, 3, 1)
        partition = TopicPartition(topic_name, 0)
        admin = AdminClient({"bootstrap.servers": bootstrap})

        leaving = group_consumer(bootstrap, "leaves")
        staying = group_consumer(bootstrap, "stays")
        for consumer in (leaving, staying):
            consumer.subscribe([topic_name])
        wait_for(lambda: bool(leaving.assignment()) and bool(staying.assignment()), 20,
                 lambda: (leaving.poll(0.05), staying.poll(0.05)), "both groups to assign the partition")
        leaving.commit(offsets=[TopicPartition(topic_name, 0, 2, metadata="bye")], asynchronous=False)
        staying.commit(offsets=[TopicPartition(topic_name, 0, 3, metadata="here")], asynchronous=False)
        leaving.close()
        emptied_at = time.monotonic()

        checker = Consumer({"bootstrap.servers": bootstrap, "group.id": "leaves"})
        try:
            assert checker.committed([partition], timeout=10)[0].offset == 2
            wait_for(lambda: checker.committed([partition], timeout=10)[0].offset < 0, 15,
                     lambda: staying.poll(0.1), "the empty group's offsets to expire")
            assert time.monotonic() - emptied_at >= retention_ms / 1000 - 0.2
        finally:
            checker.close()
        listed = {g.group_id for g in admin.list_consumer_groups(request_timeout=10).result(15).valid}
        assert "leaves" not in listed and "stays" in listed
        # A group with a live member keeps its offsets however old they are.
        try:
            assert committed_with_metadata(bootstrap, "stays", topic_name, [0]) == [(3, "here\x00")]
        finally:
            staying.close()


def test_static_member_rejoins_with_its_instance_id(broker: EmbeddedBroker, topic_name: str) -> None:
    produce(broker.bootstrap_servers, topic_name, 3, 1)
    for attempt in range(2):
        consumer = group_consumer(broker.bootstrap_servers, "static", **{"group.instance.id": "instance-1"})
        consumer.subscribe([topic_name])
        records = []

        def consume(consumer: Consumer = consumer, records: list = records) -> None:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                records.append(message.offset())

        expected = 3 if attempt == 0 else 1
        wait_for(lambda records=records, expected=expected: len(records) == expected, 30, consume,
                 f"records on attempt {attempt}")
        consumer.commit(asynchronous=False)
        if attempt == 0:
            # Static members do not leave on close; the next incarnation takes over the instance id.
            consumer.close()
            produce(broker.bootstrap_servers, topic_name, 1, 1)
        else:
            assert records == [3]
            description = describe(AdminClient({"bootstrap.servers": broker.bootstrap_servers}), "static")
            assert [m.group_instance_id for m in description.members] == ["instance-1"]
            consumer.close()


# -- other clients -------------------------------------------------------------------------------


def test_kafka_python_group_consume_commit_and_resume(broker: EmbeddedBroker, topic_name: str) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka.structs import OffsetAndMetadata

    produce(broker.bootstrap_servers, topic_name, 10, 1)
    partition = KafkaTopicPartition(topic_name, 0)

    def open_consumer() -> KafkaConsumer:
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id="kafka-python",
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300)
        # kafka-python 3.0.12 loses the assignment of a rebalance its own metadata refresh started when a
        # poll() times out during the SyncGroup round trip. Knowing the topic's partitions before joining
        # means the first assignment is already complete, so no such rebalance happens.
        assert consumer.partitions_for_topic(topic_name) == {0}
        consumer.subscribe([topic_name])
        return consumer

    consumer = open_consumer()
    offsets: list[int] = []
    wait_for(lambda: len(offsets) >= 10, 30,
             lambda: offsets.extend(r.offset for rs in consumer.poll(timeout_ms=1000).values() for r in rs),
             "ten records")
    assert offsets == list(range(10))
    assert consumer.assignment() == {partition}
    consumer.commit({partition: OffsetAndMetadata(6, "kafka-python-was-here", -1)})
    consumer.close()

    reopened = open_consumer()
    try:
        assert reopened.committed(partition) == 6
        assert reopened.committed(partition, metadata=True).metadata == "kafka-python-was-here"
        resumed: list[int] = []
        wait_for(lambda: len(resumed) >= 4, 30,
                 lambda: resumed.extend(r.offset for rs in reopened.poll(timeout_ms=1000).values() for r in rs),
                 "the remaining records")
        assert resumed == [6, 7, 8, 9]
    finally:
        reopened.close()


def test_aiokafka_group_consume_commit_and_resume(broker: EmbeddedBroker, topic_name: str) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import OffsetAndMetadata
    from aiokafka.structs import TopicPartition as AioTopicPartition

    produce(broker.bootstrap_servers, topic_name, 10, 1)
    partition = AioTopicPartition(topic_name, 0)

    def make() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap_servers, group_id="aiokafka",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300)

    async def scenario() -> tuple[list[int], int | None, list[int]]:
        consumer = make()
        await consumer.start()
        try:
            first = []
            while len(first) < 10:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=200), 30)
                first.extend(r.offset for records in batch.values() for r in records)
            await consumer.commit({partition: OffsetAndMetadata(7, "aiokafka-was-here")})
        finally:
            await consumer.stop()
        reopened = make()
        await reopened.start()
        try:
            committed = await reopened.committed(partition)
            resumed = []
            while len(resumed) < 3:
                batch = await asyncio.wait_for(reopened.getmany(timeout_ms=200), 30)
                resumed.extend(r.offset for records in batch.values() for r in records)
        finally:
            await reopened.stop()
        return first, committed, resumed

    first, committed, resumed = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert first == list(range(10))
    assert committed == 7
    assert resumed == [7, 8, 9]
    # The metadata aiokafka committed is what other clients read back.
    assert committed_with_metadata(broker.bootstrap_servers, "aiokafka", topic_name, [0]) == [
        (7, "aiokafka-was-here")]


def test_admin_lists_and_describes_groups(broker: EmbeddedBroker, topic_name: str) -> None:
    produce(broker.bootstrap_servers, topic_name, 1, 1)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    active = group_consumer(broker.bootstrap_servers, "admin-active", **{"client.id": "described-client"})
    active.subscribe([topic_name])
    wait_for(lambda: bool(active.assignment()), 20, lambda: active.poll(0.1), "an assignment")
    raw = RawClient(broker.bootstrap_servers)
    try:
        # A standalone committer makes an Empty group with no protocol type.
        assert raw.commit("admin-standalone", topic_name, {0: 1}) == {0: 0}

        listed = admin.list_consumer_groups(request_timeout=10).result(15)
        assert not listed.errors
        by_id = {g.group_id: g for g in listed.valid}
        assert by_id["admin-active"].state == ConsumerGroupState.STABLE
        assert not by_id["admin-active"].is_simple_consumer_group
        assert by_id["admin-standalone"].state == ConsumerGroupState.EMPTY
        assert by_id["admin-standalone"].is_simple_consumer_group

        stable_only = admin.list_consumer_groups(request_timeout=10, states={ConsumerGroupState.STABLE}).result(15)
        assert {g.group_id for g in stable_only.valid} == {"admin-active"}

        description = describe(admin, "admin-active")
        assert description.state == ConsumerGroupState.STABLE
        assert not description.is_simple_consumer_group
        (member,) = description.members
        assert member.client_id == "described-client"
        assert member.host == "/127.0.0.1"
        assert [(tp.topic, tp.partition) for tp in member.assignment.topic_partitions] == [(topic_name, 0)]
        assert description.coordinator.id == 0

        unknown = describe(admin, "admin-nobody")
        assert unknown.state == ConsumerGroupState.DEAD and not unknown.members
    finally:
        raw.close()
        active.close()


# -- protocol details ----------------------------------------------------------------------------


def test_join_sync_heartbeat_errors_and_rebalance(broker: EmbeddedBroker, topic_name: str) -> None:
    group = "raw-group"
    leader = RawClient(broker.bootstrap_servers, "leader-client")
    follower = RawClient(broker.bootstrap_servers, "follower-client")
    try:
        assert leader.join(group, session_ms=1000).error_code == 26  # below group.min.session.timeout.ms
        assert leader.join(group, session_ms=3_600_000).error_code == 26
        assert leader.join(group, member_id="made-up").error_code == 25

        joined = leader.join_with_id(group)
        assert joined.error_code == 0 and joined.generation_id == 1 and joined.leader == joined.member_id
        assert joined.protocol_name == "range"
        assert [(m.member_id, m.metadata) for m in joined.members] == [(joined.member_id, b"range-meta")]
        leader_id = joined.member_id
        assert leader.heartbeat(group, 1, leader_id) == 0  # heartbeats are fine while CompletingRebalance
        synced = leader.sync(group, 1, leader_id, {leader_id: b"all-yours"})
        assert (synced.error_code, synced.assignment) == (0, b"all-yours")
        assert (synced.protocol_type, synced.protocol_name) == ("consumer", "range")
        assert leader.heartbeat(group, 1, leader_id) == 0
        assert leader.heartbeat(group, 0, leader_id) == 22
        assert leader.heartbeat(group, 1, "someone-else") == 25
        assert leader.sync(group, 1, leader_id, protocol_name="roundrobin").error_code == 23

        # No protocol in common with the group's members.
        assert follower.join(group, protocols=("sticky",)).error_code == 23

        with ThreadPoolExecutor(2) as pool:
            # v0 needs no member id round trip; it waits until the leader rejoins.
            follower_join = pool.submit(follower.join, group, version=0, protocols=("roundrobin", "range"))
            wait_for(lambda: leader.heartbeat(group, 1, leader_id) == 27, 10, what="REBALANCE_IN_PROGRESS")
            assert not follower_join.done()
            assert leader.sync(group, 1, leader_id).error_code == 27
            rejoined = leader.join(group, member_id=leader_id)
            following = follower_join.result(timeout=10)
            assert rejoined.generation_id == following.generation_id == 2
            assert rejoined.leader == following.leader == leader_id
            assert rejoined.protocol_name == following.protocol_name == "range"  # the only common protocol
            assert len(rejoined.members) == 2 and following.members == []
            follower_id = following.member_id

            # The follower waits for the leader's assignment.
            follower_sync = pool.submit(follower.sync, group, 2, follower_id, version=3)
            time.sleep(0.2)
            assert not follower_sync.done()
            leader_sync = leader.sync(group, 2, leader_id, {leader_id: b"L", follower_id: b"F"})
            assert (leader_sync.error_code, leader_sync.assignment) == (0, b"L")
            assert (follower_sync.result(timeout=10).error_code, follower_sync.result().assignment) == (0, b"F")

        described = leader.describe(group)
        assert described.group_state == "Stable" and described.protocol_data == "range"
        assert sorted((m.client_id, m.member_assignment) for m in described.members) == [
            ("follower-client", b"F"), ("leader-client", b"L")]

        # Member-validated commits; standalone commits are refused while the group has members.
        produce(broker.bootstrap_servers, topic_name, 1, 1)
        assert leader.commit(group, topic_name, {0: 1}, generation=2, member_id=leader_id) == {0: 0}
        assert leader.commit(group, topic_name, {0: 1}, generation=1, member_id=leader_id) == {0: 22}
        assert leader.commit(group, topic_name, {0: 1}, generation=2, member_id="stranger") == {0: 25}
        assert leader.commit(group, topic_name, {0: 1}) == {0: 25}
        assert leader.commit(group, "no-such-topic", {0: 1}, generation=2, member_id=leader_id) == {0: 3}
        assert leader.commit(group, topic_name, {7: 1}, generation=2, member_id=leader_id) == {7: 3}
        assert leader.commit(group, topic_name, {0: 1}, metadata="x" * 5000, generation=2,
                             member_id=leader_id) == {0: 12}

        # LeaveGroup v3+ takes several members at once.
        left = leader.call(LeaveGroupRequest, LeaveGroupResponse, 5, group_id=group, members=[
            LeaveGroupRequest.MemberIdentity(member_id=m) for m in (leader_id, follower_id, "ghost")])
        assert left.error_code == 0
        assert [(m.member_id, m.error_code) for m in left.members] == [(leader_id, 0), (follower_id, 0), ("ghost", 25)]
        assert leader.heartbeat(group, 2, leader_id) == 25
        empty = leader.describe(group)
        assert empty.group_state == "Empty" and not empty.members
        # With no members left, a standalone commit is allowed again.
        assert leader.commit(group, topic_name, {0: 1}) == {0: 0}
        old_leave = leader.call(LeaveGroupRequest, LeaveGroupResponse, 1, group_id=group, member_id=leader_id)
        assert old_leave.error_code == 25
    finally:
        leader.close()
        follower.close()


def test_member_that_does_not_rejoin_is_dropped_after_the_rebalance_timeout(broker: EmbeddedBroker) -> None:
    group = "slow-rejoin"
    slow = RawClient(broker.bootstrap_servers)
    newcomer = RawClient(broker.bootstrap_servers)
    try:
        joined = slow.join_with_id(group, rebalance_ms=1000, session_ms=30000)
        slow_id = joined.member_id
        assert slow.sync(group, 1, slow_id, {slow_id: b"x"}).error_code == 0
        started = time.monotonic()
        arrived = newcomer.join(group, version=1, rebalance_ms=1000, session_ms=30000)
        waited = time.monotonic() - started
        assert arrived.error_code == 0 and arrived.generation_id == 2
        assert arrived.leader == arrived.member_id and len(arrived.members) == 1
        assert 0.8 <= waited < 5
        assert slow.heartbeat(group, 1, slow_id) == 25
    finally:
        slow.close()
        newcomer.close()


def test_initial_rebalance_delay_gathers_members(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "broker", group_initial_rebalance_delay_ms=1000) as broker:
        clients = [RawClient(broker.bootstrap_servers) for _ in range(2)]
        try:
            started = time.monotonic()
            with ThreadPoolExecutor(2) as pool:
                first = pool.submit(clients[0].join, "delayed", version=0)
                time.sleep(0.3)
                second = pool.submit(clients[1].join, "delayed", version=0)
                results = [first.result(timeout=15), second.result(timeout=15)]
            assert time.monotonic() - started >= 1.0
            assert [r.generation_id for r in results] == [1, 1]
            assert sum(len(r.members) for r in results) == 2  # one leader saw both members
        finally:
            for client in clients:
                client.close()


def test_offset_fetch_versions(tmp_path: Path, topic_name: str) -> None:
    with EmbeddedBroker(tmp_path / "broker", num_partitions=2) as broker:
        produce(broker.bootstrap_servers, topic_name, 1, 2)
        check_offset_fetch_versions(RawClient(broker.bootstrap_servers), topic_name)


def check_offset_fetch_versions(raw: RawClient, topic_name: str) -> None:
    try:
        assert raw.commit("fetcher", topic_name, {0: 5, 1: 9}, metadata="m", version=2) == {0: 0, 1: 0}
        Topic = OffsetFetchRequest.OffsetFetchRequestTopic
        v1 = raw.call(OffsetFetchRequest, OffsetFetchResponse, 1, group_id="fetcher",
                      topics=[Topic(name=topic_name, partition_indexes=[0, 1, 2])])
        assert [(p.partition_index, p.committed_offset, p.metadata, p.error_code) for p in v1.topics[0].partitions] \
            == [(0, 5, "m", 0), (1, 9, "m", 0), (2, -1, "", 0)]
        everything = raw.call(OffsetFetchRequest, OffsetFetchResponse, 7, group_id="fetcher", topics=None,
                              require_stable=True)
        assert everything.error_code == 0
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
                for t in everything.topics] == [(topic_name, [(0, 5), (1, 9)])]
        Group = OffsetFetchRequest.OffsetFetchRequestGroup
        v8 = raw.call(OffsetFetchRequest, OffsetFetchResponse, 8, require_stable=False, groups=[
            Group(group_id="fetcher", topics=None),
            Group(group_id="nobody", topics=[Group.OffsetFetchRequestTopics(name=topic_name, partition_indexes=[0])]),
        ])
        assert [(g.group_id, g.error_code) for g in v8.groups] == [("fetcher", 0), ("nobody", 0)]
        assert [(p.partition_index, p.committed_offset) for p in v8.groups[0].topics[0].partitions] == [(0, 5), (1, 9)]
        assert v8.groups[1].topics[0].partitions[0].committed_offset == -1

        listed = raw.call(ListGroupsRequest, ListGroupsResponse, 4, states_filter=["Empty"])
        assert ("fetcher", "", "Empty") in [(g.group_id, g.protocol_type, g.group_state) for g in listed.groups]
        assert raw.call(ListGroupsRequest, ListGroupsResponse, 4, states_filter=["Stable"]).groups == []
    finally:
        raw.close()


def test_offsets_log_is_compacted_and_reloaded(tmp_path: Path, topic_name: str) -> None:
    data_dir = tmp_path / "broker"
    log_path = data_dir / "groups" / "offsets.log"
    with EmbeddedBroker(data_dir, num_partitions=2) as broker:
        produce(broker.bootstrap_servers, topic_name, 1, 2)
        assert broker.broker is not None
        broker.broker.groups.offsets.compact_min_bytes = 20_000  # compact once the log passes ~20 kB
        raw = RawClient(broker.bootstrap_servers)
        try:
            largest = 0
            for i in range(400):
                assert raw.commit("compacted", topic_name, {0: i, 1: 1000 + i}, metadata=f"m{i}") == {0: 0, 1: 0}
                largest = max(largest, log_path.stat().st_size)
        finally:
            raw.close()
        # 400 records of about 100 bytes each; housekeeping rewrites the log whenever it passes 20 kB.
        wait_for(lambda: log_path.stat().st_size < 20_000, 5, what="the offsets log to be compacted")
        assert largest > 15_000
    with EmbeddedBroker(data_dir) as broker:
        assert committed_with_metadata(broker.bootstrap_servers, "compacted", topic_name, [0, 1]) == [
            (399, "m399"), (1399, "m399")]


def test_delete_groups_removes_empty_groups_and_their_offsets(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic("t", 1)])["t"].result(10)
    committer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "to-delete"})
    committer.commit(offsets=[TopicPartition("t", 0, 42)], asynchronous=False)
    member = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "busy", "session.timeout.ms": 6000})
    member.subscribe(["t"])
    deadline = time.monotonic() + 20
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(0.2)
    assert member.assignment()
    results = admin.delete_consumer_groups(["to-delete", "busy", "never-existed"], request_timeout=10)
    results["to-delete"].result(10)
    for name, code in (("busy", "NON_EMPTY_GROUP"), ("never-existed", "GROUP_ID_NOT_FOUND")):
        try:
            results[name].result(10)
            raise AssertionError(f"deleting {name} should fail")
        except Exception as exc:  # noqa: BLE001 - the KafkaException carries the broker's code
            assert code in str(exc)
    assert committer.committed([TopicPartition("t", 0)], timeout=10)[0].offset < 0
    member.close()
    committer.close()
