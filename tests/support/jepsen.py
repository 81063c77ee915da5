"""A Jepsen-style transactional workload against the broker, and the checker of its history.

The checks follow Jepsen's Kafka workload (jepsen/src/jepsen/tests/kafka.clj): clients record what they asked and
what they were told, and a checker looks for anomalies in that history alone. A key is one topic-partition;
every value written is unique and names the transaction that wrote it.

Writers are transactional producers (confluent-kafka), each with its own transactional.id. A transaction writes
a few values to a few keys and then commits, or aborts on purpose. Its outcome is recorded as Jepsen does:

- "ok": commit_transaction returned; every value must be read, exactly once;
- "info" (indeterminate): commit was asked for and did not return OK (an error, a timeout); the transaction may be
  visible or not, but only whole;
- "fail": commit was never asked for (aborted on purpose, broken off by an error, or fenced by a newer producer of
  the same transactional.id before its commit); nothing of it may be read.

After any transaction that did not commit cleanly the producer is closed and a new one with the same
transactional.id is made, whose init_transactions bumps the epoch and ends what the old one left open. Reusing a
producer after an abort is unsafe with librdkafka: when a Produce answer was lost, the next transaction's first
batch gets the aborted batch's sequence numbers, the broker (as Kafka) answers it as a duplicate of the aborted
batch, and a committed record is lost.

Readers are read_committed consumers, some assigned partitions by hand (with seeks now and then), some subscribed
in one consumer group (rebalancing as members come and go). Every poll is recorded, with the resets that make a
consumer's position jump on purpose (assign, seek, rebalance, a new consumer). At the end one fresh
read_committed consumer and one read_uncommitted consumer read every partition to its end.

Anomalies (the checker's counts; a correct broker and client give zero of each):

- aborted_read (Jepsen's G1a): a read_committed reader saw a value of a "fail" transaction;
- lost_write: a value of an "ok" transaction that no read_committed reader saw, though one read the key past it
  (or to its end in the final read);
- torn_transaction: some but not all values of a transaction were seen by read_committed readers;
- duplicate: one value at two offsets (or two keys);
- inconsistent_offset: one offset of a key read (or acknowledged) with two different values;
- nonmonotonic_poll: a consumer read an offset of a key at or below one it read before, with no reset between;
- poll_skip: a consumer's successive reads of a key jumped over a committed value, with no reset between;
- nonmonotonic_send (internal and external order): the committed values one transactional.id wrote to a key
  are not in the log in the order it sent them;
- phantom: a value read that no transaction wrote.

Faults come from a `FaultInjector`: the broker as a child process `kill -9`ed and restarted, and the fault proxy
(sparkeos.chaos.proxy) between all clients and the broker dropping Produce, EndTxn and AddPartitionsToTxn answers,
refusing connections for a while, delaying and splitting frames.
"""

from __future__ import annotations

import bisect
import logging
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sparkeos.broker import BrokerProcess
from sparkeos.chaos.proxy import TcpProxy
from sparkeos.ports import free_port
from sparkeos.verify import READ_COMMITTED, READ_UNCOMMITTED, read_records

log = logging.getLogger(__name__)

Key = Hashable  # a topic-partition: (topic, partition) in the workload, anything hashable in hand-made histories

OK, INFO, FAIL = "ok", "info", "fail"
ANOMALIES = ("aborted_read", "lost_write", "torn_transaction", "duplicate", "inconsistent_offset",
             "nonmonotonic_poll", "poll_skip", "nonmonotonic_send", "phantom")

PRODUCE, ADD_PARTITIONS_TO_TXN, END_TXN = 0, 24, 26
FAULT_KINDS = ("kill", "drop_produce", "drop_end_txn", "drop_add_partitions", "refuse", "delay", "split")
PROXY_FAULTS = FAULT_KINDS[1:]


# --- history ------------------------------------------------------------------------------------


@dataclass
class Txn:
    """One transaction as its writer saw it: the (key, value) pairs in the order it produced them, the offsets
    its delivery reports gave, and its outcome (ok, info or fail; None while it runs)."""

    writer: str  # the transactional.id: transactions of one writer run one after another
    number: int
    writes: list[tuple[Key, str]]
    outcome: str | None = None
    why: str = ""  # what made it end as it did (committed, aborted, fenced, an error)
    offsets: dict[str, int] = field(default_factory=dict)  # value -> offset from its delivery report


