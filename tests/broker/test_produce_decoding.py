"""The hand-written Produce request decoder reads what kafka-python's encoder writes, for every version we serve."""

from __future__ import annotations

import os
import struct

import pytest
from kafka.protocol.producer import ProduceRequest

from sparkeos.broker.produce_decoding import ProduceRequestData, decode_produce_request
from sparkeos.broker.protocol import MalformedRequest

TopicData = ProduceRequest.TopicProduceData
PartitionData = TopicData.PartitionProduceData

VERSIONS = range(3, 10)
LARGE = os.urandom(1 << 20)


def request(transactional_id: str | None, acks: int, topics: dict[str, dict[int, bytes | None]]) -> ProduceRequest:
    return ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=30_000,
        topic_data=[
            TopicData(
                name=name,
                partition_data=[PartitionData(index=index, records=records) for index, records in partitions.items()],
            )
            for name, partitions in topics.items()
        ],
    )


CASES = {
    "no topics": request(None, 1, {}),
    "one partition": request(None, -1, {"orders": {0: b"batch" * 20}}),
    "transactional": request("txn-\u00e9\u6f22", -1, {"orders": {3: b"x" * 61}}),
    "acks 0": request(None, 0, {"fire-and-forget": {0: b"r"}}),
    "null and empty records": request("t", 1, {"t": {0: None, 1: b"", 2: b"abc"}}),
    "empty transactional id": request("", 1, {"t": {0: b"abc"}}),
    "several topics and partitions": request(
        "producer-1",
        -1,
        {f"topic-{t}": {p: os.urandom(p * 13) if p % 3 else None for p in range(7)} for t in range(4)}
        | {"topic-empty": {}},
    ),
    "non-ascii topic name": request(None, 1, {"caf\u00e9-\u65e5\u672c-\U0001f600": {0: b"payload"}}),
    "large records": request("big", -1, {"big": {0: LARGE, 1: b"small"}, "other": {5: LARGE[:1000]}}),
}


def encoded(case: str, version: int) -> bytes:
    return bytes(CASES[case].encode(version=version))


