"""Idempotent producers: no duplicates and no gaps when connections die, and Kafka's exact
answers to duplicate, out-of-order and fenced batches, before and after a crash."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sparkeos.broker import BrokerProcess, EmbeddedBroker
from sparkeos.chaos.proxy import TcpProxy
from sparkeos.verify import read_records
from support.wire import WireClient, build_batch

log = logging.getLogger(__name__)

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47


# -- through a proxy that drops connections ---------------------------------------------------------


def test_idempotent_producer_survives_dropped_connections(tmp_path: Path, topic_name: str) -> None:
    seed = int(os.environ.get("SPARKEOS_TEST_SEED", random.randrange(2**32)))
    log.warning("connection-drop seed %d", seed)
    rng = random.Random(seed)
    partitions = 2
    total = 10000
    with TcpProxy(seed=seed, cut_after_request_probability=0.05) as proxy:
        with EmbeddedBroker(tmp_path / "broker", advertised_host="127.0.0.1", advertised_port=proxy.port,
                            num_partitions=partitions) as broker:
            proxy.target = ("127.0.0.1", broker.config.port)
            producer = Producer({
                "bootstrap.servers": proxy.address,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "batch.num.messages": 40,
                "message.timeout.ms": 90000,
                "reconnect.backoff.ms": 10,
                "reconnect.backoff.max.ms": 200,
                "retry.backoff.ms": 10,
                "retry.backoff.max.ms": 200,
                # With a single broker every cut looks like "all brokers down"; re-bootstrapping
                # then forgets the broker and spends most of the test rediscovering it.
                "metadata.recovery.strategy": "none",
            })
            delivered: dict[int, tuple[int, int]] = {}
            failures: list[str] = []

            def on_delivery(err, message) -> None:
                number = int(message.value())
                if err is not None:
                    failures.append(f"{number}: {err}")
                else:
                    delivered[number] = (message.partition(), message.offset())

            stop_chaos = threading.Event()

            def chaos() -> None:
                while not stop_chaos.wait(rng.uniform(0.05, 0.4)):
                    proxy.cut_all()

            chaos_thread = threading.Thread(target=chaos, daemon=True)
            chaos_thread.start()
            try:
                for number in range(total):
                    if number and number % (total // 4) == 0:
                        # The producer can send everything between two cuts on an idle machine: each quarter of
                        # the records waits for a cut after the last quarter was queued.
                        cuts = proxy.cuts
                        deadline = time.monotonic() + 10
                        while proxy.cuts == cuts and time.monotonic() < deadline:
                            producer.poll(0.01)
                    producer.produce(topic_name, value=str(number).encode(), partition=number % partitions,
                                     on_delivery=on_delivery)
                    if number % 50 == 0:
                        producer.poll(0.005)
                deadline = time.monotonic() + 60
                while len(delivered) + len(failures) < total and time.monotonic() < deadline:
                    producer.poll(0.1)
            finally:
                stop_chaos.set()
                chaos_thread.join()
            assert producer.flush(30) == 0
            # The log is checked by a reader on a quiet network: what is under test is the producer.
            proxy.cut_after_request_probability = 0.0
            log.warning("proxy cut %d connections (%d right after a request)", proxy.cuts, proxy.cuts_after_request)
            assert proxy.cuts_after_request >= 3 and proxy.cuts >= 2, "the proxy never disturbed the producer"
            assert not failures, f"{len(failures)} deliveries failed, e.g. {failures[:5]}"
            assert len(delivered) == total

            written = read_records(proxy.address, topic_name)
            for partition in range(partitions):
                expected = [n for n in range(total) if n % partitions == partition]
                with WireClient(f"127.0.0.1:{broker.config.port}") as client:
                    end = client.log_end_offset(topic_name, partition)
                assert end == len(expected), f"partition {partition} holds {end} records, expected {len(expected)}"
                records = [record for record in written if record.partition == partition]
                values = [int(record.value) for record in records]
                assert values == expected, "duplicates, gaps or reordering in the log"
                for record in records:
                    assert delivered[int(record.value)] == (partition, record.offset)


# -- exact answers to crafted Produce requests --------------------------------------------------


def _values(first: int, count: int) -> list[bytes]:
    return [f"v{n}".encode() for n in range(first, first + count)]


def test_duplicates_in_window_get_original_offset(broker: EmbeddedBroker, topic_name: str) -> None:
    with WireClient(broker.bootstrap_servers) as client:
        client.metadata([topic_name])
        pid, epoch = client.init_producer_id()
        offsets = []
        for i in range(8):
            answer = client.produce(topic_name, 0, build_batch(_values(3 * i, 3), pid, epoch, 3 * i))
            assert answer.error_code == 0
            offsets.append(answer.base_offset)
        assert offsets == [3 * i for i in range(8)]
        end = client.log_end_offset(topic_name, 0)
        assert end == 24

        # The last five batches are remembered: a retry is answered like the original.
        for i in range(3, 8):
            answer = client.produce(topic_name, 0, build_batch(_values(3 * i, 3), pid, epoch, 3 * i))
            assert (answer.error_code, answer.base_offset) == (0, offsets[i])
        assert client.log_end_offset(topic_name, 0) == end

        # Older batches fell out of the window: Kafka cannot tell them from a bad sequence.
        for i in (0, 2):
            answer = client.produce(topic_name, 0, build_batch(_values(3 * i, 3), pid, epoch, 3 * i))
            assert answer.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
            assert answer.base_offset == -1

        # Same first sequence but a different length is not a duplicate.
        answer = client.produce(topic_name, 0, build_batch(_values(21, 2), pid, epoch, 21))
        assert answer.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER

        # A gap after the last sequence (23) is refused, and so is a sequence inside the window.
        for base in (25, 100, 22):
            answer = client.produce(topic_name, 0, build_batch(_values(base, 1), pid, epoch, base))
            assert answer.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert client.log_end_offset(topic_name, 0) == end

        # The next sequence still goes through after all those refusals.
        answer = client.produce(topic_name, 0, build_batch(_values(24, 2), pid, epoch, 24))
        assert (answer.error_code, answer.base_offset) == (0, 24)
        assert client.log_end_offset(topic_name, 0) == 26


def test_epochs_fence_and_restart_sequences(broker: EmbeddedBroker, topic_name: str) -> None:
    with WireClient(broker.bootstrap_servers) as client:
        client.metadata([topic_name])
        pid, epoch = client.init_producer_id()
        assert client.produce(topic_name, 0, build_batch(_values(0, 2), pid, epoch, 0)).error_code == 0
        assert client.produce(topic_name, 0, build_batch(_values(2, 2), pid, epoch, 2)).error_code == 0

        # A newer epoch must start over at sequence 0.
        answer = client.produce(topic_name, 0, build_batch(_values(4, 1), pid, epoch + 1, 4))
        assert answer.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        answer = client.produce(topic_name, 0, build_batch(_values(4, 1), pid, epoch + 1, 0))
        assert (answer.error_code, answer.base_offset) == (0, 4)

        # The old epoch is fenced, for new batches and for retries of its cached ones alike.
        for base in (4, 2, 0):
            answer = client.produce(topic_name, 0, build_batch(_values(base, 2), pid, epoch, base))
            assert answer.error_code == INVALID_PRODUCER_EPOCH
        assert client.log_end_offset(topic_name, 0) == 5

        # A retry under the new epoch is still recognised.
        answer = client.produce(topic_name, 0, build_batch(_values(4, 1), pid, epoch + 1, 0))
        assert (answer.error_code, answer.base_offset) == (0, 4)
        assert client.log_end_offset(topic_name, 0) == 5


def test_unknown_producer_accepts_any_first_sequence(broker: EmbeddedBroker, topic_name: str) -> None:
    """With no state for the producer (e.g. its records were deleted) Kafka accepts any sequence."""
    with WireClient(broker.bootstrap_servers) as client:
        client.metadata([topic_name])
        pid, epoch = client.init_producer_id()
        answer = client.produce(topic_name, 0, build_batch(_values(0, 3), pid, epoch, 17))
        assert (answer.error_code, answer.base_offset) == (0, 0)
        answer = client.produce(topic_name, 0, build_batch(_values(3, 1), pid, epoch, 20))
        assert (answer.error_code, answer.base_offset) == (0, 3)
        answer = client.produce(topic_name, 0, build_batch(_values(0, 3), pid, epoch, 17))
        assert (answer.error_code, answer.base_offset) == (0, 0)


@pytest.mark.parametrize("shutdown", ["kill", "sigterm"])
def test_producer_state_survives_restart(tmp_path: Path, topic_name: str, shutdown: str) -> None:
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        with WireClient(broker.bootstrap_servers) as client:
            client.metadata([topic_name])
            pid, epoch = client.init_producer_id()
            for i in range(7):
                answer = client.produce(topic_name, 0, build_batch(_values(2 * i, 2), pid, epoch, 2 * i))
                assert (answer.error_code, answer.base_offset) == (0, 2 * i)
        if shutdown == "kill":
            broker.kill()
        else:
            assert broker.stop() == 0
        broker.start()
        with WireClient(broker.bootstrap_servers) as client:
            assert client.log_end_offset(topic_name, 0) == 14
            # A retry of a batch from before the restart gets its original offset again.
            for i in (2, 6):
                answer = client.produce(topic_name, 0, build_batch(_values(2 * i, 2), pid, epoch, 2 * i))
                assert (answer.error_code, answer.base_offset) == (0, 2 * i)
            assert client.log_end_offset(topic_name, 0) == 14
            answer = client.produce(topic_name, 0, build_batch(_values(0, 2), pid, epoch, 0))
            assert answer.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
            answer = client.produce(topic_name, 0, build_batch(_values(20, 1), pid, epoch, 20))
            assert answer.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
            answer = client.produce(topic_name, 0, build_batch(_values(14, 1), pid, epoch, 14))
            assert (answer.error_code, answer.base_offset) == (0, 14)
            # A second producer id from the restarted broker never reuses the first one.
            other_pid, _ = client.init_producer_id()
            assert other_pid != pid
        # And once more: the state written after the restart survives a second crash.
        broker.kill()
        broker.start()
        with WireClient(broker.bootstrap_servers) as client:
            answer = client.produce(topic_name, 0, build_batch(_values(14, 1), pid, epoch, 14))
            assert (answer.error_code, answer.base_offset) == (0, 14)
            assert client.log_end_offset(topic_name, 0) == 15
    finally:
        broker.kill()
