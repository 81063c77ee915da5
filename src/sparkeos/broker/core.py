"""The broker's state shared by every API handler: storage, coordinators, waiters, durability.

Nothing here knows about sockets; `server.py` feeds decoded requests to the API handlers in
`apis/`, which act on a `Broker`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .acls import SUPPORTED_OPERATIONS, Authorizer
from .coordinator.groups import GroupCoordinator
from .coordinator.producer_ids import ProducerIdManager
from .coordinator.transactions import ONGOING, TransactionCoordinator, TransactionSettings
from .credentials import CredentialStore
from .errors import INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, TRANSACTIONAL_ID_AUTHORIZATION_FAILED
from .listeners import Listener
from .records import HEADER_SIZE, InvalidBatch, parse_header
from .sasl import MECHANISMS
from .storage import cleaner
from .storage.log import AbortedTransaction, PartitionLog
from .storage.topics import InvalidTopic, Topic, TopicStore, validate_topic_name

log = logging.getLogger("sparkeos.broker")

NODE_ID = 0
CLUSTER_ID = "sparkeos-embedded-cluster"
HOUSEKEEPING_INTERVAL_S = 1.0
# How long the log cleaner waits when no partition needs cleaning (Kafka's log.cleaner.backoff.ms).
CLEANER_BACKOFF_S = 1.0


@dataclass
class BrokerConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    advertised_port: int | None = None
    fsync: str = "always"  # "always": sync before acks=-1 is answered; "interval": every fsync_interval_ms
    fsync_interval_ms: int = 1000
    auto_create_topics: bool = True
    num_partitions: int = 1
    max_request_bytes: int = 100 * 1024 * 1024
    # Kafka's queued.max.request.bytes (unbounded there by default): the request bytes read and not yet
    # handled, over all connections; 0 or less is unbounded. Otherwise at least max_request_bytes, as Kafka requires.
    queued_max_request_bytes: int = 256 * 1024 * 1024
    group_initial_rebalance_delay_ms: int = 0
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    offsets_retention_minutes: int = 10080
    # Millisecond-level overrides of offsets.retention.minutes and offsets.retention.check.interval.ms
    # (Kafka's default check interval is 10 minutes); small values make expiry testable.
    offsets_retention_ms: int | None = None
    offsets_retention_check_interval_ms: int = 600000
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    topic_defaults: dict[str, str] = field(default_factory=dict)
    # Kafka's listeners (listeners.py); empty: one PLAINTEXT listener on host:port, advertised as advertised_host
    # and advertised_port. The first listener's bound address is written back to host and port.
    listeners: list[Listener] = field(default_factory=list)
    ssl_certfile: Path | None = None  # the broker's certificate chain (PEM), for SSL and SASL_SSL listeners
    ssl_keyfile: Path | None = None  # its private key (PEM)
    sasl_enabled_mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    authorizer: bool = False  # ACLs decide (acls.py); off, every request is allowed (Kafka without an authorizer)
    super_users: tuple[str, ...] = ()  # principals ACLs never deny, such as User:admin
    allow_everyone_if_no_acl_found: bool = False  # Kafka's setting of that name


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        if 0 < config.queued_max_request_bytes < config.max_request_bytes:
            raise ValueError("queued.max.request.bytes must be larger or equal to socket.request.max.bytes")
        self.config = config
        self.listeners = list(config.listeners) or [
            Listener("PLAINTEXT", config.host, config.port, config.advertised_host, config.advertised_port)]
        if config.listeners and (config.advertised_host or config.advertised_port):
            first = self.listeners[0]
            first.advertised_host, first.advertised_port = config.advertised_host, config.advertised_port
        unknown = [m for m in config.sasl_enabled_mechanisms if m not in MECHANISMS]
        if unknown:
            raise ValueError(f"unsupported SASL mechanisms {', '.join(unknown)}: the broker has "
                             f"{', '.join(MECHANISMS)}")
        if any(listener.tls for listener in self.listeners) and not (config.ssl_certfile and config.ssl_keyfile):
            raise ValueError("an SSL or SASL_SSL listener needs the broker's certificate and key "
                             "(ssl_certfile and ssl_keyfile)")
        data_dir = Path(config.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.store = TopicStore(data_dir / "topics", config.topic_defaults)
        self.credentials = CredentialStore(data_dir)
        self.authorizer = Authorizer(data_dir, config.authorizer, tuple(config.super_users),
                                     config.allow_everyone_if_no_acl_found)
        self.producer_ids = ProducerIdManager(data_dir / "producer-id-block")
        self.groups = GroupCoordinator(data_dir / "groups", config)
        self.transactions = TransactionCoordinator(
            data_dir / "transactions",
            self.producer_ids,
            self,
            TransactionSettings(config.transaction_max_timeout_ms, config.transactional_id_expiration_ms),
        )
        # Parked long-poll fetches by the partition logs they read: an append wakes only these.
        self._append_waiters: dict[PartitionLog, set[asyncio.Future[None]]] = {}
        # Keyed by the log object itself: a recreated topic must not inherit a stale entry.
        self._sync_locks: weakref.WeakKeyDictionary[PartitionLog, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._synced_to: weakref.WeakKeyDictionary[PartitionLog, int] = weakref.WeakKeyDictionary()
        self._sync_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fsync")
        self._housekeeping: asyncio.Task | None = None
        self._cleaning: asyncio.Task | None = None
        # One cleaner thread, as Kafka's log.cleaner.threads: it writes cleaned segments, the event loop swaps them.
        self._cleaner_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-cleaner")
        # Transactions a crash left between their decision and their markers end now.
        self.transactions.recover(int(time.time() * 1000))

    # -- addresses ---------------------------------------------------------------------------

    @property
    def advertised_host(self) -> str:
        """The first listener's address for clients (the bootstrap one)."""
        return self.listeners[0].address[0]

    @property
    def advertised_port(self) -> int:
        return self.listeners[0].address[1]

    # -- authorization -----------------------------------------------------------------------

    def allowed(self, context, operation: int, resource_type: int, name: str) -> bool:
        """Whether the request's principal may do `operation` to the resource (always, with the authorizer off)."""
        return self.authorizer.authorize(context.auth.principal, context.host, operation, resource_type, name)

    def authorized_operations(self, context, resource_type: int, name: str) -> set[int]:
        """The operations Kafka defines on the resource that the request's principal may do (every one, with the
        authorizer off), as the responses that report them carry them (a set of bit positions)."""
        return {op for op in SUPPORTED_OPERATIONS[resource_type] if self.allowed(context, op, resource_type, name)}

    # -- topics ------------------------------------------------------------------------------

    def topic_for_metadata(self, name: str, allow_auto_create: bool = True) -> Topic | None:
        """The topic, auto-created when the broker allows it (raises InvalidTopic on bad names).

        Only Metadata creates topics, as in Kafka: Produce to a topic that does not exist is refused."""
        topic = self.store.get(name)
        if topic is None and allow_auto_create and self.config.auto_create_topics:
            validate_topic_name(name)
            topic = self.store.create(name, self.config.num_partitions)
            log.info("auto-created topic %s with %d partitions", name, self.config.num_partitions)
        return topic

    def check_transactional_produce(self, request, topic: str, partition: int, records) -> None:
        """Transactional batches need the transaction to have added this partition (KIP-890);
        an idempotent write from a producer with an open transaction is refused."""
        if len(records) < HEADER_SIZE:
            return  # storage rejects it with the right error
        header = parse_header(records)
        if header.producer_id < 0:
            return
        txn = self.transactions.for_producer(header.producer_id)
        if not header.is_transactional:
            if txn is not None and txn.state == ONGOING:
                raise InvalidBatch(INVALID_TXN_STATE, f"producer {header.producer_id} has an open transaction")
            return
        if txn is not None and header.producer_epoch < txn.producer_epoch:
            raise InvalidBatch(INVALID_PRODUCER_EPOCH, f"producer {header.producer_id} epoch "
                                                       f"{header.producer_epoch} has been fenced")
        if self.authorizer.enabled and txn is not None and txn.transactional_id != request.transactional_id:
            raise InvalidBatch(TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                               f"producer {header.producer_id} is not the producer of {request.transactional_id!r}")
        if txn is None or txn.state != ONGOING or (topic, partition) not in txn.partitions:
            raise InvalidBatch(
                INVALID_TXN_STATE, f"transactional produce to {topic}-{partition} outside a transaction"
            )

    def last_stable_offset(self, topic: str, partition: int, partition_log: PartitionLog) -> int:
        return partition_log.last_stable_offset

    def aborted_transactions(self, partition_log: PartitionLog, fetch_offset: int,
                             records: bytes) -> list[AbortedTransaction]:
        """Aborted transactions overlapping the records a read_committed fetch returns."""
        if not records:
            return []
        return partition_log.aborted_between(fetch_offset, _end_offset_of(records))

    # -- TransactionEffects --------------------------------------------------------------------

    def partition_exists(self, topic: str, partition: int) -> bool:
        return self.store.partition(topic, partition) is not None

    def write_markers(self, partitions: list[tuple[str, int]], producer_id: int, producer_epoch: int,
                      commit: bool, sync: bool = True) -> None:
        written = []
        for topic, index in partitions:
            partition_log = self.store.partition(topic, index)
            if partition_log is not None:  # a deleted topic needs no marker
                partition_log.write_marker(producer_id, producer_epoch, commit, sync=sync)
                written.append(partition_log)
        self.notify_appended(written)

    async def sync_markers(self, partitions: list[tuple[str, int]]) -> None:
        for topic, index in partitions:
            partition_log = self.store.partition(topic, index)
            if partition_log is None:
                continue
            try:
                # Whatever --fsync says: the Complete record must never reach the disk before a marker.
                await self.make_durable(partition_log, always=True)
            except OSError:
                if self.store.partition(topic, index) is partition_log:
                    raise  # a real I/O error; a topic deleted under the fsync needs no marker

    def open_transactions(self) -> list[tuple[tuple[str, int], int, int]]:
        found = []
        for topic in self.store.topics.values():
            for index, partition_log in enumerate(topic.partitions):
                producers = partition_log.producers
                for producer_id in producers.open_transactions:
                    entry = producers.producers.get(producer_id)
                    found.append(((topic.name, index), producer_id, entry.epoch if entry is not None else 0))
        return found

    def complete_group_offsets(self, group: str, producer_id: int, commit: bool) -> None:
        self.groups.complete_transaction(group, producer_id, commit)

    def partition(self, topic: str, partition: int) -> PartitionLog | None:
        return self.store.partition(topic, partition)

    # -- waiting for data --------------------------------------------------------------------

    def notify_appended(self, partition_logs: Iterable[PartitionLog] | None = None) -> None:
        """Wake the fetches parked on these partitions (every parked fetch when None)."""
        if partition_logs is None:
            woken = list(self._append_waiters.values())
            self._append_waiters = {}
        else:
            woken = [self._append_waiters.pop(p) for p in partition_logs if p in self._append_waiters]
        for waiters in woken:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait_for_append(self, timeout: float, partition_logs: list[PartitionLog]) -> None:
        """Return after `timeout` seconds, or sooner when one of `partition_logs` changes."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for partition_log in partition_logs:
            self._append_waiters.setdefault(partition_log, set()).add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            for partition_log in partition_logs:
                waiters = self._append_waiters.get(partition_log)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._append_waiters[partition_log]

    # -- durability --------------------------------------------------------------------------

    async def make_durable(self, partition_log: PartitionLog, always: bool = False) -> None:
        """fsync the partition before an acks=-1 answer; concurrent callers share one fsync.

        With fsync=interval only `always` callers sync here."""
        if self.config.fsync != "always" and not always:
            return
        target = partition_log.log_end_offset
        lock = self._sync_locks.setdefault(partition_log, asyncio.Lock())
        async with lock:
            if self._synced_to.get(partition_log, -1) >= target:
                return
            loop = asyncio.get_running_loop()
            self._synced_to[partition_log] = await loop.run_in_executor(self._sync_pool, partition_log.sync)

    # -- lifecycle ---------------------------------------------------------------------------

    def start_background(self) -> None:
        self._housekeeping = asyncio.get_running_loop().create_task(self._housekeep())
        self._cleaning = asyncio.get_running_loop().create_task(self._clean())

    async def _clean(self) -> None:
        """The log cleaner: one compaction pass at a time, over the partitions of compacted topics that are dirty
        enough (storage/cleaner.py)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(CLEANER_BACKOFF_S)
            for topic in list(self.store.topics.values()):
                for index, partition_log in enumerate(list(topic.partitions)):
                    try:
                        await self._clean_partition(loop, topic.name, index, partition_log)
                    except Exception:  # the cleaner must never stop serving
                        log.exception("cleaning %s-%d failed", topic.name, index)

    async def _clean_partition(self, loop: asyncio.AbstractEventLoop, topic: str, index: int,
                               partition_log: PartitionLog) -> None:
        """One pass over a partition, if it is dirty enough: written on the cleaner's thread, swapped in here."""
        plan = partition_log.plan_cleaning(int(time.time() * 1000))
        if plan is None:
            return
        try:
            await loop.run_in_executor(self._cleaner_pool, cleaner.write, plan)
        except BaseException:
            cleaner.abandon(plan)
            raise
        if self.store.partition(topic, index) is not partition_log:  # deleted meanwhile
            cleaner.abandon(plan)
        elif partition_log.finish_cleaning(plan):
            log.info("cleaned %s-%d: %d records removed, %d -> %d bytes", topic, index, plan.records_removed,
                     plan.bytes_before, plan.bytes_after)

    async def _housekeep(self) -> None:
        interval_sync = self.config.fsync == "interval"
        sync_every_s = self.config.fsync_interval_ms / 1000
        tick_s = min(HOUSEKEEPING_INTERVAL_S, sync_every_s) if interval_sync else HOUSEKEEPING_INTERVAL_S
        last_sync = time.monotonic()
        while True:
            await asyncio.sleep(tick_s)
            try:
                now_ms = int(time.time() * 1000)
                for topic in list(self.store.topics.values()):
                    for partition_log in topic.partitions:
                        partition_log.apply_retention(now_ms)
                self.groups.expire(now_ms)
                self.transactions.expire(now_ms)
                if interval_sync and time.monotonic() - last_sync >= sync_every_s:
                    last_sync = time.monotonic()
                    await self._sync_all()
            except Exception:  # housekeeping must never stop serving
                log.exception("housekeeping failed")

    async def _sync_all(self) -> None:
        loop = asyncio.get_running_loop()
        logs = [p for t in list(self.store.topics.values()) for p in t.partitions]
        await loop.run_in_executor(self._sync_pool, lambda: [p.sync() for p in logs])

    async def close(self) -> None:
        for task in (self._housekeeping, self._cleaning):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._cleaner_pool.shutdown(wait=True)
        await self.transactions.wait_all_completed()
        self._sync_pool.shutdown(wait=True)
        self.groups.close()
        self.transactions.close()
        self.store.close()


def _end_offset_of(records: bytes) -> int:
    """The offset after the last whole batch in a fetch's records."""
    position = 0
    last = None
    while position + HEADER_SIZE <= len(records):
        last = position
        position += int.from_bytes(records[position + 8 : position + 12], "big") + 12
    return parse_header(records, last).next_offset if last is not None else 0


__all__ = ["Broker", "BrokerConfig", "InvalidTopic", "NODE_ID", "CLUSTER_ID"]
