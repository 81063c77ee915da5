"""A seeded fuzz of the broker: mutated Produce requests whose record batches are damaged (and given a
correct CRC most of the time, so the damage reaches the record checks), mutated frames of every API,
and random garbage frames, while a well-behaved librdkafka producer and consumer work beside them.

Every case must be answered or have its connection closed; the good client must lose nothing; and
afterwards every partition of every topic must be readable to its end by kafka-python and librdkafka,
which is what a batch the broker should have refused would break.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import socket
import struct
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.producer import ProduceResponse
from kafka.record.default_records import DefaultRecordBatch

from sparkeos.broker.dispatch import APIS
from support.readers import read_with_confluent, read_with_kafka_python
from support.records import batch, fix_crc, record, record_body, varint
from support.wire import (
    WireClient,
    produce_request,
    request_frame,
    split_address,
    start_logged_broker,
    stop_logged_broker,
)

log = logging.getLogger(__name__)

SEED = int(os.environ.get("SPARKEOS_FUZZ_SEED", "20240611"))
RECORD_CASES = 3000  # mutated Produce requests
FRAME_CASES = 600  # mutated frames of every API
GARBAGE_CASES = 300  # random frames
TOPICS = {"fuzz-one": {}, "fuzz-three": {"partitions": 3}, "fuzz-compacted": {"cleanup.policy": "compact"}}
PRODUCE = 0
ANSWER_TIMEOUT_S = 10.0
# A mutated frame may be a request that is rightly answered late (a Fetch whose max_wait_ms became huge, a
# JoinGroup waiting for its group): after this long without an answer or a close it counts as pending.
FRAME_PATIENCE_S = 2.0


# -- the broker ----------------------------------------------------------------------------------


def _create_topics(bootstrap: str) -> None:
    Topic = CreateTopicsRequest.CreatableTopic
    request = CreateTopicsRequest(timeout_ms=10000, validate_only=False, topics=[
        Topic(name=name, num_partitions=spec.get("partitions", 1), replication_factor=1, assignments=[],
              configs=[Topic.CreatableTopicConfig(name=k, value=v) for k, v in spec.items() if k != "partitions"])
        for name, spec in TOPICS.items()])
    with WireClient(bootstrap) as client:
        answer = client.request(request, CreateTopicsResponse, 4)
    assert [t.error_code for t in answer.topics] == [0] * len(TOPICS)


# -- cases ---------------------------------------------------------------------------------------


def _random_records(rng: random.Random, count: int, keyed: bool) -> list[bytes]:
    records = []
    for i in range(count):
        key = rng.randbytes(rng.choice([0, 1, 5, 70])) if keyed or rng.random() < 0.5 else None
        value = rng.randbytes(rng.choice([0, 3, 60, 70, 300])) if rng.random() < 0.95 else None
        headers = [(bytes(rng.choices(b"abcxyz-._", k=rng.randint(0, 8))),  # keys are strings
                    rng.choice([None, rng.randbytes(rng.randint(0, 80))]))
                   for _ in range(rng.choice([0, 0, 1, 3]))]
        records.append(record(record_body(i, key, value, headers, timestamp_delta=rng.choice([0, i, -5, 10**6]))))
    return records


def _mutate_records(rng: random.Random, records: list[bytes]) -> bytes:
    """The records' bytes with one to three damages: bytes changed, inserted or dropped, a length or delta
    replaced, a record cut or added. Some cases come out well formed (a byte set to what it was)."""
    data = bytearray(b"".join(records))
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(10)
        at = rng.randrange(len(data) + 1)
        if kind == 0 and data:  # one byte set to a value varints make much of
            data[min(at, len(data) - 1)] = rng.choice([0x00, 0x01, 0x02, 0x7E, 0x7F, 0x80, 0x81, 0xFE, 0xFF])
        elif kind == 1 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 2:
            data[at:at] = rng.randbytes(rng.randint(1, 3))
        elif kind == 3:
            del data[at : at + rng.randint(1, 3)]
        elif kind == 4:  # a record's length replaced
            index = rng.randrange(len(records))
            start = sum(len(r) for r in records[:index])
            old = records[index]
            length_size = next(i for i, byte in enumerate(old) if byte < 0x80) + 1
            data[start : start + length_size] = varint(rng.choice([-1, -3, 0, 1, 5, len(old) - 2, len(old) + 3,
                                                                   2**31 - 1]))
        elif kind == 5:  # a varint made too long
            data[at:at] = b"\x80" * rng.randint(4, 10)
        elif kind == 6:  # cut
            del data[at:]
        elif kind == 7:  # a record added, or trailing bytes
            data += record(record_body(len(records) + rng.randint(-1, 1))) if rng.random() < 0.5 else b"\x00"
        elif kind == 8:  # one whole record dropped
            index = rng.randrange(len(records))
            start = sum(len(r) for r in records[:index])
            del data[start : start + len(records[index])]
        else:  # a one-byte field of a record (attributes, a delta, a length, a count) set to another byte:
            # the record keeps its length, so only what the field means changes (a null key made -3...)
            index = rng.randrange(len(records))
            start = sum(len(r) for r in records[:index])
            position = start + rng.choice(_one_byte_fields(records[index]))
            if position < len(data):
                data[position] = rng.choice([0x00, 0x01, 0x02, 0x03, 0x05, 0x09, 0x7F, 0x80, 0xFF])
    return bytes(data)


def _one_byte_fields(well_formed: bytes) -> list[int]:
    """Where, in a well-formed record, the attributes and the varints of one byte are."""
    def skip_varint(pos: int) -> tuple[int, int, bool]:
        start = pos
        value, shift = 0, 0
        while True:
            byte = well_formed[pos]
            value |= (byte & 0x7F) << shift
            pos += 1
            if byte < 0x80:
                return (value >> 1) ^ -(value & 1), pos, pos - start == 1
            shift += 7

    fields = []
    _, pos, _ = skip_varint(0)  # the record's length
    fields.append(pos)  # attributes
    _, pos, _ = skip_varint(pos + 1)  # timestamp delta
    for has_data in (False, True, True):  # offset delta; key length, then the key; value length, then the value
        at = pos
        value, pos, one = skip_varint(pos)
        if one:
            fields.append(at)
        if has_data:
            pos += max(value, 0)
    at = pos
    count, pos, _ = skip_varint(pos)
    fields.append(at)
    for _ in range(count):
        for _ in range(2):  # header key, header value
            at = pos
            value, pos, one = skip_varint(pos)
            if one:
                fields.append(at)
            pos += max(value, 0)
    return fields


def _record_case(rng: random.Random) -> tuple[str, int, bytes, int]:
    """(topic, partition, records, produce version) of a Produce request with a damaged batch."""
    topic = rng.choice(sorted(TOPICS))
    partition = rng.randrange(TOPICS[topic].get("partitions", 1))
    count = rng.randint(1, 12)
    records = _random_records(rng, count, keyed=topic == "fuzz-compacted" and rng.random() < 0.8)
    codec = rng.choice([0, 0, 0, 1, 2, 3, 4])
    roll = rng.random()
    if roll < 0.08:
        payload = b"".join(records)  # left whole: the damage is in the header, or there is none
    else:
        payload = _mutate_records(rng, records)
    count_field = count if rng.random() < 0.85 else rng.choice([0, -1, count - 1, count + 1, 2**31 - 1])
    attributes = codec
    if rng.random() < 0.05:
        attributes = rng.choice([5, 6, 7, codec | 0x20, codec | 0x10, codec | 0x08])
    data = bytearray(batch(payload, count=count_field, codec=codec, attributes=attributes,
                           last_offset_delta=count_field - 1 if rng.random() < 0.95 else count))
    if codec and rng.random() < 0.15:  # the compressed bytes themselves damaged
        at = rng.randrange(61, len(data))
        data[at] ^= 1 << rng.randrange(8)
    if rng.random() < 0.04:  # a header field other than the CRC damaged
        at = rng.choice([0, 7, 8, 11, 16, 43, 51, 53])
        data[at] ^= 1 << rng.randrange(8)
    if rng.random() < 0.9:
        data = bytearray(fix_crc(data))
    version = rng.randint(3, 9)
    return topic, partition, bytes(data), version


def _seed_frames() -> list[bytes]:
    """A well-formed request of every advertised API and version, Produce ones with real batches."""
    frames = []
    good = batch([record(record_body(i, key=b"k%d" % i, value=b"v")) for i in range(3)])
    for api in sorted(APIS.values(), key=lambda a: a.key):
        for version in range(api.min_version, api.max_version + 1):
            request = api.request()
            if api.key == PRODUCE:
                request = produce_request("fuzz-one", 0, good)
            request.with_header(correlation_id=5, client_id="fuzz")
            frames.append(bytes(request.encode(version=version, header=True, framed=True)))
    return frames


def _mutate_frame(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(6)
        if kind == 0:
            data[rng.randrange(4, len(data))] = rng.randrange(256)
        elif kind == 1:  # cut short, with a size prefix that says so
            data = data[: rng.randrange(5, len(data) + 1)]
        elif kind == 2:
            at = rng.randrange(4, len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif kind == 3:  # an extreme length or count
            at = rng.randrange(8, len(data)) if len(data) > 8 else 4
            data[at : at + 4] = rng.choice([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x80\x00\x00\x00"])
        elif kind == 4 and len(data) >= 8:  # another version of the same API
            struct.pack_into(">h", data, 6, rng.randrange(-2, 20))
        else:
            data[rng.randrange(4, len(data))] ^= 1 << rng.randrange(8)
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


def _garbage_frame(rng: random.Random) -> bytes:
    api_key = rng.choice([rng.randrange(-5, 80), *APIS])
    body = rng.randbytes(rng.choice([0, 1, 7, 40, 300]))
    frame = request_frame(api_key, rng.randrange(-1, 16), rng.randrange(2**31), body,
                          client_id=rng.choice([None, b"", b"g" * rng.randint(1, 30)]),
                          flexible_header=rng.random() < 0.5)
    if rng.random() < 0.2:  # a size prefix that lies
        frame = struct.pack(">i", max(0, len(frame) - 4 + rng.randint(-10, 10))) + frame[4:]
    return frame


def _exchange(address: tuple[str, int], frame: bytes, patience: float = ANSWER_TIMEOUT_S) -> bytes | None:
    """Send one frame on a fresh connection and end the sending side: the broker answers what it received
    whole, then closes. The answer's frame, or None if the connection closed without one; TimeoutError
    if neither happened within `patience` seconds."""
    with socket.create_connection(address, timeout=patience) as sock:
        try:
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return None  # the broker closed it while it was still being sent
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    if len(data) >= 4 and len(data) - 4 >= struct.unpack_from(">i", data)[0]:
        return data[4:]
    return None


def _frame_outcome(address: tuple[str, int], frame: bytes) -> str:
    try:
        answer = _exchange(address, frame, FRAME_PATIENCE_S)
    except TimeoutError:
        return "pending"
    return "answered" if answer is not None else "closed without an answer"


def _check_accepted(records: bytes) -> int:
    """An appended batch must be one kafka-python reads whole, with offsets 0..n-1; its record count."""
    parsed = DefaultRecordBatch(bytearray(records))
    offsets = [r.offset for r in parsed]
    assert offsets == list(range(parsed.last_offset_delta + 1)), offsets
    return len(offsets)


# -- the good client -------------------------------------------------------------------------------


class GoodClient(threading.Thread):
    """An idempotent librdkafka producer and a consumer of what it produced, running beside the fuzzing."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.stop = threading.Event()
        self.acked: dict[int, int] = {}
        self.failures: list[str] = []
        self.received: list[tuple[int, int]] = []
        self.sent = 0

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 2})
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"good-{uuid.uuid4().hex[:6]}",
                             "enable.auto.commit": False})

        def delivered(err, message) -> None:
            if err is not None:
                self.failures.append(str(err))
            else:
                self.acked[int(message.value())] = message.offset()

        producer.produce(self.topic, b"0", on_delivery=delivered)
        self.sent = 1
        assert producer.flush(30) == 0
        consumer.assign([TopicPartition(self.topic, 0, 0)])
        try:
            while not self.stop.is_set():
                for _ in range(20):
                    producer.produce(self.topic, str(self.sent).encode(), on_delivery=delivered)
                    self.sent += 1
                producer.poll(0)
                self._consume(consumer, 0.02)
            if producer.flush(60) != 0:
                self.failures.append("records left undelivered")
            deadline = time.monotonic() + 60
            while len(self.received) < self.sent and time.monotonic() < deadline:
                self._consume(consumer, 0.2)
        finally:
            consumer.close()

    def _consume(self, consumer: Consumer, timeout: float) -> None:
        for message in consumer.consume(1000, timeout):
            if message.error() is not None:
                self.failures.append(str(message.error()))
            else:
                self.received.append((message.offset(), int(message.value())))


