"""Every record of a produced batch is read before the batch is appended, as Kafka's LogValidator does.

One test per malformed shape, each with a correct CRC so that only the record checks can catch it:
each gets Kafka's error code and appends nothing. Well-formed but unusual records are accepted and
read back by kafka-python and librdkafka; Produce never creates a topic.
"""

from __future__ import annotations

import collections
import struct
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import ProduceResponse

from sparkeos.broker import EmbeddedBroker
from support.readers import read_with_confluent, read_with_kafka_python
from support.records import (
    GZIP,
    HEADER_SIZE,
    LZ4,
    SNAPPY,
    ZSTD,
    batch,
    compress,
    field,
    record,
    record_body,
    uvarint,
    varint,
    well_formed,
)
from support.wire import WireClient, produce_request

UNKNOWN_SERVER_ERROR = -1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87
CODECS = {"gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}


def _good(index: int) -> bytes:
    return record(record_body(index))


def _shapes() -> dict[str, bytes]:
    """Malformed records of every kind, as the records part of a three-record batch (its count says 3)."""
    body = record_body(1)
    return {
        "record length past the end of the batch": _good(0) + record(body, len(body) + 50) + _good(2),
        "record length shorter than its fields": _good(0) + record(body, len(body) - 1) + _good(2),
        "record length longer than its fields": _good(0) + record(body + b"\x00", len(body) + 1) + _good(2),
        "negative record length": _good(0) + varint(-3) + body + _good(2),
        "record length varint of six bytes": _good(0) + b"\x80\x80\x80\x80\x80\x00" + body + _good(2),
        "offset delta varint past 32 bits": _good(0) + record(
            b"\x00\x00" + b"\x82\x80\x80\x80\x10" + body[3:]) + _good(2),
        "timestamp delta varint of eleven bytes": _good(0) + record(
            b"\x00" + b"\x80" * 10 + b"\x00" + body[2:]) + _good(2),
        "offset deltas not 0, 1, 2": _good(0) + record(record_body(5)) + _good(2),
        "attributes byte with its high bit": _good(0) + record(b"\x80" + body[1:]) + _good(2),
        "offset deltas repeated": _good(0) + _good(0) + _good(2),
        "key length -2": _good(0) + record(b"\x00\x00\x02" + varint(-2) + field(b"v") + b"\x00") + _good(2),
        "key longer than the record": _good(0) + record(b"\x00\x00\x02" + varint(40) + b"kk" + b"\x00") + _good(2),
        "value length -5": _good(0) + record(b"\x00\x00\x02" + field(None) + varint(-5) + b"\x00") + _good(2),
        "negative header count": _good(0) + record(b"\x00\x00\x02" + field(None) + field(b"v") + varint(-1))
        + _good(2),
        "header count past the record": _good(0) + record(b"\x00\x00\x02" + field(None) + field(b"v")
                                                          + varint(40) + b"\x00\x00") + _good(2),
        "negative header key length": _good(0) + record(b"\x00\x00\x02" + field(None) + field(b"v") + varint(1)
                                                        + varint(-1) + field(b"x")) + _good(2),
        "header key not UTF-8": _good(0) + record(b"\x00\x00\x02" + field(None) + field(b"v") + varint(1)
                                                  + field(b"\xff\xfe") + field(b"x")) + _good(2),
        "header value length -3": _good(0) + record(b"\x00\x00\x02" + field(None) + field(b"v") + varint(1)
                                                    + field(b"h") + varint(-3)) + _good(2),
        "fewer records than the count": _good(0) + _good(1),
        "bytes after the last record": _good(0) + _good(1) + _good(2) + b"\x00\x00",
        "a fourth record past the count": _good(0) + _good(1) + _good(2) + _good(3),
        "no records at all": b"",
        "garbage instead of records": bytes(range(200, 240)),
    }


SHAPES = _shapes()


def _produce(broker: EmbeddedBroker, topic: str, records: bytes, version: int = 8):
    with WireClient(broker.bootstrap_servers) as client:
        client.metadata([topic])
        answer = client.produce(topic, 0, records, version=version)
        end = client.log_end_offset(topic, 0)
    return answer, end


def _assert_refused(broker: EmbeddedBroker, topic: str, records: bytes, code: int, version: int = 8) -> None:
    answer, end = _produce(broker, topic, records, version)
    assert (answer.error_code, answer.base_offset) == (code, -1), answer.error_message
    assert end == 0, "a refused batch left records in the log"
    # The partition still takes a good batch, at offset 0.
    answer, end = _produce(broker, topic, batch(well_formed(2)))
    assert (answer.error_code, answer.base_offset, end) == (0, 0, 2)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_malformed_record_is_refused_whole(broker: EmbeddedBroker, topic_name: str, shape: str) -> None:
    _assert_refused(broker, topic_name, batch(SHAPES[shape], count=3), INVALID_RECORD)


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("shape", ["key length -2", "fewer records than the count", "bytes after the last record",
                                   "negative header key length"])
def test_malformed_record_in_a_compressed_batch_is_refused(broker: EmbeddedBroker, topic_name: str, codec: str,
                                                           shape: str) -> None:
    _assert_refused(broker, topic_name, batch(SHAPES[shape], count=3, codec=CODECS[codec]), INVALID_RECORD)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_stream_that_does_not_decompress_is_refused(broker: EmbeddedBroker, topic_name: str, codec: str) -> None:
    good = compress(CODECS[codec], b"".join(well_formed(3, b"x" * 200)))
    truncated = good[: len(good) // 2]
    # Kafka answers its decompressing reader's exception as an unknown server error.
    _assert_refused(broker, topic_name, batch(b"", count=3, codec=CODECS[codec], compressed_payload=truncated),
                    UNKNOWN_SERVER_ERROR)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_an_unknown_compression_codec_is_refused(broker: EmbeddedBroker, topic_name: str, codec: int) -> None:
    _assert_refused(broker, topic_name, batch(well_formed(3), codec=0, attributes=codec), UNKNOWN_SERVER_ERROR)


@pytest.mark.parametrize("version", [3, 6])
def test_zstd_needs_produce_v7(broker: EmbeddedBroker, topic_name: str, version: int) -> None:
    _assert_refused(broker, topic_name, batch(well_formed(3), codec=ZSTD), UNSUPPORTED_COMPRESSION_TYPE, version)


def test_records_decompressing_past_the_request_limit_are_refused(tmp_path: Path, topic_name: str) -> None:
    with EmbeddedBroker(tmp_path / "broker", max_request_bytes=1 << 20) as small:
        bomb = batch([record(record_body(0, value=bytes(2 << 20)))], codec=GZIP)
        assert len(bomb) < 10_000
        _assert_refused(small, topic_name, bomb, MESSAGE_TOO_LARGE)
        fits = batch([record(record_body(0, value=bytes(500_000)))], codec=GZIP)
        answer, end = _produce(small, topic_name, fits)
        assert (answer.error_code, end) == (0, 3)


def test_an_idempotent_batch_needs_a_sequence(broker: EmbeddedBroker, topic_name: str) -> None:
    _assert_refused(broker, topic_name, batch(well_formed(3), producer_id=7, producer_epoch=0, base_sequence=-1),
                    INVALID_RECORD)


def test_a_compressed_control_batch_from_a_client_is_refused(broker: EmbeddedBroker, topic_name: str) -> None:
    _assert_refused(broker, topic_name, batch(well_formed(3), codec=GZIP, attributes=GZIP | 0x20), INVALID_RECORD)


def test_keyless_records_on_a_compacted_topic_are_named_in_record_errors(broker: EmbeddedBroker,
                                                                        topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic_name, 1, config={"cleanup.policy": "compact"})])[topic_name].result(30)
    records = [record(record_body(0, key=b"k0")), record(record_body(1, key=None)),
               record(record_body(2, key=b"k2")), record(record_body(3, key=None))]
    with WireClient(broker.bootstrap_servers) as client:
        answer = client.produce(topic_name, 0, batch(records))
        assert (answer.error_code, answer.base_offset) == (INVALID_RECORD, -1)
        assert [e.batch_index for e in answer.record_errors] == [1, 3]
        assert "Compacted topic cannot accept message without key" in answer.record_errors[0].batch_index_error_message
        assert "2 record errors" in answer.error_message
        assert client.log_end_offset(topic_name, 0) == 0
        keyed = [record(record_body(i, key=b"k%d" % i)) for i in range(3)]
        assert client.produce(topic_name, 0, batch(keyed, codec=LZ4)).error_code == 0


