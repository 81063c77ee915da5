"""Transactions survive `kill -9` of the broker at random moments.

Several transactional producers commit and abort at random across partitions while the broker
process is killed and restarted. An independent read_committed reader must then see exactly
the records of committed transactions, each once and in each producer's order, and nothing of
an aborted one. A transaction whose commit answer was lost in a crash may land either way, but
only whole.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

from confluent_kafka import KafkaException, Producer

from sparkeos.broker import BrokerProcess
from sparkeos.verify import read_records

log = logging.getLogger(__name__)

PRODUCERS = 3
PARTITIONS = 4
RECORDS_PER_TXN = 20


class TransactionalWriter(threading.Thread):
    def __init__(self, bootstrap: str, topic: str, name: str, seed: int, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.random = random.Random(seed)
        self.stop_event = stop
        self.outcomes: dict[int, str] = {}  # txn number -> committed | aborted | unknown
        self.failure: BaseException | None = None

    def _new_producer(self) -> Producer:
        producer = Producer({
            "bootstrap.servers": self.bootstrap,
            "transactional.id": f"crash-{self.name}",
            "transaction.timeout.ms": 60000,
            "message.timeout.ms": 60000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        })
        deadline = time.monotonic() + 60
        while True:
            try:
                producer.init_transactions(10)
                return producer
            except KafkaException as exc:
                if time.monotonic() > deadline or exc.args[0].fatal():
                    raise
                time.sleep(0.2)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def _run(self) -> None:
        producer = self._new_producer()
        txn = 0
        while not self.stop_event.is_set():
            commit = self.random.random() < 0.7
            self.outcomes[txn] = "unknown"
            try:
                producer.begin_transaction()
                for seq in range(RECORDS_PER_TXN):
                    partition = self.random.randrange(PARTITIONS)
                    producer.produce(self.topic, f"{self.name}:{txn}:{seq}".encode(), partition=partition)
                self.outcomes[txn] = self._finish(producer, commit)
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal():
                    # Fenced or otherwise dead: a new instance aborts whatever is still open.
                    producer = self._new_producer()
                elif error.txn_requires_abort():
                    if self._try(lambda p=producer: p.abort_transaction(30)):
                        self.outcomes[txn] = "aborted"
                    else:
                        producer = self._new_producer()
                else:
                    producer = self._new_producer()
            txn += 1
            time.sleep(self.random.random() * 0.05)

    def _finish(self, producer: Producer, commit: bool) -> str:
        deadline = time.monotonic() + 60
        while True:
            try:
                if commit:
                    producer.commit_transaction(30)
                    return "committed"
                producer.abort_transaction(30)
                return "aborted"
            except KafkaException as exc:
                # librdkafka lets the same commit/abort be retried after a retriable error.
                if exc.args[0].retriable() and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise

    @staticmethod
    def _try(action) -> bool:
        try:
            action()
            return True
        except KafkaException:
            return False


def test_transactions_exact_through_broker_kill_9(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    log.warning("seed %d", seed)
    rng = random.Random(seed)
    topic = f"crash-{uuid.uuid4().hex[:8]}"
    broker = BrokerProcess(tmp_path / "broker", extra_args=["--num-partitions", str(PARTITIONS)])
    broker.start()
    stop = threading.Event()
    writers: list[TransactionalWriter] = []
    try:
        setup = Producer({"bootstrap.servers": broker.bootstrap_servers})
        setup.produce(topic, b"setup", partition=0)  # auto-creates the topic with PARTITIONS partitions
        assert setup.flush(15) == 0
        writers = [
            TransactionalWriter(broker.bootstrap_servers, topic, f"p{i}", rng.randrange(2**32), stop)
            for i in range(PRODUCERS)
        ]
        for writer in writers:
            writer.start()
        for _ in range(5):
            time.sleep(rng.uniform(0.5, 2.0))
            broker.restart()  # kill -9, then start on the same data dir and port
        time.sleep(2.0)
        stop.set()
        for writer in writers:
            writer.join(120)
            assert not writer.is_alive(), f"{writer.name} hung"
        records = [(r.partition, r.value.decode()) for r in read_records(broker.bootstrap_servers, topic)]
    finally:
        stop.set()
        broker.kill()

    for writer in writers:
        assert writer.failure is None, f"{writer.name} failed: {writer.failure!r}"
    counts = Counter(value for _, value in records)
    duplicated = [value for value, n in counts.items() if n > 1]
    assert not duplicated, f"duplicates visible: {duplicated[:5]}"

    seen_by_txn: dict[tuple[str, int], set[int]] = defaultdict(set)
    order: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)  # (producer, partition) -> txn, seq
    for partition, value in records:
        if value == "setup":
            continue
        name, txn, seq = value.split(":")
        seen_by_txn[(name, int(txn))].add(int(seq))
        order[(name, partition)].append((int(txn), int(seq)))

    known = {(w.name, txn) for w in writers for txn in w.outcomes}
    assert set(seen_by_txn) <= known, f"records of transactions nobody wrote: {set(seen_by_txn) - known}"
    committed = aborted = unknown = 0
    for writer in writers:
        for txn, outcome in writer.outcomes.items():
            seen = seen_by_txn.get((writer.name, txn), set())
            if outcome == "committed":
                committed += 1
                assert seen == set(range(RECORDS_PER_TXN)), f"{writer.name} txn {txn} committed but saw {seen}"
            elif outcome == "aborted":
                aborted += 1
                assert not seen, f"{writer.name} txn {txn} aborted but {len(seen)} records are visible"
            else:
                unknown += 1
                assert seen in (set(), set(range(RECORDS_PER_TXN))), f"{writer.name} txn {txn} half visible"
    for key, sequence in order.items():
        assert sequence == sorted(sequence), f"{key} out of order"
    assert committed > 0 and aborted > 0, (committed, aborted, unknown)
    log.warning("committed %d aborted %d unknown %d", committed, aborted, unknown)
