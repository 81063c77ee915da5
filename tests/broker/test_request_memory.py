"""Request memory is bounded across connections (Kafka's queued.max.request.bytes), and a large
request costs memory only as its bytes arrive."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from kafka.protocol.producer import ProduceResponse

from sparkeos.broker import BrokerProcess, EmbeddedBroker
from support.wire import WireClient, build_batch, produce_request, split_address

MIB = 1024 * 1024


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _produce_frame(topic: str, value_bytes: int, correlation_id: int) -> bytes:
    request = produce_request(topic, 0, build_batch([b"p" * value_bytes]))
    request.with_header(correlation_id=correlation_id, client_id="memory")
    return bytes(request.encode(version=8, header=True, framed=True))


def test_announced_requests_cost_only_the_bytes_sent(tmp_path: Path) -> None:
    """Eight connections announce requests of 99 MiB and send 1 MiB of each: the broker's memory grows by
    about what it received, not by what was announced, and a well-behaved client is answered meanwhile."""
    with BrokerProcess(tmp_path / "broker", extra_args=["--queued-max-request-bytes", str(1024 * MIB)]) as broker:
        assert broker.process is not None
        address = split_address(broker.bootstrap_servers)
        with WireClient(broker.bootstrap_servers) as client:
            client.metadata(["t-memory"])
        time.sleep(0.5)
        before = _rss_bytes(broker.process.pid)
        peers = []
        try:
            for _ in range(8):
                peer = socket.create_connection(address, timeout=10)
                peer.sendall(struct.pack(">i", 99 * MIB) + bytes(MIB))
                peers.append(peer)
            time.sleep(1.0)
            grown = _rss_bytes(broker.process.pid) - before
            # 8 MiB received; buffers grow by doubling, so at most about twice that is held.
            assert grown < 40 * MIB, f"the broker grew by {grown / MIB:.0f} MiB for 8 MiB received"
            with WireClient(broker.bootstrap_servers) as client:
                assert client.api_versions(0).error_code == 0
                assert client.produce("t-memory", 0, build_batch([b"small"])).error_code == 0
        finally:
            for peer in peers:
                peer.close()


def test_large_requests_wait_for_memory_and_small_ones_do_not(tmp_path: Path) -> None:
    """With room for about two large requests, a third waits until one of them has been handled; small
    requests are read all the while."""
    frame_bytes = 700 * 1024
    with EmbeddedBroker(tmp_path / "broker", max_request_bytes=MIB, queued_max_request_bytes=MIB) as broker:
        address = split_address(broker.bootstrap_servers)
        with WireClient(broker.bootstrap_servers) as client:
            client.metadata(["t-wait"])
        frames = [_produce_frame("t-wait", frame_bytes, n) for n in range(3)]
        first = socket.create_connection(address, timeout=10)
        second = socket.create_connection(address, timeout=10)
        try:
            # The first is let in (nothing is held), and holds 700 KiB while it is still arriving.
            first.sendall(frames[0][: len(frames[0]) // 2])
            time.sleep(0.2)
            # The second is let in too (700 KiB < 1 MiB: Kafka's pool lets a request in while any room is left).
            second.sendall(frames[1][: len(frames[1]) // 2])
            time.sleep(0.2)
            third = socket.create_connection(address, timeout=10)
            third_answer: list[bytes] = []
            sender = threading.Thread(target=lambda: third.sendall(frames[2]), daemon=True)
            sender.start()
            reader = threading.Thread(target=lambda: third_answer.append(_read_frame(third)), daemon=True)
            reader.start()
            reader.join(1.0)
            assert not third_answer, "a large request was read while the memory bound was reached"
            with WireClient(broker.bootstrap_servers) as client:  # small requests still flow
                assert client.api_versions(0).error_code == 0
                assert client.produce("t-wait", 0, build_batch([b"small"])).error_code == 0
            # The first completes and is answered; the memory it held lets the third in.
            first.sendall(frames[0][len(frames[0]) // 2 :])
            assert struct.unpack(">i", _read_frame(first)[:4])[0] == 0
            reader.join(10.0)
            assert third_answer and struct.unpack(">i", third_answer[0][:4])[0] == 2
            second.sendall(frames[1][len(frames[1]) // 2 :])
            assert struct.unpack(">i", _read_frame(second)[:4])[0] == 1
            sender.join(10.0)
            third.close()
        finally:
            first.close()
            second.close()
        with WireClient(broker.bootstrap_servers) as client:
            assert client.log_end_offset("t-wait", 0) == 4


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def test_a_frame_cut_off_mid_way_gives_its_memory_back(tmp_path: Path) -> None:
    """Peers that announce a large request and vanish leave nothing held: the next large ones are read."""
    with EmbeddedBroker(tmp_path / "broker", max_request_bytes=MIB, queued_max_request_bytes=MIB) as broker:
        address = split_address(broker.bootstrap_servers)
        with WireClient(broker.bootstrap_servers) as client:
            client.metadata(["t-gone"])
        for _ in range(5):
            with socket.create_connection(address, timeout=10) as peer:
                peer.sendall(struct.pack(">i", MIB - 10) + bytes(200 * 1024))
        with WireClient(broker.bootstrap_servers, timeout=10) as client:
            request = produce_request("t-gone", 0, build_batch([b"x" * 900 * 1024]))
            answer = client.request(request, ProduceResponse, 8)
            assert answer.responses[0].partition_responses[0].error_code == 0


def test_the_bound_is_a_broker_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="queued.max.request.bytes"):
        EmbeddedBroker(tmp_path / "bad", max_request_bytes=10 * MIB, queued_max_request_bytes=MIB).start()
    with EmbeddedBroker(tmp_path / "broker", queued_max_request_bytes=300 * MIB) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        resource = ConfigResource(ResourceType.BROKER, "0")
        configs = admin.describe_configs([resource])[resource].result(30)
        assert configs["queued.max.request.bytes"].value == str(300 * MIB)
        assert configs["socket.request.max.bytes"].value == str(100 * MIB)