def test_unusual_but_well_formed_records_are_accepted_and_readable(broker: EmbeddedBroker, topic_name: str) -> None:
    """Null and empty keys and values, null header values, multi-byte varints everywhere, negative and huge
    timestamp deltas, odd attributes: Kafka takes them all, and so must this broker, for every codec."""
    bodies = [
        record_body(0, key=None, value=None),
        record_body(1, key=b"", value=b"", timestamp_delta=-1),
        record_body(2, key=b"k" * 300, value=b"v" * 70_000, timestamp_delta=2**40),
        record_body(3, key=b"k", value=b"v", headers=[(b"h1", None), (b"", b""), (b"h" * 200, b"x" * 300)]),
    ]
    bodies.append(b"\x7f" + record_body(4, key=None, value=None)[1:])  # record attributes are unused in v2
    expected: list[tuple[int, bytes | None, bytes | None]] = []
    with WireClient(broker.bootstrap_servers) as client:
        client.metadata([topic_name])
        for codec in (0, GZIP, SNAPPY, LZ4, ZSTD):
            records = [record(body) for body in bodies]
            base = client.log_end_offset(topic_name, 0)
            answer = client.produce(topic_name, 0, batch(records, codec=codec))
            assert (answer.error_code, answer.base_offset) == (0, base), answer.error_message
            expected += [(base, None, None), (base + 1, b"", b""), (base + 2, b"k" * 300, b"v" * 70_000),
                         (base + 3, b"k", b"v"), (base + 4, None, None)]
        end = client.log_end_offset(topic_name, 0)
    assert end == 25
    assert read_with_kafka_python(broker.bootstrap_servers, topic_name, 0, end) == expected
    assert read_with_confluent(broker.bootstrap_servers, topic_name, 0, end) == expected


