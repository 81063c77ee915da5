"""Request framing: however the bytes of a connection are cut into reads, every frame is taken
whole, in order, and a large Produce lands in the log byte for byte (offsets stamped, nothing else).

The server receives small frames through a fixed staging buffer and a frame bigger than it into a
buffer of its own; these tests cut streams at the boundaries that matter to that split.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceResponse

from sparkeos.broker import EmbeddedBroker
from sparkeos.broker.server import MAX_IN_FLIGHT_PER_CONNECTION, STAGING_BYTES
from support.long_poll import FETCH_VERSION, parked_fetch, wait_until, waiters_on
from support.wire import PRODUCE_VERSION, WireClient, build_batch, produce_request

API_VERSIONS_VERSION = 0


def api_versions_frame(client: WireClient) -> tuple[int, bytes]:
    correlation_id = client.next_correlation_id()
    request = ApiVersionsRequest()
    request.with_header(correlation_id=correlation_id, client_id=client.client_id)
    return correlation_id, bytes(request.encode(version=API_VERSIONS_VERSION, header=True, framed=True))


def produce_frame(client: WireClient, topic: str, batch: bytes) -> tuple[int, bytes]:
    correlation_id = client.next_correlation_id()
    request = produce_request(topic, 0, batch)
    request.with_header(correlation_id=correlation_id, client_id=client.client_id)
    return correlation_id, bytes(request.encode(version=PRODUCE_VERSION, header=True, framed=True))


def send_in_pieces(client: WireClient, data: bytes, cuts: list[int]) -> None:
    """Send `data` cut at `cuts`, pausing between pieces so the broker reads each one on its own."""
    start = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        if cut > start:
            client.send_raw(data[start:cut])
            time.sleep(0.002)
            start = cut


def read_answers(client: WireClient, expected: list[tuple[str, int]]) -> list:
    answers = []
    for kind, correlation_id in expected:
        if kind == "api":
            response = client.receive(ApiVersionsResponse, API_VERSIONS_VERSION, correlation_id)
            assert response.error_code == 0
        else:
            response = client.receive(ProduceResponse, PRODUCE_VERSION, correlation_id)
            response = response.responses[0].partition_responses[0]
            assert response.error_code == 0, response
        answers.append(response)
    return answers


def fetch_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"framing-{topic}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < count and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.5):
            assert message.error() is None, message.error()
            values.append(message.value())
    consumer.close()
    return values


@pytest.mark.parametrize("cutting", ["at the stage's edges", "at random", "one read for all"])
def test_small_and_large_frames_cut_anywhere_are_answered_in_order(broker: EmbeddedBroker, cutting: str) -> None:
    topic = f"framing-{cutting.replace(' ', '-').replace(chr(39), '')}"
    # Values bigger than the stage in total, so the Produce frame takes the large-frame path.
    values = [os.urandom(1000) + i.to_bytes(4, "big") for i in range(3 * STAGING_BYTES // 1000)]
    batch = build_batch(values)
    assert len(batch) > STAGING_BYTES
    with WireClient(broker.bootstrap_servers) as client:
        client.metadata([topic])  # auto-creates the topic
        stream, expected = b"", []
        for i in range(6):
            correlation_id, frame = api_versions_frame(client)
            stream += frame
            expected.append(("api", correlation_id))
            if i in (1, 3):
                correlation_id, frame = produce_frame(client, topic, batch)
                stream += frame
                expected.append(("produce", correlation_id))
        rng = random.Random(7)
        if cutting == "at the stage's edges":
            cuts = [1, 3, 4, 5, STAGING_BYTES - 1, STAGING_BYTES, STAGING_BYTES + 1, 2 * STAGING_BYTES + 3]
        elif cutting == "at random":
            cuts = rng.sample(range(1, len(stream)), 60)
        else:
            cuts = []
        send_in_pieces(client, stream, cuts)
        answers = read_answers(client, expected)
    produced = [a for a in answers if hasattr(a, "base_offset")]
    assert [p.base_offset for p in produced] == [0, len(values)]
    assert fetch_values(broker.bootstrap_servers, topic, 2 * len(values)) == values + values


def test_small_frames_cut_inside_their_size_header_body_and_between(broker: EmbeddedBroker) -> None:
    """Partial frames left at any place in the staging buffer are kept and completed by the next read."""
    with WireClient(broker.bootstrap_servers) as client:
        frames = [api_versions_frame(client) for _ in range(40)]
        stream = b"".join(frame for _, frame in frames)
        send_in_pieces(client, stream, random.Random(11).sample(range(1, len(stream)), 150))
        read_answers(client, [("api", correlation_id) for correlation_id, _ in frames])


def test_more_requests_than_the_in_flight_limit_in_one_write(broker: EmbeddedBroker) -> None:
    """Reading pauses at the limit and resumes as answers go out; none is lost or reordered."""
    count = 5 * MAX_IN_FLIGHT_PER_CONNECTION
    with WireClient(broker.bootstrap_servers) as client:
        frames = [api_versions_frame(client) for _ in range(count)]
        client.send_raw(b"".join(frame for _, frame in frames))
        read_answers(client, [("api", correlation_id) for correlation_id, _ in frames])
        assert client.api_versions(0).error_code == 0  # the connection still serves


def test_requests_sent_before_a_half_close_are_all_answered(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as client:
        frames = [api_versions_frame(client) for _ in range(3 * MAX_IN_FLIGHT_PER_CONNECTION)]
        client.send_raw(b"".join(frame for _, frame in frames))
        client.sock.shutdown(socket.SHUT_WR)
        read_answers(client, [("api", correlation_id) for correlation_id, _ in frames])
        assert client.is_closed_by_peer(5.0)


def test_reading_pauses_at_the_in_flight_limit_even_within_one_read(broker: EmbeddedBroker) -> None:
    """Requests that arrived together are started only as earlier ones are answered."""
    topic = "framing-in-flight"
    count = 3 * MAX_IN_FLIGHT_PER_CONNECTION
    with WireClient(broker.bootstrap_servers) as client, WireClient(broker.bootstrap_servers) as producer:
        producer.metadata([topic])
        sent = client.send_raw
        frames: list[bytes] = []
        client.send_raw = frames.append  # collect the frames, then send them as one write
        correlation_ids = [parked_fetch(client, topic) for _ in range(count)]
        client.send_raw = sent
        client.send_raw(b"".join(frames))
        # The limit counts the requests queued for an answer, plus the one being answered.
        wait_until(lambda: len(waiters_on(broker, topic)) >= MAX_IN_FLIGHT_PER_CONNECTION)
        time.sleep(0.3)  # more would show up by now if the limit leaked
        assert len(waiters_on(broker, topic)) <= MAX_IN_FLIGHT_PER_CONNECTION + 1
        assert producer.produce(topic, 0, build_batch([b"wake"])).error_code == 0
        for correlation_id in correlation_ids:
            assert client.receive(FetchResponse, FETCH_VERSION, correlation_id).error_code == 0


def test_shutdown_ends_the_requests_of_a_connection_the_client_reset(tmp_path) -> None:
    topic = "framing-reset"
    broker = EmbeddedBroker(tmp_path).start()
    try:
        client = WireClient(broker.bootstrap_servers)
        client.metadata([topic])
        parked_fetch(client, topic)
        wait_until(lambda: len(waiters_on(broker, topic)) == 1)
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # RST: the broker sees the connection lost while the fetch is parked
        time.sleep(0.2)
    finally:
        started = time.monotonic()
        broker.stop()
    assert time.monotonic() - started < 5, "shutdown waited for the parked fetch"
    assert waiters_on(broker, topic) == set(), "the parked fetch outlived the broker's shutdown"


def test_shutdown_ends_connections_accepted_while_it_runs(tmp_path, caplog) -> None:
    """Connections the listener accepts as shutdown begins are ended too, not left with a task that the closed
    event loop destroys (clients reconnecting to a stopping broker left 121 such tasks in 20 stops)."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    broker = EmbeddedBroker(tmp_path).start()
    # While the broker's loop is busy, the kernel completes the clients' connections into the listen backlog;
    # the loop accepts them in the same turn as it takes the request to stop.
    broker._loop.call_soon_threadsafe(time.sleep, 0.5)
    time.sleep(0.1)
    waiting = [socket.create_connection(("127.0.0.1", broker.config.port), timeout=5) for _ in range(8)]
    broker.stop()
    for sock in waiting:
        sock.close()
    del broker  # a task left pending is reported once nothing holds it
    gc.collect()
    left = [r.getMessage() for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
    assert left == [], f"{len(left)} connection tasks outlived the broker's event loop: {left[0]}"


def test_stored_batch_is_the_sent_batch_with_only_the_base_offset_and_epoch_rewritten(
    broker: EmbeddedBroker,
) -> None:
    """The large-frame path stamps offsets in the received buffer; every other byte is as sent."""
    topic = "framing-stamping"
    batch = build_batch([os.urandom(2000) for _ in range(100)])
    with WireClient(broker.bootstrap_servers) as client:
        client.metadata([topic])
        assert client.produce(topic, 0, build_batch([b"first"])).base_offset == 0
        assert client.produce(topic, 0, batch).base_offset == 1
    stored = stored_batches(broker, topic)
    assert len(stored) == 2
    second = stored[1]
    assert len(second) == len(batch)
    assert struct.unpack_from(">q", second, 0)[0] == 1  # base offset
    assert second[8:12] == batch[8:12]  # batch length
    assert second[16:] == batch[16:]  # magic, CRC, attributes, producer fields, records: untouched


def stored_batches(broker: EmbeddedBroker, topic: str) -> list[bytes]:
    assert broker.broker is not None
    partition_log = broker.broker.partition(topic, 0)
    assert partition_log is not None
    data = bytes(partition_log.read(0, 10 << 20))
    batches, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos + 8)
        batches.append(data[pos : pos + 12 + length])
        pos += 12 + length
    return batches