@dataclass
class Poll:
    """Records one consumer session got from one poll, in order: (key, offset, value)."""

    records: list[tuple[Key, int, str]]


@dataclass
class Reset:
    """The consumer's position on `keys` moves on purpose (assign, seek, rebalance): the next read of such a key
    need not follow the last one."""

    keys: frozenset[Key]


@dataclass
class History:
    txns: list[Txn] = field(default_factory=list)
    # Each read_committed consumer session's polls and resets, in its order; sessions of one thread get their
    # own names, since a new consumer starts from wherever it is assigned.
    sessions: dict[str, list[Poll | Reset]] = field(default_factory=dict)
    final_committed: list[tuple[Key, int, str]] = field(default_factory=list)
    final_uncommitted: list[tuple[Key, int, str]] = field(default_factory=list)
    final_keys: set[Key] = field(default_factory=set)  # keys the final reads read to their end


@dataclass
class Analysis:
    counts: dict[str, int]  # anomaly -> how many; zero for each of ANOMALIES when the history is correct
    examples: dict[str, list[Any]]  # anomaly -> a few cases, for the failure message
    stats: dict[str, int]  # what the history holds: transactions by outcome, records read, ...

    @property
    def anomalies(self) -> dict[str, int]:
        return {name: count for name, count in self.counts.items() if count}


# --- checker ------------------------------------------------------------------------------------


def check(history: History, examples: int = 5) -> Analysis:
    """Count each anomaly of ANOMALIES in `history`."""
    found: dict[str, list[Any]] = {name: [] for name in ANOMALIES}
    writer_of = {value: txn for txn in history.txns for _key, value in txn.writes}

    committed_reads: list[tuple[Key, int, str]] = [
        record for events in history.sessions.values() for event in events if isinstance(event, Poll)
        for record in event.records
    ] + list(history.final_committed)
    seen = {value for _key, _offset, value in committed_reads}
    read_bound: dict[Key, int] = {}
    for key, offset, _value in committed_reads:
        read_bound[key] = max(read_bound.get(key, -1), offset)

    # A transaction is visible if any reader saw any of its values; "info" ones (and any left without an
    # outcome) are judged by that.
    visible = {id(txn) for txn in history.txns if any(value in seen for _key, value in txn.writes)}

    def committed(txn: Txn) -> bool:
        return txn.outcome == OK or (txn.outcome != FAIL and id(txn) in visible)

    # Everything known of the log: reads at both isolation levels, and the offsets acknowledged to writers of
    # committed transactions. (key, offset) -> values, and value -> (key, offset)s.
    at: dict[tuple[Key, int], set[str]] = defaultdict(set)
    places: dict[str, set[tuple[Key, int]]] = defaultdict(set)
    for key, offset, value in [*committed_reads, *history.final_uncommitted]:
        at[(key, offset)].add(value)
        places[value].add((key, offset))
    for txn in history.txns:
        if committed(txn):
            for key, value in txn.writes:
                if value in txn.offsets:
                    at[(key, txn.offsets[value])].add(value)
                    places[value].add((key, txn.offsets[value]))
    # The order of each key as read_committed readers saw it: offset -> value, values of committed writers only.
    read_order: dict[Key, dict[int, str]] = defaultdict(dict)
    for key, offset, value in committed_reads:
        if value in writer_of and committed(writer_of[value]):
            read_order[key].setdefault(offset, value)

    for (key, offset), values in at.items():
        if len(values) > 1:
            found["inconsistent_offset"].append((key, offset, sorted(values)))
    for value, where in places.items():
        if len(where) > 1:
            found["duplicate"].append((value, sorted(where, key=repr)))

    for value in sorted(seen):
        txn = writer_of.get(value)
        if txn is None:
            found["phantom"].append(value)
        elif txn.outcome == FAIL:
            found["aborted_read"].append((value, txn.writer, txn.number, txn.why))

    for txn in history.txns:
        values = [value for _key, value in txn.writes]
        seen_here = [value for value in values if value in seen]
        if 0 < len(seen_here) < len(values):
            found["torn_transaction"].append((txn.writer, txn.number, txn.outcome, f"{len(seen_here)}/{len(values)}"))
        if txn.outcome != OK:
            continue
        for key, value in txn.writes:
            if value in seen:
                continue
            offset = txn.offsets.get(value)
            if key in history.final_keys or (offset is not None and offset <= read_bound.get(key, -1)):
                found["lost_write"].append((value, key, offset))

    # Per consumer session: offsets of a key only go up between resets, and never jump over a committed value.
    offsets_of = {key: sorted(order) for key, order in read_order.items()}
    for session, events in history.sessions.items():
        last: dict[Key, int] = {}
        for event in events:
            if isinstance(event, Reset):
                for key in event.keys:
                    last.pop(key, None)
                continue
            for key, offset, _value in event.records:
                before = last.get(key)
                last[key] = offset
                if before is None:
                    continue
                if offset <= before:
                    found["nonmonotonic_poll"].append((session, key, before, offset))
                    continue
                known = offsets_of.get(key, [])
                skipped = known[bisect.bisect_right(known, before) : bisect.bisect_left(known, offset)]
                if skipped:
                    found["poll_skip"].append((session, key, before, offset, [read_order[key][o] for o in skipped[:3]]))

    # Each writer's committed values reach each key in the order it sent them.
    position = {value: offset for order in read_order.values() for offset, value in order.items()}
    last_sent: dict[tuple[str, Key], tuple[str, int]] = {}
    for txn in history.txns:
        if not committed(txn):
            continue
        for key, value in txn.writes:
            offset = position.get(value)
            if offset is None:
                continue
            previous = last_sent.get((txn.writer, key))
            if previous is not None and offset <= previous[1]:
                found["nonmonotonic_send"].append((txn.writer, key, previous, (value, offset)))
            last_sent[(txn.writer, key)] = (value, offset)

    outcomes = Counter(txn.outcome for txn in history.txns)
    info_visible = sum(1 for txn in history.txns if txn.outcome == INFO and id(txn) in visible)
    uncommitted_values = {value for _key, _offset, value in history.final_uncommitted}
    stats = {
        "txns": len(history.txns),
        "ok": outcomes[OK],
        "info": outcomes[INFO],
        "info_visible": info_visible,
        "fail": outcomes[FAIL],
        "fenced": sum(1 for txn in history.txns if txn.why == "fenced"),
        "values_written": len(writer_of),
        "records_polled": len(committed_reads) - len(history.final_committed),
        "records_final_committed": len(history.final_committed),
        "records_final_uncommitted": len(history.final_uncommitted),
        # Aborted values the log holds: without them the aborted-read check had nothing to catch.
        "aborted_values_in_log": sum(1 for value in uncommitted_values
                                     if value in writer_of and not committed(writer_of[value])),
        "consumer_sessions": len(history.sessions),
        "resets": sum(1 for events in history.sessions.values() for event in events if isinstance(event, Reset)),
    }
    return Analysis(counts={name: len(cases) for name, cases in found.items()},
                    examples={name: cases[:examples] for name, cases in found.items() if cases}, stats=stats)


