"""Crash safety: acknowledged records survive kill -9 at random moments, exactly once, in order,
at the offsets the producer was told; clean shutdowns keep everything too."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from sparkeos.broker import BrokerProcess
from sparkeos.verify import read_records
from support.wire import WireClient

log = logging.getLogger(__name__)

PARTITIONS = 3


def producer_config(bootstrap: str) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 100,
        # Long enough that no message times out while the broker is down: a timeout would make
        # librdkafka bump the epoch and give up on the messages' fate.
        "message.timeout.ms": 120000,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 250,
        "retry.backoff.ms": 20,
        "retry.backoff.max.ms": 250,
        # A single broker that restarts would otherwise be forgotten and rediscovered slowly.
        "metadata.recovery.strategy": "none",
    }


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    with WireClient(bootstrap) as client:
        return [client.log_end_offset(topic, p) for p in range(partitions)]


def read_all(bootstrap: str, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, value) of every record of every partition, read back to its end by an independent consumer."""
    found: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for record in read_records(bootstrap, topic, config={"fetch.max.bytes": 1 << 20}):
        found[record.partition].append((record.offset, record.value))
    return found


class NumberedProducer:
    """Writes 0, 1, 2, ... round-robin over the partitions from a thread, recording every ack."""

    def __init__(self, bootstrap: str, topic: str, rate_per_s: float = 4000.0) -> None:
        self.topic = topic
        self.producer = Producer(producer_config(bootstrap))
        self.acked: dict[int, tuple[int, int]] = {}
        self.failed: dict[int, str] = {}
        self.sent = 0
        self.rate_per_s = rate_per_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err, message) -> None:
        number = int(message.value())
        if err is not None:
            self.failed[number] = str(err)
        else:
            self.acked[number] = (message.partition(), message.offset())

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            # Pace the writes so the load is spread over the whole test, crashes included.
            due = int((time.monotonic() - started) * self.rate_per_s)
            while self.sent < due:
                try:
                    self.producer.produce(self.topic, value=str(self.sent).encode(),
                                          partition=self.sent % PARTITIONS, on_delivery=self._on_delivery)
                except BufferError:
                    break
                self.sent += 1
            self.producer.poll(0.01)

    def start(self) -> NumberedProducer:
        self._thread.start()
        return self

    def finish(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + timeout
        while len(self.acked) + len(self.failed) < self.sent and time.monotonic() < deadline:
            self.producer.poll(0.1)
        self.producer.flush(1)


def check_log(found: dict[int, list[tuple[int, bytes]]], acked: dict[int, tuple[int, int]],
              ends: list[int]) -> None:
    """Offsets dense from 0, every ack present once at its reported offset, numbers in order."""
    for partition, records in found.items():
        offsets = [offset for offset, _ in records]
        assert offsets == list(range(ends[partition])), f"partition {partition}: offsets not dense from 0"
        numbers = [int(value) for _, value in records]
        assert len(set(numbers)) == len(numbers), f"partition {partition}: duplicated records"
        assert numbers == sorted(numbers), f"partition {partition}: records out of order"
        assert all(n % PARTITIONS == partition for n in numbers), f"partition {partition}: foreign records"
    at = {(p, offset): int(value) for p, records in found.items() for offset, value in records}
    for number, place in acked.items():
        assert at.get(place) == number, f"acknowledged record {number} is not at {place} (found {at.get(place)})"


def test_acknowledged_records_survive_repeated_kill_9(tmp_path: Path, topic_name: str) -> None:
    seed = int(os.environ.get("SPARKEOS_TEST_SEED", random.randrange(2**32)))
    log.warning("kill -9 schedule seed %d", seed)
    rng = random.Random(seed)
    broker = BrokerProcess(tmp_path / "broker", extra_args=["--num-partitions", str(PARTITIONS)]).start()
    try:
        writer = NumberedProducer(broker.bootstrap_servers, topic_name).start()
        cycles = 5
        for _ in range(cycles):
            time.sleep(rng.uniform(0.3, 1.5))
            broker.kill()
            time.sleep(rng.uniform(0.0, 0.3))
            broker.start()
        time.sleep(rng.uniform(0.3, 1.0))
        writer.finish()
        log.warning("sent %d, acknowledged %d, failed %d", writer.sent, len(writer.acked), len(writer.failed))

        assert writer.sent > 1000
        assert not writer.failed, f"deliveries failed: {list(writer.failed.items())[:5]}"
        assert len(writer.acked) == writer.sent

        ends = end_offsets(broker.bootstrap_servers, topic_name, PARTITIONS)
        found = read_all(broker.bootstrap_servers, topic_name)
        check_log(found, writer.acked, ends)
        # With every send acknowledged, the log holds exactly the numbers sent, once each.
        assert sum(ends) == writer.sent
    finally:
        broker.kill()


def test_kill_9_under_load_with_interval_fsync(tmp_path: Path, topic_name: str) -> None:
    """fsync every interval: a process crash (not a power cut) still loses nothing written."""
    seed = int(os.environ.get("SPARKEOS_TEST_SEED", random.randrange(2**32)))
    log.warning("interval-fsync crash seed %d", seed)
    rng = random.Random(seed)
    broker = BrokerProcess(tmp_path / "broker", extra_args=[
        "--num-partitions", str(PARTITIONS), "--fsync", "interval"]).start()
    try:
        writer = NumberedProducer(broker.bootstrap_servers, topic_name, rate_per_s=6000).start()
        seen: dict[tuple[int, int], bytes] = {}
        stop_reading = threading.Event()

        def tail() -> None:
            consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"tail-{topic_name}",
                                 "enable.auto.commit": False, "metadata.recovery.strategy": "none",
                                 "reconnect.backoff.max.ms": 250})
            consumer.assign([TopicPartition(topic_name, p, 0) for p in range(PARTITIONS)])
            try:
                while not stop_reading.is_set():
                    for message in consumer.consume(500, 0.2):
                        if message.error() is None:
                            seen[(message.partition(), message.offset())] = message.value()
            finally:
                consumer.close()

        reader = threading.Thread(target=tail, daemon=True)
        time.sleep(0.5)  # the topic exists once the producer has written
        reader.start()
        for _ in range(2):
            time.sleep(rng.uniform(0.5, 1.5))
            broker.kill()
            broker.start()
        time.sleep(rng.uniform(0.3, 0.8))
        writer.finish()
        time.sleep(1.0)
        stop_reading.set()
        reader.join(timeout=30)
        assert not writer.failed, f"deliveries failed: {list(writer.failed.items())[:5]}"

        ends = end_offsets(broker.bootstrap_servers, topic_name, PARTITIONS)
        found = read_all(broker.bootstrap_servers, topic_name)
        check_log(found, writer.acked, ends)
        # Whatever a consumer saw before a crash is still there, at the same offset.
        assert len(seen) > 100
        for (partition, offset), value in seen.items():
            assert offset < ends[partition] and found[partition][offset][1] == value
    finally:
        broker.kill()


