"""The hand-written Fetch response encoder is byte-for-byte kafka-python's, for every version we serve."""

from __future__ import annotations

import os

import pytest
from kafka.protocol.consumer import FetchResponse

from sparkeos.broker.fetch_encoding import SMALL_RECORDS, FetchedPartition, FetchResult

TopicResponse = FetchResponse.FetchableTopicResponse
PartitionData = TopicResponse.PartitionData

VERSIONS = range(4, 13)


def reference_encoding(result: FetchResult, version: int) -> bytes:
    """The same response built and encoded by kafka-python's generic schema encoder."""
    topics = []
    for name, partitions in result.topics:
        datas = []
        for p in partitions:
            aborted = None
            if p.aborted_transactions is not None:
                aborted = [
                    PartitionData.AbortedTransaction(producer_id=pid, first_offset=first)
                    for pid, first in p.aborted_transactions
                ]
            datas.append(
                PartitionData(
                    partition_index=p.partition_index,
                    error_code=p.error_code,
                    high_watermark=p.high_watermark,
                    last_stable_offset=p.last_stable_offset,
                    log_start_offset=p.log_start_offset,
                    aborted_transactions=aborted,
                    records=bytes(p.records),
                )
            )
        topics.append(TopicResponse(topic=name, partitions=datas))
    response = FetchResponse(
        throttle_time_ms=result.throttle_time_ms,
        error_code=result.error_code,
        session_id=result.session_id,
        responses=topics,
    )
    return bytes(response.encode(version=version))


def encoded(result: FetchResult, version: int) -> bytes:
    return b"".join(bytes(part) for part in result.encode_buffers(version))


def data_partition(index: int, records: bytes | memoryview, aborted: list[tuple[int, int]] | None) -> FetchedPartition:
    return FetchedPartition(
        partition_index=index,
        error_code=0,
        high_watermark=1_000_000 + index,
        last_stable_offset=999_000 + index,
        log_start_offset=index * 7,
        aborted_transactions=aborted,
        records=records,
    )


CASES = {
    "empty response": FetchResult(topics=[]),
    "session not found": FetchResult(topics=[], error_code=70),
    "unknown partition": FetchResult(
        topics=[
            ("missing", [FetchedPartition(partition_index=3, error_code=3, high_watermark=-1, aborted_transactions=[])])
        ]
    ),
    "offset out of range": FetchResult(
        topics=[
            (
                "t",
                [
                    FetchedPartition(
                        partition_index=0,
                        error_code=1,
                        high_watermark=50,
                        last_stable_offset=40,
                        log_start_offset=10,
                        aborted_transactions=[],
                    )
                ],
            )
        ]
    ),
    "read_uncommitted small records": FetchResult(topics=[("orders", [data_partition(0, b"abc" * 10, None)])]),
    "read_committed no aborts": FetchResult(topics=[("orders", [data_partition(0, b"r" * 100, [])])]),
    "read_committed with aborts": FetchResult(
        topics=[
            (
                "orders",
                [
                    data_partition(0, os.urandom(SMALL_RECORDS * 3), [(7, 0), (9, 120), (2**40, 2**33)]),
                ],
            )
        ]
    ),
    "large records as a view": FetchResult(
        topics=[
            (
                "big",
                [
                    data_partition(0, memoryview(os.urandom(SMALL_RECORDS * 300))[5:-5], None),
                ],
            )
        ]
    ),
    "empty records": FetchResult(topics=[("quiet", [data_partition(0, b"", None)])]),
    "many topics and partitions": FetchResult(
        topics=[
            (
                f"topic-{t}",
                [
                    data_partition(
                        p,
                        os.urandom(SMALL_RECORDS + 1) if p % 3 == 0 else b"x" * p,
                        [(p, p * 2)] * (p % 4) if p % 2 else None,
                    )
                    for p in range(70)
                ],
            )
            for t in range(3)
        ]
        + [
            (
                "errors",
                [
                    FetchedPartition(
                        partition_index=i,
                        error_code=74,
                        high_watermark=5,
                        last_stable_offset=5,
                        log_start_offset=0,
                        aborted_transactions=[],
                    )
                    for i in range(140)
                ],
            )
        ]
    ),
    "long topic name": FetchResult(
        topics=[("n" * 249, [data_partition(1, b"z" * 200, [])])], throttle_time_ms=12, session_id=0
    ),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_kafka_python_encoder(case: str, version: int) -> None:
    result = CASES[case]
    assert encoded(result, version) == reference_encoding(result, version)


def test_large_records_are_passed_through_not_copied() -> None:
    records = memoryview(os.urandom(SMALL_RECORDS * 10))
    result = FetchResult(topics=[("t", [data_partition(0, records, None), data_partition(1, records, [])])])
    for version in VERSIONS:
        parts = result.encode_buffers(version)
        assert sum(1 for part in parts if part is records) == 2
        # Everything between the record buffers is a few joined fields, not many small writes.
        assert len(parts) == 5


@pytest.mark.parametrize("version", [3, 13])
def test_versions_outside_4_to_12_are_refused(version: int) -> None:
    with pytest.raises(ValueError):
        FetchResult(topics=[]).encode_buffers(version)