def test_record_errors_are_left_out_before_produce_v8(broker: EmbeddedBroker, topic_name: str) -> None:
    with WireClient(broker.bootstrap_servers) as client:
        client.metadata([topic_name])
        request = produce_request(topic_name, 0, batch(SHAPES["key length -2"], count=3))
        answer = client.request(request, ProduceResponse, 7).responses[0].partition_responses[0]
        assert answer.error_code == INVALID_RECORD


# -- topics are created by Metadata only ----------------------------------------------------------


def test_produce_never_creates_a_topic(broker: EmbeddedBroker, topic_name: str) -> None:
    with WireClient(broker.bootstrap_servers) as client:
        for version in (3, 8, 9):
            answer = client.produce(topic_name, 0, batch(well_formed(1)), version=version)
            assert (answer.error_code, answer.base_offset) == (UNKNOWN_TOPIC_OR_PARTITION, -1)
        listed = {t.name for t in client.metadata(None).topics}
        assert topic_name not in listed
        # Metadata (with auto-creation allowed, as the broker is by default) creates it; Produce then works.
        assert client.metadata([topic_name]).topics[0].error_code == 0
        assert client.produce(topic_name, 0, batch(well_formed(1))).error_code == 0
        # A partition the topic does not have is unknown too.
        assert client.produce(topic_name, 5, batch(well_formed(1))).error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert not (Path(broker.config.data_dir) / "topics" / f"{topic_name}-5").exists()


