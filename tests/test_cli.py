"""`sparkeos broker` as a user runs it: one ready line, a real port, clean shutdown on signals."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sparkeos.broker.embedded import READY_PREFIX


def _start(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "sparkeos", "broker", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith(READY_PREFIX), line
    return process, line[len(READY_PREFIX) :].strip()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_ready_line_real_port_and_clean_shutdown(tmp_path: Path, signum: int) -> None:
    process, bootstrap = _start(tmp_path / "data")
    try:
        host, port = bootstrap.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce("cli-topic", b"hello")
        assert producer.flush(15) == 0
    finally:
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert stdout == "", "the ready line must be the only line on stdout"
    # A clean shutdown leaves every partition marked clean for a fast restart.
    assert list((tmp_path / "data" / "topics").glob("cli-topic-0/.clean-shutdown"))


def test_restart_serves_the_same_data(tmp_path: Path) -> None:
    process, bootstrap = _start(tmp_path / "data")
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(10):
            producer.produce("kept", str(i).encode())
        assert producer.flush(15) == 0
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    process, bootstrap = _start(tmp_path / "data")
    try:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cli", "enable.auto.commit": False})
        consumer.assign([TopicPartition("kept", 0, 0)])
        values = []
        for _ in range(50):
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                values.append(message.value())
            if len(values) == 10:
                break
        consumer.close()
        assert values == [str(i).encode() for i in range(10)]
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)


def test_advertised_listener_and_bad_arguments(tmp_path: Path) -> None:
    process, bootstrap = _start(tmp_path / "data", "--advertised-listener", "localhost:19092")
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)
    assert bootstrap == "localhost:19092"
    bad = subprocess.run(
        [sys.executable, "-m", "sparkeos", "broker", "--data-dir", str(tmp_path), "--listen", "nohost"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2
    assert "--listen" in bad.stderr and "HOST:PORT" in bad.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "sparkeos", "broker", "--data-dir", str(tmp_path), "--num-partitions", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--num-partitions" in bad.stderr


def test_a_port_that_is_taken_is_named_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "sparkeos", "broker", "--data-dir", str(tmp_path), "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"sparkeos broker: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_transaction_max_timeout_option_reaches_clients(tmp_path: Path) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

    process, bootstrap = _start(tmp_path / "data", "--transaction-max-timeout-ms", "3600000")
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        resource = ConfigResource(ConfigResource.Type.BROKER, "0")
        configs = admin.describe_configs([resource])[resource].result(15)
        assert configs["transaction.max.timeout.ms"].value == "3600000"
        # Flink's default transaction timeout (1 h) fits; anything above it is refused.
        too_long = Producer({"bootstrap.servers": bootstrap, "transactional.id": "cli-txn",
                             "transaction.timeout.ms": 3600001})
        with pytest.raises(KafkaException) as failure:
            too_long.init_transactions(15)
        assert failure.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT
        fits = Producer({"bootstrap.servers": bootstrap, "transactional.id": "cli-txn",
                         "transaction.timeout.ms": 3600000})
        fits.init_transactions(15)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
