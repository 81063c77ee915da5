"""The fault proxy of the tests (tests/support/tcp_proxy.py) does what it says, against the embedded broker
with real clients: each fault is seen from the client's side, and counted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from sparkeos.broker import EmbeddedBroker
from sparkeos.chaos.proxy import TcpProxy
from sparkeos.verify import read_records
from support.wire import ConnectionClosed, WireClient

PRODUCE = 0
API_VERSIONS = 18


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[TcpProxy, EmbeddedBroker]]:
    """A broker that tells clients to connect to the proxy in front of it."""
    with TcpProxy() as proxy, EmbeddedBroker(tmp_path / "broker", advertised_host="127.0.0.1",
                                             advertised_port=proxy.port) as broker:
        proxy.target = ("127.0.0.1", broker.config.port)
        yield proxy, broker


def _producer(proxy: TcpProxy, **config: object) -> Producer:
    return Producer({
        "bootstrap.servers": proxy.address,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 200,
        "retry.backoff.ms": 20,
        "metadata.recovery.strategy": "none",
        **config,
    })


def _deliver(producer: Producer, topic: str, value: bytes, timeout_s: float = 30.0) -> float:
    """Produce one record and wait for its delivery report; returns the seconds it took."""
    reports: list[object] = []
    started = time.monotonic()
    producer.produce(topic, value, partition=0, on_delivery=lambda err, _msg: reports.append(err))
    deadline = started + timeout_s
    while not reports and time.monotonic() < deadline:
        producer.poll(0.05)
    assert reports == [None], f"delivery failed: {reports}"
    return time.monotonic() - started


def _ready(producer: Producer, topic: str) -> None:
    """One delivered record, so the producer's connections and metadata are in place."""
    _deliver(producer, topic, b"warm-up")


def test_a_dropped_produce_answer_reaches_the_broker_and_the_client_retries(proxied, topic_name: str) -> None:
    proxy, _broker = proxied
    # Without idempotence a retried Produce is appended again: two copies prove the first one arrived.
    producer = _producer(proxy, **{"enable.idempotence": False, "acks": "all"})
    _ready(producer, topic_name)
    before = proxy.requests_seen(PRODUCE)
    proxy.drop_answers(PRODUCE)
    _deliver(producer, topic_name, b"once")
    assert proxy.answers_dropped(PRODUCE) == 1 and proxy.answers_left_to_drop(PRODUCE) == 0
    assert proxy.requests_seen(PRODUCE) - before == 2, "the client did not send the Produce again"
    values = [record.value for record in read_records(proxy.address, topic_name)]
    assert values == [b"warm-up", b"once", b"once"]


def test_a_silenced_connection_stays_open_until_the_client_times_out(proxied, topic_name: str) -> None:
    proxy, _broker = proxied
    # librdkafka times a request out after socket.timeout.ms, and then closes its connection.
    producer = _producer(proxy, **{"enable.idempotence": True, "socket.timeout.ms": 1500})
    _ready(producer, topic_name)
    accepted = proxy.counters()["accepted"]
    proxy.drop_answers(PRODUCE, then="silence")
    took = _deliver(producer, topic_name, b"late")
    counters = proxy.counters()
    assert counters["answers_dropped"] == 1 and counters["cuts"] == 0
    # The answer only comes on a new connection, once the request timed out on the silent one.
    assert took >= 1.4, f"delivered after {took:.2f} s: the connection was not kept silent"
    assert counters["accepted"] > accepted
    values = [record.value for record in read_records(proxy.address, topic_name)]
    assert values == [b"warm-up", b"late"]


def test_continue_drops_only_that_answer(proxied) -> None:
    proxy, _broker = proxied
    proxy.drop_answers(API_VERSIONS, then="continue")
    with WireClient(proxy.address) as client:
        first = client.send(ApiVersionsRequest(), 0)
        second = client.send(ApiVersionsRequest(), 0)
        # The answer to `first` never comes: the next frame on the connection answers `second`.
        assert client.receive(ApiVersionsResponse, 0, second).error_code == 0
        assert first != second
        assert client.api_versions().error_code == 0
    assert proxy.answers_dropped(API_VERSIONS) == 1


def test_silence_withholds_every_later_answer_and_keeps_the_connection(proxied) -> None:
    proxy, _broker = proxied
    proxy.drop_answers(API_VERSIONS, then="silence")
    with WireClient(proxy.address) as client:
        client.send(ApiVersionsRequest(), 0)
        client.send(ApiVersionsRequest(), 0)
        client.sock.settimeout(1.0)
        with pytest.raises(TimeoutError):  # neither an answer nor the end of the connection
            client.sock.recv(65536)
        assert proxy.open_connections() == 1
    assert proxy.answers_dropped(API_VERSIONS) == 1
    with WireClient(proxy.address) as client:  # other connections are not silenced
        assert client.api_versions().error_code == 0


def test_a_cut_after_a_dropped_answer_closes_the_connection(proxied) -> None:
    proxy, _broker = proxied
    proxy.drop_answers(API_VERSIONS)
    with WireClient(proxy.address, timeout=5) as client:
        client.send(ApiVersionsRequest(), 0)
        with pytest.raises(ConnectionClosed):
            client.read_frame()
    assert proxy.answers_dropped(API_VERSIONS) == 1


