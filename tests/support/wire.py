"""A tiny raw Kafka-protocol client for tests: exact requests over a plain socket.

Real clients hide retries, batching and sequence numbers; the tests that check the broker's
answer to one precise request (a duplicate batch, a corrupt CRC, a bad frame) use this
instead. Message bodies are encoded and decoded with kafka-python's `kafka.protocol` classes.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from sparkeos.broker.embedded import READY_PREFIX

PRODUCE_VERSION = 8
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


def split_address(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.rpartition(":")
    return host, int(port)


class ConnectionClosed(Exception):
    """The broker closed the connection (as Kafka does on requests it cannot parse)."""


class WireClient:
    """One TCP connection to the broker; requests are answered in order."""

    def __init__(self, bootstrap: str, timeout: float = 10.0, client_id: str = "wire-test") -> None:
        self.address = split_address(bootstrap)
        self.client_id = client_id
        self.timeout = timeout
        self.sock = socket.create_connection(self.address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._correlation_id = 0

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- framing -----------------------------------------------------------------------------

    def next_correlation_id(self) -> int:
        self._correlation_id += 1
        return self._correlation_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes:
        """One response frame (without its size prefix); ConnectionClosed at EOF."""
        (size,) = struct.unpack(">i", self._read_exactly(4))
        return self._read_exactly(size)

    def _read_exactly(self, count: int) -> bytes:
        chunks = []
        remaining = count
        while remaining:
            try:
                chunk = self.sock.recv(remaining)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise ConnectionClosed(f"connection closed with {remaining} of {count} bytes unread")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def is_closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True once the broker closes the connection; False if it is still open after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not data:
                return True
        self.sock.settimeout(self.timeout)
        return False

    # -- typed requests ----------------------------------------------------------------------

    def send(self, request: Any, version: int) -> int:
        """Encode and send `request` at `version` with a proper header; returns its correlation id."""
        correlation_id = self.next_correlation_id()
        request.with_header(correlation_id=correlation_id, client_id=self.client_id)
        self.send_raw(bytes(request.encode(version=version, header=True, framed=True)))
        return correlation_id

    def receive(self, response_class: type, version: int, correlation_id: int) -> Any:
        payload = self.read_frame()
        response = response_class.decode(payload, version=version, header=True)
        got = response.header.correlation_id
        if got != correlation_id:
            raise AssertionError(f"correlation id {got} answers request {correlation_id}")
        return response

    def request(self, request: Any, response_class: type, version: int) -> Any:
        return self.receive(response_class, version, self.send(request, version))

    # -- helpers for the APIs the tests use ----------------------------------------------------

    def api_versions(self, version: int = 0) -> Any:
        return self.request(ApiVersionsRequest(), ApiVersionsResponse, version)

    def metadata(self, topics: list[str] | None, version: int = 4, allow_auto_create: bool = True) -> Any:
        wanted = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
        request = MetadataRequest(topics=wanted, allow_auto_topic_creation=allow_auto_create)
        return self.request(request, MetadataResponse, version)

    def init_producer_id(self, version: int = 1) -> tuple[int, int]:
        request = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)
        response = self.request(request, InitProducerIdResponse, version)
        if response.error_code != 0:
            raise AssertionError(f"InitProducerId failed with error {response.error_code}")
        return response.producer_id, response.producer_epoch

    def produce(self, topic: str, partition: int, records: bytes, acks: int = -1,
                version: int = PRODUCE_VERSION) -> Any:
        """One partition's Produce; returns that partition's response."""
        request = produce_request(topic, partition, records, acks)
        response = self.request(request, ProduceResponse, version)
        return response.responses[0].partition_responses[0]

    def log_end_offset(self, topic: str, partition: int, version: int = 1) -> int:
        return self._list_offset(topic, partition, LATEST_TIMESTAMP, version)

    def log_start_offset(self, topic: str, partition: int, version: int = 1) -> int:
        return self._list_offset(topic, partition, EARLIEST_TIMESTAMP, version)

    def _list_offset(self, topic: str, partition: int, timestamp: int, version: int) -> int:
        Topic = ListOffsetsRequest.ListOffsetsTopic
        request = ListOffsetsRequest(
            replica_id=-1,
            topics=[Topic(name=topic, partitions=[
                Topic.ListOffsetsPartition(partition_index=partition, timestamp=timestamp)
            ])],
        )
        response = self.request(request, ListOffsetsResponse, version)
        answer = response.topics[0].partitions[0]
        if answer.error_code != 0:
            raise AssertionError(f"ListOffsets failed with error {answer.error_code}")
        return answer.offset

    def log_batches(self, topic: str, partition: int = 0) -> list[LoggedBatch]:
        """Every record batch of a partition as the log holds it, read uncommitted from offset 0 to its end:
        what no consumer shows, whether a batch was written inside a transaction and by which producer."""
        end = self.log_end_offset(topic, partition)
        batches: list[LoggedBatch] = []
        position = 0
        while position < end:
            records = self._fetch_uncommitted(topic, partition, position)
            if not records:
                raise AssertionError(f"{topic}-{partition} returned nothing at offset {position} of {end}")
            memory = MemoryRecords(records)
            while (batch := memory.next_batch()) is not None:
                batches.append(LoggedBatch(
                    batch.base_offset, batch.is_transactional, batch.is_control_batch, batch.producer_id,
                    batch.producer_epoch, [record.value for record in batch], batch.compression_type,
                ))
                position = batch.base_offset + batch.last_offset_delta + 1
        return batches

    def _fetch_uncommitted(self, topic: str, partition: int, offset: int) -> bytes:
        FetchTopic = FetchRequest.FetchTopic
        request = FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 22, isolation_level=0,
            topics=[FetchTopic(topic=topic, partitions=[
                FetchTopic.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=1 << 22)
            ])],
        )
        # v10 at least: Kafka refuses to send zstd batches to older fetches (UNSUPPORTED_COMPRESSION_TYPE).
        answer = self.request(request, FetchResponse, 11).responses[0].partitions[0]
        if answer.error_code != 0:
            raise AssertionError(f"Fetch of {topic}-{partition} at {offset} failed with error {answer.error_code}")
        return bytes(answer.records or b"")


@dataclass(frozen=True)
class LoggedBatch:
    base_offset: int
    transactional: bool
    control: bool  # a transaction marker; its one record's value is not the data
    producer_id: int
    producer_epoch: int
    values: list[bytes | None]
    codec: int = 0  # the batch's compression: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd


def produce_request(topic: str, partition: int, records: bytes, acks: int = -1) -> Any:
    TopicData = ProduceRequest.TopicProduceData
    return ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout_ms=10000,
        topic_data=[TopicData(name=topic, partition_data=[
            TopicData.PartitionProduceData(index=partition, records=records)
        ])],
    )


def build_batch(values: list[bytes], producer_id: int = -1, producer_epoch: int = -1,
                base_sequence: int = -1, transactional: bool = False) -> bytes:
    """A v2 record batch as a producer would send it (base offset 0, CRC computed)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=transactional, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, batch_size=1 << 20,
    )
    for delta, value in enumerate(values):
        builder.append(delta, timestamp=None, key=None, value=value, headers=[])
    return bytes(builder.build())


def request_frame(api_key: int, api_version: int, correlation_id: int, body: bytes,
                  client_id: bytes | None = b"wire-test", flexible_header: bool = False) -> bytes:
    """A hand-made request frame: header v1 (v2 adds an empty tagged-field section) + body."""
    if client_id is None:
        header = struct.pack(">hhih", api_key, api_version, correlation_id, -1)
    else:
        header = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id
    if flexible_header:
        header += b"\x00"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def start_logged_broker(data_dir: Path, stderr_path: Path) -> tuple[subprocess.Popen, str]:
    """`sparkeos broker` as a child process logging at INFO into `stderr_path`; (process, bootstrap address)."""
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "sparkeos", "broker", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0",
             "--log-level", "INFO"],
            stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith(READY_PREFIX), f"broker did not start: {line!r}"
    return process, line[len(READY_PREFIX):].strip()


def stop_logged_broker(process: subprocess.Popen) -> None:
    """Stop a broker of `start_logged_broker`: SIGTERM, then SIGKILL if it does not exit within 30 s."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
