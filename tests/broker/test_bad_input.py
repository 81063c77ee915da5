"""Bad input: garbage, truncated and oversized frames, unknown APIs and versions, corrupt record
batches and invalid names get Kafka's answers (or a closed connection), and a fuzzing storm
never crashes the broker nor disturbs a well-behaved client."""

from __future__ import annotations

import logging
import os
import random
import socket
import struct
import threading
import time
from pathlib import Path

import crc32c
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.metadata import ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest

from sparkeos.broker import EmbeddedBroker
from sparkeos.broker.dispatch import APIS
from support.wire import (
    ConnectionClosed,
    WireClient,
    build_batch,
    produce_request,
    request_frame,
    split_address,
    start_logged_broker,
    stop_logged_broker,
)

log = logging.getLogger(__name__)

CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
UNSUPPORTED_VERSION = 35
INVALID_RECORD = 87
PRODUCE, METADATA, API_VERSIONS, LIST_OFFSETS = 0, 3, 18, 2


def assert_serving(bootstrap: str) -> None:
    """A fresh connection still gets answers."""
    with WireClient(bootstrap) as client:
        assert client.api_versions(0).error_code == 0
        assert client.metadata(None).brokers[0].node_id == 0


def assert_closed_by_broker(bootstrap: str, data: bytes) -> None:
    with WireClient(bootstrap) as client:
        client.send_raw(data)
        assert client.is_closed_by_peer(5.0), "the broker kept a connection that sent a bad frame"
    assert_serving(bootstrap)


# -- frames the broker must refuse by closing the connection -------------------------------------


def _garbage_frames() -> dict[str, bytes]:
    rng = random.Random(1234)
    frames = {
        "random bytes": rng.randbytes(300),
        "negative size": struct.pack(">i", -5) + rng.randbytes(20),
        "size -1": b"\xff\xff\xff\xff",
        "zero size": struct.pack(">i", 0),
        "shorter than a header": struct.pack(">i", 5) + b"\x00\x12\x00\x00\x00",
        "client id past the frame": struct.pack(">ihhih", 12, API_VERSIONS, 0, 1, 50) + b"ab",
        "client id length -2": struct.pack(">ihhih", 10, API_VERSIONS, 0, 1, -2),
        "unknown api key": request_frame(9999, 0, 1, b""),
        "negative api key": request_frame(-3, 0, 1, b""),
        "unsupported produce version": request_frame(PRODUCE, 99, 1, b"\x00" * 20),
        "unsupported metadata version": request_frame(METADATA, 60, 1, b"\x00" * 8),
        "negative version": request_frame(METADATA, -1, 1, b"\x00" * 8),
        "metadata with garbage body": request_frame(METADATA, 4, 1, b"\x00\x00\x00\x03\x00"),
        "produce with garbage body": request_frame(PRODUCE, 8, 1, b"\x00\x05ab"),
        "api versions v3 with bad tagged fields": request_frame(API_VERSIONS, 3, 1, b"\x05\x01", flexible_header=True),
        # A non-nullable array sent as null (-1): Kafka refuses to parse such a request.
        "null topics in produce": request_frame(PRODUCE, 8, 1, struct.pack(">hhii", -1, -1, 1000, -1)),
        "null topics in list offsets": request_frame(LIST_OFFSETS, 1, 1, struct.pack(">ii", -1, -1)),
        "null topic name in produce": request_frame(
            PRODUCE, 8, 1, struct.pack(">hhiih", -1, -1, 1000, 1, -1) + struct.pack(">i", 0)),
    }
    return frames


GARBAGE = _garbage_frames()


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_bad_frame_closes_only_its_connection(broker: EmbeddedBroker, name: str) -> None:
    with WireClient(broker.bootstrap_servers) as bystander:
        assert_closed_by_broker(broker.bootstrap_servers, GARBAGE[name])
        # Another connection that was open all along is unaffected.
        assert bystander.api_versions(0).error_code == 0