def test_producers_that_ask_metadata_first_still_create_topics(broker: EmbeddedBroker, topic_name: str) -> None:
    """librdkafka and kafka-python produce to a new topic as before: their Metadata request creates it."""
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    errors: list = []
    producer.produce(f"{topic_name}-ck", b"one", on_delivery=lambda e, _: errors.append(e))
    assert producer.flush(30) == 0 and errors == [None]
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    try:
        assert kp.send(f"{topic_name}-kp", b"two").get(timeout=30).offset == 0
    finally:
        kp.close()
    with WireClient(broker.bootstrap_servers) as client:
        assert client.log_end_offset(f"{topic_name}-ck", 0) == 1
        assert client.log_end_offset(f"{topic_name}-kp", 0) == 1


def test_the_batch_helper_writes_what_kafka_python_reads() -> None:
    """The hand-built batches of these tests are real batches: kafka-python reads a well-formed one back."""
    from kafka.record.default_records import DefaultRecordBatch

    records = [record(record_body(0, key=b"k", value=b"v", headers=[(b"h", None)])), _good(1)]
    data = batch(records)
    parsed = DefaultRecordBatch(bytearray(data))
    assert parsed.validate_crc()
    assert [(r.offset, r.key, r.value, r.headers) for r in parsed] == [(0, b"k", b"v", [("h", None)]),
                                                                      (1, None, b"v", [])]
    assert len(data) == HEADER_SIZE + sum(len(r) for r in records)
    assert struct.unpack(">i", data[57:61])[0] == 2
    assert uvarint(300) == b"\xac\x02" and varint(-1) == b"\x01" and varint(150) == b"\xac\x02"


def test_every_batch_a_client_builds_is_accepted() -> None:
    """Batches as kafka-python's builder writes them, of every codec and of random shapes (thousands of
    records, so offset deltas and lengths take two and three bytes; keys, headers, negative timestamp
    deltas), pass the record checks; the same batch with one record's offset delta changed does not."""
    import random

    from kafka.record.default_records import DefaultRecordBatchBuilder

    from sparkeos.broker.record_validation import validate_records
    from sparkeos.broker.records import InvalidBatch, split_batches

    rng = random.Random(7)
    for case in range(40):
        codec = case % 5
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                            producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 26)
        count = rng.choice([1, 2, 63, 64, 65, 300, 8191, 8193, 20_000])
        for offset in range(count):
            builder.append(offset, timestamp=1_700_000_000_000 + rng.randint(-100_000, 10**9),
                           key=rng.choice([None, b"", rng.randbytes(rng.choice([1, 63, 64, 200]))]),
                           value=rng.choice([None, b"", rng.randbytes(rng.choice([1, 63, 64, 100, 9000]))])
                           if count < 1000 else b"v",
                           headers=[(f"h{i}", rng.choice([None, b"", b"x" * 70])) for i in range(rng.randint(0, 2))])
        data = bytearray(builder.build())
        ((header, view),) = split_batches(memoryview(data))
        validate_records(header, view, compacted=False, max_uncompressed_bytes=1 << 30, partition_name="t-0")
        if codec == 0:
            # The last record's offset delta, made one more: the CRC is not checked here, the records are.
            last = _last_record_start(data, count)
            broken = bytearray(data)
            _bump_offset_delta(broken, last)
            with pytest.raises(InvalidBatch) as refused:
                validate_records(header, memoryview(broken), False, 1 << 30, "t-0")
            assert refused.value.error_code == INVALID_RECORD


def _varint_size(data: bytes | bytearray, pos: int) -> int:
    size = 1
    while data[pos + size - 1] & 0x80:
        size += 1
    return size


def _last_record_start(data: bytearray, count: int) -> int:
    pos = HEADER_SIZE
    for _ in range(count - 1):
        size_bytes = _varint_size(data, pos)
        length = _zigzag(data, pos)
        pos += size_bytes + length
    return pos