# --- the workload -------------------------------------------------------------------------------


@dataclass
class WorkloadConfig:
    seconds: float = 20.0
    producers: int = 3
    consumers: int = 3  # the first half assign partitions, the rest subscribe in one group
    topics: int = 2
    partitions: int = 3
    faults: tuple[str, ...] = FAULT_KINDS
    fault_interval_s: tuple[float, float] = (0.4, 1.2)
    abort_probability: float = 0.2
    fence_probability: float = 0.04
    abort_wait_s: float = 0.05  # an abort comes up to this long after the transaction's records were produced
    seed: int = 0
    commit_timeout_s: float = 4.0  # below socket.timeout.ms: a commit whose answer is withheld ends "info"
    socket_timeout_ms: int = 6000


class Workload:
    """The broker as a child process behind the fault proxy, the writers and readers, and the fault injector.
    `run()` returns the history; `check(workload.history)` judges it."""

    def __init__(self, data_dir: Path, config: WorkloadConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.run_id = uuid.uuid4().hex[:8]
        self.history = History()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[str] = []  # unexpected exceptions in worker threads
        self.proxy = TcpProxy(seed=self.rng.randrange(2**32))
        self.broker_port = free_port()
        self.broker = BrokerProcess(data_dir, port=self.broker_port, extra_args=[
            "--advertised-listener", self.proxy.address, "--num-partitions", str(config.partitions),
            "--transaction-max-timeout-ms", "900000",
        ])
        self.keys = [(f"jepsen-{self.run_id}-{t}", p) for t in range(config.topics) for p in range(config.partitions)]
        self.topics = sorted({topic for topic, _ in self.keys})
        self.injector: FaultInjector | None = None

    @property
    def bootstrap(self) -> str:
        return self.proxy.address

    def run(self) -> History:
        self.proxy.start()
        self.proxy.target = ("127.0.0.1", self.broker_port)
        self.broker.start()
        threads: list[threading.Thread] = []
        try:
            self._create_topics()
            threads = [threading.Thread(target=self._guard(self._writer, i), name=f"writer-{i}", daemon=True)
                       for i in range(self.config.producers)]
            threads += [threading.Thread(target=self._guard(self._reader, i), name=f"reader-{i}", daemon=True)
                        for i in range(self.config.consumers)]
            for thread in threads:
                thread.start()
            self.injector = FaultInjector(self, self.rng.randrange(2**32))
            self.injector.start()
            self.stop.wait(self.config.seconds)
            self.stop.set()
            self.injector.join(60)
            self.proxy.clear_faults()
            for thread in threads:
                thread.join(120)
                if thread.is_alive():
                    self.errors.append(f"{thread.name} did not stop")
            self._final_reads()
        finally:
            self.stop.set()
            self.proxy.stop()
            self.broker.kill()
        return self.history

    def restart_broker(self) -> None:
        """kill -9 the broker and start it again on the same data and port."""
        self.broker.kill()
        # BrokerProcess takes the port of its ready line, which names the advertised (proxy) address.
        self.broker.port = self.broker_port
        self.broker.start()

    def _guard(self, target: Callable[[int], None], index: int) -> Callable[[], None]:
        def run() -> None:
            try:
                target(index)
            except BaseException as exc:  # reported by the caller
                log.exception("worker failed")
                with self.lock:
                    self.errors.append(f"{threading.current_thread().name}: {exc!r}")
                self.stop.set()
        return run

    def _create_topics(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(topic, self.config.partitions, 1) for topic in self.topics])
        for future in futures.values():
            future.result(30)

    # -- writers -------------------------------------------------------------------------------

    def _client_config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "socket.timeout.ms": self.config.socket_timeout_ms,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 300,
            "retry.backoff.ms": 20,
            "retry.backoff.max.ms": 300,
            # With one broker every cut looks like "all brokers down"; re-bootstrapping then forgets the broker.
            "metadata.recovery.strategy": "none",
        }

    def _new_producer(self, transactional_id: str, deadline_s: float = 90.0) -> Producer:
        """A producer of `transactional_id` whose init_transactions succeeded (which fences any older one)."""
        config = {
            **self._client_config(),
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60000,
            "message.timeout.ms": 30000,
            "linger.ms": 2,
        }
        producer = Producer(config)
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                producer.init_transactions(10)
                return producer
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    _close(producer)
                    raise
                if exc.args[0].fatal():
                    _close(producer)
                    producer = Producer(config)
                time.sleep(0.1)

    def _writer(self, index: int) -> None:
        rng = random.Random(self.rng.randrange(2**32) + index)
        transactional_id = f"jepsen-{self.run_id}-w{index}"
        producer = self._new_producer(transactional_id)
        number = 0
        while not self.stop.is_set():
            keys = rng.sample(self.keys, rng.randint(1, min(4, len(self.keys))))
            writes = [(key, f"w{index}/{number}/{j}") for j, key in enumerate(
                key for key in keys for _ in range(rng.randint(1, 3)))]
            rng.shuffle(writes)
            txn = Txn(transactional_id, number, writes)
            with self.lock:
                self.history.txns.append(txn)
            number += 1
            plan = "abort" if rng.random() < self.config.abort_probability else (
                "fence" if rng.random() < self.config.fence_probability else "commit")
            clean = self._transaction(producer, txn, plan, rng)
            if isinstance(clean, Producer):  # a usurper fenced the old producer and carries on
                producer = clean
            elif not clean:
                # Never reuse a producer after a transaction that did not commit cleanly (see the module doc).
                _close(producer)
                producer = self._new_producer(transactional_id)
            time.sleep(rng.random() * 0.02)
        _close(producer)
        # A fresh producer ends whatever the last one left open, so the final reads see every outcome settled.
        _close(self._new_producer(transactional_id))

    def _transaction(self, producer: Producer, txn: Txn, plan: str, rng: random.Random) -> bool | Producer:
        """Run one transaction; returns whether it committed cleanly (or the producer that fenced it)."""
        commit_asked = False

        def delivered(err: Any, message: Any) -> None:
            if err is None:
                txn.offsets[message.value().decode()] = message.offset()

        try:
            producer.begin_transaction()
            for (topic, partition), value in txn.writes:
                producer.produce(topic, value.encode(), partition=partition, on_delivery=delivered)
            producer.poll(0)
            if plan == "abort":
                # Some aborts come once the records are on their way or written, some before they are sent.
                producer.poll(rng.uniform(0, self.config.abort_wait_s))
                producer.abort_transaction(self.config.commit_timeout_s)
                txn.outcome, txn.why = FAIL, "aborted"
                return False
            if plan == "fence":
                usurper = self._fence(txn.writer)
                if usurper is not None:
                    # The newer producer's init_transactions aborted this transaction: its commit must fail.
                    txn.outcome, txn.why = FAIL, "fenced"
                    try:
                        producer.commit_transaction(self.config.commit_timeout_s)
                        txn.outcome, txn.why = OK, "committed though fenced"
                    except KafkaException:
                        pass
                    _close(producer)
                    return usurper
            commit_asked = True
            producer.commit_transaction(self.config.commit_timeout_s)
            txn.outcome, txn.why = OK, "committed"
            return True
        except KafkaException as exc:
            txn.outcome = INFO if commit_asked else FAIL
            txn.why = f"{'commit' if commit_asked else 'before commit'}: {exc.args[0].name()}"
            return False

    def _fence(self, transactional_id: str) -> Producer | None:
        try:
            return self._new_producer(transactional_id, deadline_s=10)
        except KafkaException:
            return None

    # -- readers -------------------------------------------------------------------------------

    def _reader(self, index: int) -> None:
        rng = random.Random(self.rng.randrange(2**32) + 1000 + index)
        subscribe = index >= (self.config.consumers + 1) // 2
        session = 0
        while not self.stop.is_set():
            name = f"reader-{index}.{session}"
            events: list[Poll | Reset] = []
            with self.lock:
                self.history.sessions[name] = events
            session += 1
            self._read_session(rng, subscribe, events, lifetime_s=rng.uniform(3, 10))

    def _read_session(self, rng: random.Random, subscribe: bool, events: list[Poll | Reset],
                      lifetime_s: float) -> None:
        config = {
            **self._client_config(),
            "group.id": f"jepsen-{self.run_id}" if subscribe else f"jepsen-{self.run_id}-assign-{uuid.uuid4().hex}",
            "isolation.level": READ_COMMITTED,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": subscribe,
            "auto.commit.interval.ms": 500,
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 500,
            "fetch.wait.max.ms": 200,
        }
        consumer = Consumer(config)
        try:
            if subscribe:
                def moved(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
                    events.append(Reset(frozenset((p.topic, p.partition) for p in partitions)))

                consumer.subscribe(self.topics, on_assign=moved, on_revoke=moved, on_lost=moved)
            positions: dict[Key, int] = {}
            if not subscribe:
                self._assign(consumer, rng, events, positions)
            ends = time.monotonic() + lifetime_s
            while not self.stop.is_set() and time.monotonic() < ends:
                messages = consumer.consume(200, 0.2)
                records = [((m.topic(), m.partition()), m.offset(), m.value().decode()) for m in messages
                           if m.error() is None and m.value() is not None]
                if records:
                    events.append(Poll(records))
                    positions.update((key, offset) for key, offset, _value in records)
                if not subscribe and rng.random() < 0.02:
                    self._assign(consumer, rng, events, positions)
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer, rng: random.Random, events: list[Poll | Reset],
                positions: dict[Key, int]) -> None:
        """Assign a random set of keys, each from the beginning or from a random offset at or below where this
        consumer got to: a marker, an aborted record or the middle of a transaction as often as not."""
        partitions = []
        for topic, partition in rng.sample(self.keys, rng.randint(1, len(self.keys))):
            reached = positions.get((topic, partition))
            start = OFFSET_BEGINNING if reached is None or rng.random() < 0.5 else rng.randint(0, reached)
            partitions.append(TopicPartition(topic, partition, start))
        events.append(Reset(frozenset(self.keys)))
        consumer.assign(partitions)

    # -- the end -------------------------------------------------------------------------------

    def _final_reads(self) -> None:
        for isolation_level, into in ((READ_COMMITTED, self.history.final_committed),
                                      (READ_UNCOMMITTED, self.history.final_uncommitted)):
            for topic in self.topics:
                for record in read_records(self.bootstrap, topic, isolation_level=isolation_level, timeout_s=120):
                    into.append(((topic, record.partition), record.offset, record.value.decode()))
        self.history.final_keys = set(self.keys)