def as_plain(decoded: ProduceRequestData) -> tuple:
    return (
        decoded.transactional_id,
        decoded.acks,
        decoded.timeout_ms,
        [
            (t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
            for t in decoded.topic_data
        ],
    )


def reference_plain(body: bytes, version: int) -> tuple:
    """The same body read by kafka-python's generic schema decoder."""
    ref = ProduceRequest.decode(body, version=version)
    return (
        ref.transactional_id,
        ref.acks,
        ref.timeout_ms,
        [(t.name, [(p.index, p.records) for p in t.partition_data]) for t in ref.topic_data],
    )


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_kafka_python_decoder(case: str, version: int) -> None:
    body = encoded(case, version)
    decoded = decode_produce_request(memoryview(body), version)
    assert as_plain(decoded) == reference_plain(body, version)
    # What was encoded, too, not just what kafka-python reads back.
    original = CASES[case]
    assert decoded.transactional_id == original.transactional_id
    assert [t.name for t in decoded.topic_data] == [t.name for t in original.topic_data]


@pytest.mark.parametrize("version", VERSIONS)
def test_records_are_slices_of_the_body_not_copies(version: int) -> None:
    body = bytearray(encoded("null and empty records", version))
    view = memoryview(body)
    decoded = decode_produce_request(view, version)
    records = decoded.topic_data[0].partition_data[2].records
    assert records is not None and records.obj is view.obj
    records[:] = b"XYZ"
    assert b"XYZ" in body and b"abc" not in body
    assert bytes(decode_produce_request(memoryview(body), version).topic_data[0].partition_data[2].records) == b"XYZ"


def test_large_records_are_not_copied() -> None:
    body = bytearray(encoded("large records", 7))
    decoded = decode_produce_request(memoryview(body), 7)
    records = decoded.topic_data[0].partition_data[0].records
    assert records is not None and records.obj is body and len(records) == len(LARGE)
    records[0] ^= 0xFF
    assert body[body.index(LARGE[1:64]) - 1] == LARGE[0] ^ 0xFF


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_malformed(version: int) -> None:
    for case in ("several topics and partitions", "null and empty records", "transactional", "no topics"):
        body = encoded(case, version)
        for size in range(len(body)):
            with pytest.raises(MalformedRequest, match=f"^Produce v{version}: "):
                decode_produce_request(memoryview(body[:size]), version)


@pytest.mark.parametrize("version", VERSIONS)
def test_trailing_bytes_are_ignored_as_kafka_does(version: int) -> None:
    body = encoded("null and empty records", version)
    padded = body + b"\x00\x07"
    assert as_plain(decode_produce_request(memoryview(padded), version)) == reference_plain(body, version)


@pytest.mark.parametrize("version", [2, 10, -1])
def test_versions_outside_3_to_9_are_refused(version: int) -> None:
    body = encoded("one partition", 8)
    with pytest.raises(MalformedRequest):
        decode_produce_request(memoryview(body), version)


def _v8(*parts: bytes) -> bytes:
    # transactional_id null, acks -1, timeout 1000, then the given topic_data bytes.
    return struct.pack(">hhi", -1, -1, 1000) + b"".join(parts)


def _v9(*parts: bytes) -> bytes:
    return b"\x00" + struct.pack(">hi", -1, 1000) + b"".join(parts)


ONE = struct.pack(">i", 1)
MALFORMED = {
    # Non-flexible: int32 array counts, int16 string lengths, int32 bytes lengths.
    (8, "topic_data is null"): _v8(struct.pack(">i", -1)),
    (8, "topic_data.name is null"): _v8(ONE, struct.pack(">h", -1)),
    (8, "topic_data.name is not valid UTF-8"): _v8(ONE, struct.pack(">h", 2), b"\xc3\x28"),
    (8, "topic_data.partition_data is null"): _v8(ONE, struct.pack(">h", 1), b"t", struct.pack(">i", -1)),
    # Flexible: uvarint of length + 1, so 0 is null.
    (9, "topic_data is null"): _v9(b"\x00", b"\x00"),
    (9, "topic_data.name is null"): _v9(b"\x02", b"\x00"),
    (9, "topic_data.name is not valid UTF-8"): _v9(b"\x02", b"\x03\xff\xfe", b"\x01", b"\x00", b"\x00"),
    (9, "topic_data.partition_data is null"): _v9(b"\x02", b"\x02t", b"\x00"),
    (9, "topic_data.partition_data.records has a bad length"): _v9(b"\x02", b"\x02t", b"\x02", ONE, b"\xff" * 6),
    (9, "topic_data tagged fields runs past"): _v9(b"\x02", b"\x02t", b"\x01", b"\x01", b"\x05\x09abc"),
    # Kafka caps every string at 32767 bytes, also where the compact length could say more.
    (9, "topic_data.name has invalid length 32768"): _v9(b"\x02", b"\x81\x80\x02", b"t" * 32768),
}


@pytest.mark.parametrize(("version", "problem"), sorted(MALFORMED))
def test_malformed_bodies_name_the_field(version: int, problem: str) -> None:
    with pytest.raises(MalformedRequest, match=f"^Produce v{version}: {problem}"):
        decode_produce_request(memoryview(MALFORMED[version, problem]), version)


def test_any_negative_length_reads_as_null_as_in_kafka() -> None:
    """Kafka's generated readers take every negative length for null: refused where null is not allowed."""
    with pytest.raises(MalformedRequest, match="^Produce v8: topic_data is null"):
        decode_produce_request(memoryview(_v8(struct.pack(">i", -2))), 8)
    with pytest.raises(MalformedRequest, match="^Produce v8: topic_data.name is null"):
        decode_produce_request(memoryview(_v8(ONE, struct.pack(">h", -7))), 8)
    body = struct.pack(">hhi", -2, 1, 1000) + _v8(ONE, struct.pack(">h", 1), b"t", ONE, struct.pack(">ii", 0, -2))[8:]
    assert as_plain(decode_produce_request(memoryview(body), 8)) == (None, 1, 1000, [("t", [(0, None)])])


def test_unknown_tagged_fields_are_skipped_at_every_level() -> None:
    tags = b"\x02" + b"\x00\x02hi" + b"\x07\x00"  # two fields: tag 0 "hi", tag 7 empty
    body = _v9(b"\x02", b"\x02t", b"\x02", struct.pack(">i", 4), b"\x04abc", tags, tags, tags)
    decoded = decode_produce_request(memoryview(body), 9)
    assert as_plain(decoded) == (None, -1, 1000, [("t", [(4, b"abc")])])
    assert as_plain(decoded) == reference_plain(body, 9)