def test_clean_shutdown_keeps_everything(tmp_path: Path, topic_name: str) -> None:
    broker = BrokerProcess(tmp_path / "broker", extra_args=["--num-partitions", str(PARTITIONS)]).start()
    try:
        producer = Producer(producer_config(broker.bootstrap_servers))
        acked: dict[int, tuple[int, int]] = {}

        def on_delivery(err, message) -> None:
            assert err is None, err
            acked[int(message.value())] = (message.partition(), message.offset())

        for number in range(3000):
            producer.produce(topic_name, value=str(number).encode(), partition=number % PARTITIONS,
                             on_delivery=on_delivery)
            if number % 100 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0
        assert len(acked) == 3000
        ends_before = end_offsets(broker.bootstrap_servers, topic_name, PARTITIONS)
        assert broker.stop() == 0, "SIGTERM should end the broker cleanly"
        assert list((tmp_path / "broker").rglob(".clean-shutdown")), "clean shutdown left no marker"

        broker.start()
        ends = end_offsets(broker.bootstrap_servers, topic_name, PARTITIONS)
        assert ends == ends_before == [1000, 1000, 1000]
        check_log(read_all(broker.bootstrap_servers, topic_name), acked, ends)

        # The same producer keeps going after the restart; offsets continue where they were.
        for number in range(3000, 3300):
            producer.produce(topic_name, value=str(number).encode(), partition=number % PARTITIONS,
                             on_delivery=on_delivery)
        assert producer.flush(30) == 0
        ends = end_offsets(broker.bootstrap_servers, topic_name, PARTITIONS)
        assert ends == [1100, 1100, 1100]
        check_log(read_all(broker.bootstrap_servers, topic_name), acked, ends)
    finally:
        broker.kill()