class FaultInjector(threading.Thread):
    """Injects one fault of the workload's kinds every so often, cycling through them in random order (kills
    twice a cycle); counts what it injected by kind."""

    def __init__(self, workload: Workload, seed: int) -> None:
        super().__init__(name="faults", daemon=True)
        self.workload = workload
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()

    def run(self) -> None:
        config = self.workload.config
        kinds = [kind for kind in config.faults if kind in FAULT_KINDS]
        order: list[str] = []
        while kinds and not self.workload.stop.wait(self.rng.uniform(*config.fault_interval_s)):
            if not order:
                # Kills come twice as often as each other kind: they are the fault the broker must survive.
                order = [*kinds, *(["kill"] if "kill" in kinds else [])]
                self.rng.shuffle(order)
            try:
                self._inject(order.pop())
            except Exception:
                log.exception("fault injection failed")
                self.workload.errors.append("fault injection failed")
                self.workload.stop.set()

    def _inject(self, kind: str) -> None:
        proxy = self.workload.proxy
        rng = self.rng
        self.injected[kind] += 1
        # Each kind of drop alternates what becomes of the connection, starting with "silence" (kept open until
        # the client's request times out), then "cut" (closed at once).
        then = "silence" if self.injected[kind] % 2 else "cut"
        if kind == "kill":
            self.workload.restart_broker()
        elif kind == "drop_produce":
            self._drop(PRODUCE, rng.randint(1, 2), then)
        elif kind == "drop_add_partitions":
            self._drop(ADD_PARTITIONS_TO_TXN, 1, then)
        elif kind == "drop_end_txn":
            # A silenced EndTxn outlives the commit's timeout, so the commit ends "info"; several, since some
            # EndTxn requests end aborts (among them those of producers closed after such a timeout).
            self._drop(END_TXN, 6 if then == "silence" else 1, then)
        elif kind == "refuse":
            proxy.refuse_for(rng.uniform(0.3, 1.5), reset=rng.random() < 0.5)
        elif kind == "delay":
            proxy.delay(rng.uniform(0.01, 0.15))
            self.workload.stop.wait(rng.uniform(0.5, 2.0))
            proxy.delay(0)
        elif kind == "split":
            proxy.split_frames = True
            self.workload.stop.wait(rng.uniform(0.5, 2.0))
            proxy.split_frames = False

    def _drop(self, api_key: int, count: int, then: str) -> None:
        proxy = self.workload.proxy
        proxy.drop_answers(api_key, count, then=then)
        if then != "silence" or api_key != END_TXN:
            return
        # No other fault until the silenced commits timed out: a cut connection (a kill, a refusal) would let
        # the client send EndTxn again at once, and the commit would end "ok" rather than "info".
        deadline = time.monotonic() + 5
        while proxy.answers_left_to_drop(api_key) and not self.workload.stop.wait(0.05):
            if time.monotonic() > deadline:
                return
        self.workload.stop.wait(self.workload.config.commit_timeout_s + 0.5)

    def acted(self) -> dict[str, int]:
        """Faults that took effect, by kind (an answer to drop may never come, a kill always acts)."""
        proxy = self.workload.proxy
        counters = proxy.counters()
        return {
            "kill": self.injected["kill"],
            "drop_produce": proxy.answers_dropped(PRODUCE),
            "drop_end_txn": proxy.answers_dropped(END_TXN),
            "drop_add_partitions": proxy.answers_dropped(ADD_PARTITIONS_TO_TXN),
            "refuse": counters["connections_refused"],
            "delay": counters["chunks_delayed"],
            "split": counters["chunks_split"],
        }


def _close(client: Producer) -> None:
    """Close a producer without waiting for what it still holds (a fenced one refuses even to purge)."""
    try:
        client.purge()
    except (KafkaException, RuntimeError):
        pass
    try:
        client.close()
    except (KafkaException, RuntimeError):
        pass


def describe(analysis: Analysis, injected: dict[str, int] | None = None) -> str:
    lines = [f"stats: {analysis.stats}", f"anomalies: {analysis.counts}"]
    if injected is not None:
        lines.append(f"faults: {injected}")
    lines += [f"  {name}: {cases}" for name, cases in analysis.examples.items()]
    return "\n".join(lines)