# -- the test --------------------------------------------------------------------------------------


def test_fuzzing_the_broker_leaves_every_partition_readable(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    stderr_path = tmp_path / "broker.stderr"
    process, bootstrap = start_logged_broker(tmp_path / "broker", stderr_path)
    address = split_address(bootstrap)
    counts: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    try:
        _create_topics(bootstrap)
        good = GoodClient(bootstrap, f"good-{uuid.uuid4().hex[:8]}")
        good.start()

        for case in range(RECORD_CASES):
            topic, partition, records, version = _record_case(rng)
            request = produce_request(topic, partition, records)
            request.with_header(correlation_id=case, client_id="fuzz")
            answer = _exchange(address, bytes(request.encode(version=version, header=True, framed=True)))
            counts["record cases"] += 1
            # The request itself is well formed, whatever its records hold: it is always answered.
            assert answer is not None, f"the broker closed the connection of record case {case}"
            response = ProduceResponse.decode(answer, version=version, header=True)
            assert response.header.correlation_id == case
            code = response.responses[0].partition_responses[0].error_code
            counts[f"record cases: error {code}"] += 1
            if code == 0:
                counts["batches appended"] += 1
                counts["records appended"] += _check_accepted(records)

        frames = _seed_frames()
        for _ in range(FRAME_CASES):
            counts["frame cases: " + _frame_outcome(address, _mutate_frame(rng, rng.choice(frames)))] += 1
        for _ in range(GARBAGE_CASES):
            counts["garbage cases: " + _frame_outcome(address, _garbage_frame(rng))] += 1

        good.stop.set()
        good.join(120)
        assert not good.is_alive()
        assert process.poll() is None, "the broker process died"
        assert not good.failures, good.failures[:5]
        assert good.acked == {n: n for n in range(good.sent)}, "the good producer lost or reordered records"
        assert good.received == [(n, n) for n in range(good.sent)], "the good consumer missed records"
        counts["good client records"] = good.sent

        # Every partition of every topic, to its end, by both clients (fuzzed frames may have made topics).
        # (A fuzzed DeleteRecords or retention setting may have moved a log's start: reading starts there.)
        with WireClient(bootstrap) as client:
            topics = {t.name: len(t.partitions) for t in client.metadata(None).topics}
            ranges = {(name, p): (client.log_start_offset(name, p), client.log_end_offset(name, p))
                      for name, partitions in topics.items() for p in range(partitions)}
        for (name, partition), (start, end) in sorted(ranges.items()):
            # A batch appended with more records in its header than in its bytes would show here first.
            assert end - start <= 100 * RECORD_CASES + good.sent, f"{name}-{partition} ends at {end}"
            expected = list(range(start, end))
            read = read_with_confluent(bootstrap, name, partition, end, start)
            assert [offset for offset, _, _ in read] == expected, f"librdkafka read of {name}-{partition}"
            read = read_with_kafka_python(bootstrap, name, partition, end, start)
            assert [offset for offset, _, _ in read] == expected, f"kafka-python read of {name}-{partition}"
            counts["partitions read to their end"] += 1
        counts["records in fuzzed topics"] = sum(end - start for (name, _), (start, end) in ranges.items()
                                                 if name in TOPICS)
    finally:
        stop_logged_broker(process)
    counts["seconds"] = round(time.monotonic() - started)
    log.warning("fuzz seed %d: %s", SEED, dict(sorted(counts.items())))
    print(f"fuzz seed {SEED}: {dict(sorted(counts.items()))}")

    # The cases reached every kind of check, and some damaged batches were still well formed.
    assert counts["record cases: error 87"] >= 200, counts  # INVALID_RECORD: the record checks
    assert counts["record cases: error 2"] >= 20, counts  # CORRUPT_MESSAGE: a CRC left wrong
    assert counts["record cases: error -1"] >= 10, counts  # a stream that does not decompress
    assert counts["batches appended"] >= 20, counts
    errors = stderr_path.read_text()
    bad_lines = [line for line in errors.splitlines()
                 if "Traceback" in line or " ERROR " in line or " CRITICAL " in line]
    assert not bad_lines, "broker logged unexpected errors:\n" + "\n".join(bad_lines[:20])
    assert "closing connection from" in errors, "no fuzzed frame reached the frame parser"
    assert process.returncode == 0