def _zigzag(data: bytes | bytearray, pos: int) -> int:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1)
        shift += 7


def _bump_offset_delta(data: bytearray, record_start: int) -> None:
    """Add one to the record's offset delta in place, when its encoding keeps its size (the test's records)."""
    pos = record_start + _varint_size(data, record_start) + 1  # past the length and the attributes
    pos += _varint_size(data, pos)  # past the timestamp delta
    size = _varint_size(data, pos)
    new = varint(_zigzag(data, pos) + 1)
    if len(new) != size:  # a longer varint would need the record's length rewritten: one less instead
        new = varint(_zigzag(data, pos) - 1)
    assert len(new) == size
    data[pos : pos + size] = new


def _outcome(walk, data: bytes | bytearray, count: int, compacted: bool) -> tuple:
    """What one record walk makes of a batch's records: the keyless indexes, or Kafka's error and message."""
    from sparkeos.broker.records import InvalidBatch

    try:
        return ("read", walk(memoryview(data), HEADER_SIZE, len(data), count, compacted))
    except InvalidBatch as refused:
        return ("refused", refused.error_code, str(refused))


def _both_walks():
    from sparkeos.broker import record_validation, record_walk

    assert record_validation.COMPILED, "the broker runs the plain Python walk: see the test below"
    return record_walk.walk, record_validation._COMPILED


def test_the_broker_reads_produced_records_with_the_compiled_walk() -> None:
    """setup.py compiles record_walk.py at install time where a C compiler is there (.ci/run installs one). If
    this fails, the install had no compiler, or record_walk.py changed since: `pip install -e .` again."""
    from sparkeos.broker import record_validation

    assert record_validation.COMPILED
    assert record_validation._walk is record_validation._COMPILED


@pytest.mark.parametrize("edited", ["record_walk.py", "record_walk.pxd", None], ids=["py", "pxd", "gone"])
def test_an_edited_record_walk_is_run_as_plain_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      edited: str | None) -> None:
    """The compiled module is used only while record_walk.py and its C types are the files it was compiled from:
    after an edit of either, until the next install, the broker runs the edited file's walk; without the files,
    nothing says the module is theirs, and the plain walk runs too."""
    from sparkeos.broker import record_validation, record_walk

    assert record_validation._compiled_walk() is not None
    source = Path(record_walk.__file__)
    if edited is not None:
        for name in ("record_walk.py", "record_walk.pxd"):
            (tmp_path / name).write_bytes((source.parent / name).read_bytes() + (b"\n# an edit\n" if name == edited
                                                                                 else b""))
    monkeypatch.setattr(record_walk, "__file__", str(tmp_path / "record_walk.py"))
    assert record_validation._compiled_walk() is None