def test_refused_connections_fail_until_the_window_ends(proxied, topic_name: str) -> None:
    proxy, _broker = proxied
    producer = _producer(proxy)
    _ready(producer, topic_name)
    window_s = 2.0
    assert proxy.refuse_for(window_s) >= 1, "the producer's connection was not cut"
    ends = time.monotonic() + window_s
    with WireClient(proxy.address, timeout=5) as client:
        with pytest.raises((ConnectionClosed, OSError)):
            client.api_versions()
    assert proxy.refusing()
    took = _deliver(producer, topic_name, b"after")
    assert time.monotonic() >= ends - 0.05, f"delivered {took:.2f} s in, while connections were refused"
    assert not proxy.refusing()
    counters = proxy.counters()
    assert counters["refusals"] == 1 and counters["connections_refused"] >= 2, counters
    with WireClient(proxy.address) as client:
        assert client.api_versions().error_code == 0


def test_refused_with_a_reset(proxied) -> None:
    proxy, _broker = proxied
    proxy.refuse_for(1.0, reset=True)
    # With a timeout the socket connects in non-blocking mode, so the reset can come before connect() returns.
    with pytest.raises((ConnectionResetError, ConnectionClosed)):
        with WireClient(proxy.address, timeout=5) as client:
            client.api_versions()
    assert proxy.counters()["connections_refused"] == 1


def test_delay_holds_each_chunk_without_adding_up(proxied) -> None:
    proxy, _broker = proxied
    latency = 0.3
    proxy.delay(latency, "to_client")
    with WireClient(proxy.address) as client:
        started = time.monotonic()
        sent = [client.send(ApiVersionsRequest(), 0) for _ in range(10)]
        for correlation_id in sent:  # in order: receive() checks each answer's correlation id
            client.receive(ApiVersionsResponse, 0, correlation_id)
        took = time.monotonic() - started
    assert latency <= took < 4 * latency, f"ten pipelined answers took {took:.2f} s"
    assert proxy.counters()["chunks_delayed"] >= 1
    proxy.delay(0)
    with WireClient(proxy.address) as client:
        started = time.monotonic()
        client.api_versions()
        assert time.monotonic() - started < latency


def test_split_frames_reach_the_client_in_pieces(proxied, topic_name: str) -> None:
    proxy, _broker = proxied
    proxy.split_frames = True
    with WireClient(proxy.address) as client:
        client.send(ApiVersionsRequest(), 0)
        reads = []
        size = None
        while size is None or sum(reads) < size + 4:
            piece = client.sock.recv(65536)
            assert piece, "connection closed"
            if size is None:
                size = int.from_bytes(piece[:4], "big") if len(piece) >= 4 else None
            reads.append(len(piece))
    assert len(reads) > 2, f"the answer arrived in {reads}"
    # Real clients both ways through split frames.
    producer = _producer(proxy, **{"enable.idempotence": True})
    for n in range(20):
        producer.produce(topic_name, b"v%d" % n, partition=0)
    assert producer.flush(30) == 0
    values = [record.value for record in read_records(proxy.address, topic_name)]
    assert values == [b"v%d" % n for n in range(20)]
    counters = proxy.counters()
    assert counters["pieces_sent"] > 2 * counters["chunks_split"] > 0, counters


def test_unknown_drop_mode_is_refused(proxied) -> None:
    proxy, _broker = proxied
    with pytest.raises(ValueError):
        proxy.drop_answers(PRODUCE, then="later")
    with pytest.raises(ValueError):
        proxy.delay(1, "sideways")


def test_a_producer_keeps_working_through_all_faults_at_once(proxied, topic_name: str) -> None:
    proxy, _broker = proxied
    producer = _producer(proxy, **{"enable.idempotence": True, "message.timeout.ms": 60000})
    _ready(producer, topic_name)
    proxy.split_frames = True
    proxy.delay(0.02)
    proxy.drop_answers(PRODUCE, 2)
    for n in range(50):
        producer.produce(topic_name, b"m%d" % n, partition=0)
        producer.poll(0.01)
        if n == 25:
            proxy.refuse_for(0.5)
    assert producer.flush(60) == 0
    values = [record.value for record in read_records(proxy.address, topic_name)]
    assert values == [b"warm-up", *(b"m%d" % n for n in range(50))]
    # A cut also loses the answers to the other Produce requests in flight on that connection.
    assert proxy.answers_left_to_drop(PRODUCE) == 0 and proxy.answers_dropped(PRODUCE) >= 1
    assert proxy.counters()["connections_refused"] + proxy.counters()["cuts"] >= 1


def test_clear_faults_withdraws_what_has_not_acted(proxied) -> None:
    proxy, _broker = proxied
    proxy.drop_answers(API_VERSIONS, 3)
    proxy.cut_requests(API_VERSIONS, 2)
    proxy.delay(1.0)
    proxy.split_frames = True
    proxy.refuse_for(30)
    proxy.clear_faults()
    assert not proxy.refusing()
    with WireClient(proxy.address) as client:
        started = time.monotonic()
        for _ in range(3):
            assert client.api_versions().error_code == 0
        assert time.monotonic() - started < 1.0
    assert proxy.answers_dropped() == 0 and proxy.counters()["chunks_split"] == 0