def test_truncated_frames(broker: EmbeddedBroker) -> None:
    frame = request_frame(API_VERSIONS, 0, 7, b"")
    # Half a frame: the broker waits for the rest without answering or closing.
    with WireClient(broker.bootstrap_servers) as client:
        client.send_raw(frame[:6])
        assert not client.is_closed_by_peer(0.5)
        # The rest arrives late, byte by byte: it is still one request, answered once.
        for byte in frame[6:]:
            client.send_raw(bytes([byte]))
            time.sleep(0.01)
        answer = client.read_frame()
        assert struct.unpack_from(">i", answer)[0] == 7
        response = ApiVersionsResponse.decode(answer[4:], version=0)
        assert response.error_code == 0
    # Peers that vanish mid-frame, mid-size-prefix or mid-body leave no trace.
    for cut in (2, 4, 9, len(frame) - 1):
        with WireClient(broker.bootstrap_servers) as client:
            client.send_raw(frame[:cut])
    big = produce_request("t-truncated", 0, build_batch([b"x" * 1000] * 10))
    big.with_header(correlation_id=1, client_id="t")
    data = bytes(big.encode(version=8, header=True, framed=True))
    with WireClient(broker.bootstrap_servers) as client:
        client.send_raw(data[: len(data) // 2])
    assert_serving(broker.bootstrap_servers)


def test_request_size_limit(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "broker", max_request_bytes=4096) as small:
        # Refused from the size prefix alone: the broker does not wait for the body.
        assert_closed_by_broker(small.bootstrap_servers, struct.pack(">i", 4097))
        assert_closed_by_broker(small.bootstrap_servers, struct.pack(">i", 2**31 - 1))
        with WireClient(small.bootstrap_servers) as client:
            client.metadata(["t-limit"])
            fits = client.produce("t-limit", 0, build_batch([b"y" * 1000] * 3))
            assert fits.error_code == 0
            too_big = produce_request("t-limit", 0, build_batch([b"z" * 1000] * 5))
            too_big.with_header(correlation_id=99, client_id="t")
            data = bytes(too_big.encode(version=8, header=True, framed=True))
            assert len(data) - 4 > 4096
            client.send_raw(data)
            assert client.is_closed_by_peer(5.0)
        with WireClient(small.bootstrap_servers) as client:
            assert client.log_end_offset("t-limit", 0) == 3


def test_default_broker_refuses_huge_size_prefix(broker: EmbeddedBroker) -> None:
    # Default socket.request.max.bytes is 100 MiB.
    assert_closed_by_broker(broker.bootstrap_servers, struct.pack(">i", 100 * 1024 * 1024 + 1))
    assert_closed_by_broker(broker.bootstrap_servers, struct.pack(">i", 2**31 - 1))


# -- ApiVersions negotiation --------------------------------------------------------------------


@pytest.mark.parametrize("version,flexible", [(4, True), (5, True), (127, True), (32767, False)])
def test_api_versions_unsupported_version(broker: EmbeddedBroker, version: int, flexible: bool) -> None:
    body = b"\x05hello\x021\x00" if flexible else b""
    with WireClient(broker.bootstrap_servers) as client:
        client.send_raw(request_frame(API_VERSIONS, version, 42, body, flexible_header=flexible))
        answer = client.read_frame()
        # Header v0 (no tagged fields), then a v0 body.
        assert struct.unpack_from(">i", answer)[0] == 42
        response = ApiVersionsResponse.decode(answer[4:], version=0)
        assert response.error_code == UNSUPPORTED_VERSION
        ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert ranges == {a.key: (a.min_version, a.max_version) for a in APIS.values()}
        assert ranges[API_VERSIONS][1] >= 3
        # The v0 body is exactly error code + the array: nothing may follow it.
        assert len(answer) - 4 == 2 + 4 + 6 * len(ranges)
        # The client retries with a version we speak, on the same connection.
        retry = client.api_versions(ranges[API_VERSIONS][1])
        assert retry.error_code == 0


def test_every_advertised_version_answers_a_default_request(broker: EmbeddedBroker) -> None:
    """Each API at each advertised version, with every field at its schema default (empty
    strings and arrays): an answer, never a closed connection."""
    with WireClient(broker.bootstrap_servers) as client:
        for api in sorted(APIS.values(), key=lambda a: a.key):
            for version in range(api.min_version, api.max_version + 1):
                request = api.request()
                if api.key == PRODUCE:
                    request = ProduceRequest(acks=-1, timeout_ms=1000, topic_data=[])
                try:
                    response = client.request(request, api.response, version)
                except ConnectionClosed:
                    pytest.fail(f"{api.request.__name__} v{version} with default fields closed the connection")
                assert response is not None


# -- record batches Kafka refuses -----------------------------------------------------------------


def _with_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def _bad_batches() -> dict[str, tuple[bytes, int]]:
    good = build_batch([b"a", b"b", b"c"])
    corrupt_crc = bytearray(good)
    corrupt_crc[-1] ^= 0xFF
    wrong_delta = bytearray(good)
    struct.pack_into(">i", wrong_delta, 23, 5)
    zero_count = bytearray(good)
    struct.pack_into(">i", zero_count, 57, 0)
    magic_1 = bytearray(good)
    magic_1[16] = 1
    magic_3 = bytearray(good)
    magic_3[16] = 3
    magic_neg = bytearray(good)
    magic_neg[16] = 0xFF
    short_length = bytearray(good)
    struct.pack_into(">i", short_length, 8, 10)
    long_length = bytearray(good)
    struct.pack_into(">i", long_length, 8, len(good) + 100)
    base_offset = bytearray(good)
    struct.pack_into(">q", base_offset, 0, 7)
    control = bytearray(good)
    struct.pack_into(">h", control, 21, 0x20)
    return {
        "corrupt crc": (bytes(corrupt_crc), CORRUPT_MESSAGE),
        "lastOffsetDelta != count - 1": (_with_crc(wrong_delta), INVALID_RECORD),
        "zero records": (_with_crc(zero_count), INVALID_RECORD),
        "magic 1": (bytes(magic_1), INVALID_RECORD),
        "magic 3": (bytes(magic_3), CORRUPT_MESSAGE),
        "negative magic": (bytes(magic_neg), CORRUPT_MESSAGE),
        "batch length below the minimum": (bytes(short_length), CORRUPT_MESSAGE),
        "batch longer than the request": (bytes(long_length), INVALID_RECORD),
        "no batch at all": (b"", INVALID_RECORD),
        "truncated header": (good[:30], INVALID_RECORD),
        "two batches": (good + good, INVALID_RECORD),
        "base offset not 0": (bytes(base_offset), INVALID_RECORD),
        "control batch from a client": (_with_crc(control), INVALID_RECORD),
    }


BAD_BATCHES = _bad_batches()


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_bad_record_batch_is_refused(broker: EmbeddedBroker, topic_name: str, name: str) -> None:
    records, expected = BAD_BATCHES[name]
    with WireClient(broker.bootstrap_servers) as client:
        client.metadata([topic_name])
        answer = client.produce(topic_name, 0, records)
        assert (answer.error_code, answer.base_offset) == (expected, -1)
        assert client.log_end_offset(topic_name, 0) == 0
        # The refusal is per partition: the connection goes on working.
        answer = client.produce(topic_name, 0, build_batch([b"ok"]))
        assert (answer.error_code, answer.base_offset) == (0, 0)


@pytest.mark.parametrize("name", ["bad name!", "a" * 250, ".", "..", "über", "with/slash"])
def test_invalid_topic_names(broker: EmbeddedBroker, name: str) -> None:
    with WireClient(broker.bootstrap_servers) as client:
        topic = client.metadata([name]).topics[0]
        assert (topic.name, topic.error_code) == (name, INVALID_TOPIC_EXCEPTION)
        # No topic has that name, and Produce never creates one: Kafka's answer for any unknown topic.
        assert client.produce(name, 0, build_batch([b"x"])).error_code == UNKNOWN_TOPIC_OR_PARTITION
        listed = {t.name for t in client.metadata(None).topics}
        assert name not in listed
    assert not (Path(broker.config.data_dir) / "topics" / f"{name}-0").exists()


# -- fuzzing while a real client works ----------------------------------------------------------


def _seed_frames() -> list[bytes]:
    """A well-formed request for every advertised API and version, to mutate."""
    frames = []
    for api in sorted(APIS.values(), key=lambda a: a.key):
        for version in range(api.min_version, api.max_version + 1):
            request = api.request()
            if api.key == PRODUCE:
                request = produce_request("fuzz-target", 0, build_batch([b"f"] * 3))
            request.with_header(correlation_id=5, client_id="fuzz")
            frames.append(bytes(request.encode(version=version, header=True, framed=True)))
    return frames


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    kind = rng.randrange(8)
    if kind == 0:  # overwrite a few bytes
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(4, len(data))] = rng.randrange(256)
    elif kind == 1:  # cut the body short, with a consistent size prefix
        data = data[: rng.randrange(4, len(data) + 1)]
        struct.pack_into(">i", data, 0, len(data) - 4)
    elif kind == 2:  # insert junk
        at = rng.randrange(4, len(data) + 1)
        data[at:at] = rng.randbytes(rng.randint(1, 16))
        struct.pack_into(">i", data, 0, len(data) - 4)
    elif kind == 3:  # extreme length or count somewhere in the body
        at = rng.randrange(12, len(data)) if len(data) > 12 else 4
        value = rng.choice([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", b"\x00\x00\x00\x00"])
        data[at : at + 4] = value[: len(data[at : at + 4])]
    elif kind == 4:  # another version of the same API
        struct.pack_into(">h", data, 6, rng.randrange(-2, 40))
    elif kind == 5:  # flip one bit
        data[rng.randrange(4, len(data))] ^= 1 << rng.randrange(8)
    elif kind == 6:  # a lying size prefix
        struct.pack_into(">i", data, 0, max(0, len(data) - 4 + rng.randint(-8, 8)))
    else:  # pure noise
        data = bytearray(rng.randbytes(rng.randint(1, 200)))
    return bytes(data)


def _fuzz(address: tuple[str, int], seed: int, frames: list[bytes], count: int, sent: list[int]) -> None:
    rng = random.Random(seed)
    sock: socket.socket | None = None
    for i in range(count):
        if sock is None or i % 25 == 0:
            if sock is not None:
                sock.close()
            sock = socket.create_connection(address, timeout=5)
            sock.settimeout(0.02)
        try:
            sock.sendall(_mutate(rng, rng.choice(frames)))
            sent[0] += 1
            try:
                if not sock.recv(65536):
                    sock.close()
                    sock = None
            except TimeoutError:
                pass
        except OSError:
            sock.close()
            sock = None
    if sock is not None:
        sock.close()


def test_fuzzing_never_crashes_the_broker(tmp_path: Path, topic_name: str) -> None:
    seed = int(os.environ.get("SPARKEOS_TEST_SEED", random.randrange(2**32)))
    log.warning("fuzz seed %d", seed)
    stderr_path = tmp_path / "broker.stderr"
    process, bootstrap = start_logged_broker(tmp_path / "broker", stderr_path)
    try:
        total = 3000
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 5})
        acked: dict[int, int] = {}
        failed: list[str] = []

        def on_delivery(err, message) -> None:
            if err is not None:
                failed.append(str(err))
            else:
                acked[int(message.value())] = message.offset()

        producer.produce(topic_name, value=b"0", on_delivery=on_delivery)
        assert producer.flush(30) == 0

        frames = _seed_frames()
        sent = [0]
        fuzzers = [threading.Thread(target=_fuzz, args=(split_address(bootstrap), seed + i, frames, 1000, sent))
                   for i in range(4)]
        for fuzzer in fuzzers:
            fuzzer.start()

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"good-{topic_name}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic_name, 0, 0)])
        received: list[tuple[int, int]] = []
        try:
            for number in range(1, total):
                producer.produce(topic_name, value=str(number).encode(), on_delivery=on_delivery)
                if number % 100 == 0:
                    producer.poll(0)
                    for message in consumer.consume(1000, 0):
                        assert message.error() is None, message.error()
                        received.append((message.offset(), int(message.value())))
            assert producer.flush(60) == 0
            deadline = time.monotonic() + 60
            while len(received) < total and time.monotonic() < deadline:
                for message in consumer.consume(1000, 0.2):
                    assert message.error() is None, message.error()
                    received.append((message.offset(), int(message.value())))
        finally:
            consumer.close()
            for fuzzer in fuzzers:
                fuzzer.join(timeout=120)
        log.warning("fuzzers sent %d frames", sent[0])

        assert process.poll() is None, "the broker process died"
        assert sent[0] >= 3000
        assert not failed, failed[:5]
        assert received == [(n, n) for n in range(total)], "the good client lost, duplicated or reordered records"
        assert acked == {n: n for n in range(total)}
        assert_serving(bootstrap)
        with WireClient(bootstrap) as client:
            assert client.log_end_offset(topic_name, 0) == total
    finally:
        stop_logged_broker(process)
    errors = stderr_path.read_text()
    bad_lines = [line for line in errors.splitlines()
                 if "Traceback" in line or " ERROR " in line or " CRITICAL " in line]
    assert not bad_lines, "broker logged unexpected errors:\n" + "\n".join(bad_lines[:20]) + "\n" + errors[-3000:]
    assert "closing connection from" in errors, "the fuzzers never reached the frame parser"
    assert process.returncode == 0