@pytest.mark.parametrize("compacted", [False, True], ids=["plain", "compacted"])
def test_the_compiled_and_the_plain_walk_read_and_refuse_alike(compacted: bool) -> None:
    """Every malformed shape, and thousands of random corruptions of batches kafka-python builds (bytes changed,
    varints lengthened past their bits, batches cut short or counted wrong), get the same answer from both forms
    of the walk: the same keyless records, or the same error and message."""
    import random

    from kafka.record.default_records import DefaultRecordBatchBuilder

    plain, compiled = _both_walks()
    cases: list[tuple[bytes, int]] = [(batch(records, count=3), 3) for records in SHAPES.values()]
    cases += [(batch(records, count=1), 1) for records in _varint_edges()]
    rng = random.Random(11)
    # Two batches long enough for offset deltas of two and three bytes, and many short ones.
    for count in [8193, 20_000] + [rng.choice([1, 2, 5, 64, 65, 300]) for _ in range(50)]:
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=1 << 26)
        for offset in range(count):
            builder.append(offset, timestamp=1_700_000_000_000 + rng.choice([0, 1, -1, 9_000, 10**7, -(10**12)]),
                           key=rng.choice([None, b"", b"k" * rng.choice([1, 64, 200])]),
                           value=rng.choice([None, b"", b"v" * rng.choice([1, 63, 100, 9000])]) if count < 100
                           else b"v" * 100,
                           headers=[(rng.choice(["h", "é"]), rng.choice([None, b"", b"x" * 70]))
                                    for _ in range(rng.choice([0, 0, 1, 3]))])
        good = bytes(builder.build())
        cases.append((good, count))
        cases.append((good, max(1, count + rng.choice([-1, 1, 7, -(count // 2)]))))
        cases.append((good[: rng.randrange(HEADER_SIZE, len(good))], count))
        for corruption in range(30):
            broken = bytearray(good)
            # Most corruptions land in the first records, where every field kind is; in the long batches a third
            # land in their last quarter, where offset deltas take three bytes.
            if count > 8192 and corruption % 3 == 0:
                at = rng.randrange(len(good) * 3 // 4, len(good))
            else:
                at = HEADER_SIZE + min(int(rng.expovariate(1 / 12)), len(good) - HEADER_SIZE - 1)
            for offset in range(rng.choice([1, 1, 2, 11])):
                if at + offset < len(broken):
                    broken[at + offset] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x02, rng.randrange(256)])
            cases.append((bytes(broken), count))
    outcomes = collections.Counter()
    for data, count in cases:
        expected = _outcome(plain, data, count, compacted)
        assert _outcome(compiled, data, count, compacted) == expected, (data[:120].hex(), count)
        outcomes[expected[0]] += 1
    # Both kinds of answer were compared, many times over.
    assert outcomes["read"] >= 100 and outcomes["refused"] >= 1_000, outcomes
    # A tenth int64 varint byte with payload bits past 64 overflows; one that goes on is a varint too long.
    too_wide, too_long = (batch(record(b"\x00" + b"\xff" * 9 + last + b"\x00" + field(None) + field(b"v") + b"\x00"),
                                count=1) for last in (b"\x02", b"\x82\x00"))
    assert _outcome(compiled, too_wide, 1, compacted)[2].endswith("varint overflows 64 bits")
    assert _outcome(compiled, too_long, 1, compacted)[2].endswith("varint of more than 10 bytes")


def _varint_edges() -> list[bytes]:
    """One-record batches whose every varint field in turn is written long: int64 varints of ten bytes whose last
    byte carries one bit too many or not, int32 ones of five bytes likewise, and both one byte too long."""
    int64 = [b"\xff" * 9 + bytes([last]) for last in (0x00, 0x01, 0x02, 0x7F)] + [b"\x80" * 10 + b"\x00"]
    int32 = [b"\x80" * 4 + bytes([last]) for last in (0x00, 0x0F, 0x10, 0x7F)] + [b"\x80" * 5 + b"\x00"]
    fields = {
        "timestamp delta": lambda v: b"\x00" + v + b"\x00" + field(None) + field(b"v") + b"\x00",
        "offset delta": lambda v: b"\x00\x00" + v + field(None) + field(b"v") + b"\x00",
        "key length": lambda v: b"\x00\x00\x00" + v + field(b"v") + b"\x00",
        "value length": lambda v: b"\x00\x00\x00" + field(None) + v + b"\x00",
        "header count": lambda v: b"\x00\x00\x00" + field(None) + field(b"v") + v,
        "header key length": lambda v: b"\x00\x00\x00" + field(None) + field(b"v") + b"\x02" + v + field(b"x"),
        "header value length": lambda v: b"\x00\x00\x00" + field(None) + field(b"v") + b"\x02" + field(b"h") + v,
    }
    edges = [record(body(v)) for body in fields.values() for v in int32 + int64]
    return edges + [b"\x80" * 4 + bytes([last]) + b"\x00" * 6 for last in (0x00, 0x0F, 0x10)]
