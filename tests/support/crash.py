"""Helpers for the Spark crash tests: driver processes killed like real crashes, a live input feeder, and
readers of the query's checkpoint.

A crash kills a driver's whole process tree (sparkeos.processes). Every process of one test run carries the
environment variable `SPARKEOS_CRASH_TAG`, so `tagged_processes` can prove that nothing survived.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import KafkaException, Producer

from sparkeos.chaos.input import call_while_retriable
from sparkeos.processes import command_line, kill_processes, kill_tree, process_table, process_tree
from sparkeos.verify import READ_UNCOMMITTED, end_offsets, read_values
from support.spark import unique, wait_for

JOB = Path(__file__).with_name("pipeline_job.py")
TAG_VARIABLE = "SPARKEOS_CRASH_TAG"
STARTUP_TIMEOUT_S = 240  # a driver's start on a loaded machine: JVM, session, the query's first plan


# --- processes ----------------------------------------------------------------------------------


def tagged_processes(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries this run's tag."""
    needle = f"{TAG_VARIABLE}={tag}".encode()
    alive = []
    for pid, (_parent, _group, state) in process_table().items():
        if state in ("Z", "X"):
            continue
        try:
            environment = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environment.split(b"\0"):
            alive.append(pid)
    return alive


def wait_until_no_tagged_processes(tag: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes survived the kill: {[command_line(p) for p in left]}"


def environment_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def pipeline_job_args(bootstrap: str, source: str, sink: str, checkpoint: Path, *options: str) -> list[str]:
    """Command-line arguments of tests/support/pipeline_job.py."""
    return ["--bootstrap", bootstrap, "--source", source, "--sink", sink, "--checkpoint", str(checkpoint), *options]


def file_pipeline_job_args(bootstrap: str, source: str, path: Path, checkpoint: Path, *options: str) -> list[str]:
    """Command-line arguments of tests/support/pipeline_job.py writing to the sparkeos.files sink at `path`."""
    return ["--bootstrap", bootstrap, "--source", source, "--sink-path", str(path), "--checkpoint", str(checkpoint),
            *options]


# A Python traceback's last line ("sparkeos.spark.kafka.sink.protocol.TransactionTimedOut: ..."), or any line
# naming an error class.
EXCEPTION_LINE = re.compile(r"^(?:[a-z_]\w*\.)+[A-Z]\w*: |\b[A-Z]\w*(?:Error|Exception)\b(?:: |$)")


def exception_lines(lines: list[str], most: int = 8, width: int = 400) -> list[str]:
    """The distinct lines that name an exception, in order of first appearance."""
    seen: dict[str, None] = {}
    for line in lines:
        if EXCEPTION_LINE.search(line) and not line.lstrip().startswith("at "):
            seen.setdefault(line.strip()[:width], None)
    return list(seen)[:most]


class Driver:
    """One run of tests/support/pipeline_job.py, in a session of its own, output in log files."""

    def __init__(self, log_dir: Path, tag: str, args: list[str], alternate_low_latency: bool = False,
                 environment: dict[str, str] | None = None):
        self.log_dir = log_dir
        self.environment = environment or {}
        self.tag = tag
        self.args = args
        self.alternate_low_latency = alternate_low_latency
        self.process: subprocess.Popen | None = None
        self.stdout_path: Path | None = None
        self.started_at = 0.0

    def start(self, run: int) -> Driver:
        """Run `run` of the job. With `alternate_low_latency`, odd runs turn the low-latency switch on
        (sparkeos.spark.low_latency): the checkpoint goes back and forth between the two, and each must keep the
        output exact."""
        self.stdout_path = self.log_dir / f"driver-{run}.out"
        environment = {**os.environ, **self.environment, TAG_VARIABLE: self.tag, "PYSPARK_PYTHON": sys.executable}
        switch = ["--low-latency"] if self.alternate_low_latency and run % 2 else []
        with open(self.stdout_path, "w") as stdout, open(self.log_dir / f"driver-{run}.err", "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(JOB), *self.args, *switch],
                stdout=stdout,
                stderr=stderr,
                env=environment,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    def output(self) -> str:
        return self.stdout_path.read_text() if self.stdout_path and self.stdout_path.exists() else ""

    def wait_running(self, timeout_s: float) -> float:
        """Seconds until the driver printed that its query runs."""
        from support.pipeline_job import RUNNING_PREFIX

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if RUNNING_PREFIX in self.output():
                return time.monotonic() - self.started_at
            if self.process.poll() is not None:
                raise AssertionError(f"driver exited with {self.process.returncode}:\n{self.error_tail()}")
            time.sleep(0.1)
        raise AssertionError(f"driver did not start its query in {timeout_s} s:\n{self.error_tail()}")

    def errors(self) -> str:
        """The driver's stderr so far: Spark's log, and what its Python processes wrote to stderr."""
        path = Path(str(self.stdout_path).replace(".out", ".err"))
        return path.read_text(errors="replace") if path.exists() else ""

    def error_tail(self, lines: int = 40) -> str:
        """The driver's stderr: its end between the exceptions it names. They come at both ends, because pytest's
        short summary keeps a message's first line and a shortened report keeps its start or its end (one that
        kept the middle showed a data-loss error's traceback without its reason)."""
        own = [line for line in self.errors().splitlines() if not line.startswith("%")]  # librdkafka's log lines
        exceptions = exception_lines(own)
        return (" | ".join(exceptions[:3]) + "\n" + "\n".join(own[-lines:])
                + "\n--- exceptions in the driver's log ---\n" + "\n".join(exceptions))

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """A driver crash: every process of the driver dies at once, without running any shutdown code."""
        if self.process is None:
            return
        kill_tree(self.process.pid)
        self.process.wait(30)
        wait_until_no_tagged_processes(self.tag)

    def kill_when(self, moment, timeout_s: float = STARTUP_TIMEOUT_S, delay_s: float = 0.0) -> None:
        """A driver crash `delay_s` after `moment()` turned true (or the driver died). The process tree is listed
        beforehand, so that the kill follows the moment at once; whatever started since is killed right after."""
        pids, groups = process_tree(self.process.pid)
        wait_for(lambda: moment() or not self.alive(), timeout_s=timeout_s, interval_s=0.002,
                 what="the moment to kill the driver")
        time.sleep(delay_s)
        kill_processes(pids, groups)
        self.kill()

    def stop(self, timeout_s: float = 120.0) -> int:
        """A clean stop: SIGTERM, on which the job stops its query and its session and exits; return its exit code.
        Whatever of the driver's processes outlives its exit is then killed."""
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the driver did not stop within {timeout_s} s:\n{self.error_tail()}") from None
        for pid in tagged_processes(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until_no_tagged_processes(self.tag)
        return code


# --- kill moments -------------------------------------------------------------------------------


def wait_for_a_new_batch(driver: Driver, checkpoint: Path, cycle: int) -> None:
    """Until the driver, just started, committed a batch the last driver did not plan: the replay of a batch the last
    one left in flight adds nothing to the output once its transactions had committed, and the output is to grow
    between kills."""
    known = max(len(committed_batches(checkpoint)), len(planned_batches(checkpoint)))
    driver.wait_running(STARTUP_TIMEOUT_S)
    wait_for(lambda: len(committed_batches(checkpoint)) > known or not driver.alive(),
             timeout_s=STARTUP_TIMEOUT_S, interval_s=0.05, what=f"driver {cycle} to commit a new batch")


def wait_for_kill_moment(driver: Driver, checkpoint: Path, cycle: int, rng: random.Random) -> str:
    """Let the driver run until a random moment to kill it at; say which kind of moment it was."""
    if cycle % 5 in (2, 4):
        # Anywhere in start-up: JVM launch, planning, the replay of the batch the last driver left unfinished (a
        # local driver's first batch is running within 15 s, even on a loaded machine).
        time.sleep(rng.uniform(1, 15))
        return "start-up"
    # First this run commits a batch, so the query moves on between kills (the first run must: Spark refuses to
    # start batch 0 once its offset log holds anything, even the empty temp file of a driver killed while
    # writing the first entry). Then a random delay, which lands in the next batch's planning, its tasks, their
    # transactions' commits or Spark's commit log entry.
    wait_for_a_new_batch(driver, checkpoint, cycle)
    time.sleep(rng.uniform(0, 3))
    if batch_in_flight(checkpoint) is None:
        # The query caught up with the input and waits for more: 2 of 6 such kills were mid-batch in one run on a
        # slow machine. Kill in its next batch instead, early or late in it.
        wait_for(
            lambda: batch_in_flight(checkpoint) is not None or not driver.alive(),
            timeout_s=STARTUP_TIMEOUT_S,
            interval_s=0.02,
            what=f"driver {cycle} to start a batch",
        )
        time.sleep(rng.uniform(0, 0.5))
    return "running"


def run_until_caught_up(driver: Driver, run: int, checkpoint, bootstrap: str, source: str) -> None:
    driver.start(run)
    driver.wait_running(STARTUP_TIMEOUT_S)
    ends = wait_until_stable(bootstrap, source)
    wait_for(
        lambda: caught_up(checkpoint, source, ends) or not driver.alive(),
        timeout_s=240,
        interval_s=0.5,
        what="the query to consume all of the input",
    )
    assert driver.alive(), f"the driver died on its own:\n{driver.error_tail()}"


# --- input --------------------------------------------------------------------------------------


FEEDER_DELIVERY_TIMEOUT_S = 120  # outlasts a broker outage: Apache Kafka takes about 10 s to restart


def retrying(call, timeout_s: float = FEEDER_DELIVERY_TIMEOUT_S):
    """Call a transactional producer method again while it fails with a retriable error (the broker is away)."""
    return call_while_retriable(call, timeout_s)


class InputFeeder(threading.Thread):
    """Appends numbered records to a topic until stopped: plain idempotent batches, committed transactions
    and aborted transactions. Every number is used once; `committed` holds the ones that became visible."""

    def __init__(self, bootstrap: str, topic: str, seed: int, pause_s: float = 0.1, chunk: tuple[int, int] = (5, 30)):
        super().__init__(name="input-feeder", daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.random = random.Random(seed)
        self.pause_s, self.chunk = pause_s, chunk
        self.stop_requested = threading.Event()
        self.committed: list[int] = []
        self.aborted: list[int] = []
        self.transactions = Counter()
        self.failure: BaseException | None = None
        self.next_number = 0
        self.transactional_id = unique("feeder")
        self.uncertain: list[int] = []  # in a transaction whose producer failed fatally; resolved by stop()

    def run(self) -> None:
        try:
            self._feed()
        except BaseException as exc:  # reported by stop()
            self.failure = exc

    def _feed(self) -> None:
        plain = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        transactional = self._transactional_producer()
        while not self.stop_requested.is_set():
            kind = self.random.choices(["plain", "commit", "abort"], weights=[5, 3, 2])[0]
            numbers = self._numbers(self.random.randint(*self.chunk), visible_if_leaked=kind == "abort")
            if kind == "plain":
                for number in numbers:
                    plain.produce(self.topic, key=str(number % 5).encode(), value=str(number).encode())
                # Idempotent: records still queued after an outage are delivered once the broker is back.
                wait_for(lambda: plain.flush(5) == 0, timeout_s=FEEDER_DELIVERY_TIMEOUT_S,
                         what="the feeder's plain records to be acknowledged")
                self.committed.extend(numbers)
            else:
                try:
                    kind = self._transaction(transactional, numbers, commit=kind == "commit")
                except KafkaException as failed:
                    if not failed.args[0].fatal():
                        raise
                    # The producer is done for (fenced, or an EndTxn answer it cannot recover from), and whether
                    # the transaction committed only the coordinator knows: a new producer of the same id makes
                    # it finish one way or the other, and stop() reads the topic to learn which.
                    kind = "uncertain"
                    self.uncertain.extend(numbers)
                    transactional = self._transactional_producer()
            self.transactions[kind] += 1
            time.sleep(self.random.uniform(0, 2 * self.pause_s))
        plain.flush(30)
        transactional.flush(30)

    def _transactional_producer(self) -> Producer:
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id,
                             "linger.ms": 5})
        retrying(lambda: producer.init_transactions(30))
        return producer

    def _transaction(self, transactional: Producer, numbers: list[int], commit: bool) -> str:
        """One transaction of `numbers`: "commit" when they became visible, "abort" when not."""
        transactional.begin_transaction()
        for number in numbers:
            transactional.produce(self.topic, key=str(number % 5).encode(), value=str(number).encode())
        if commit and self._commit(transactional):
            self.committed.extend(numbers)
            return "commit"
        retrying(lambda: transactional.abort_transaction(30))
        self.aborted.extend(numbers)
        return "abort"

    @staticmethod
    def _commit(transactional: Producer) -> bool:
        """Commit; False when the transaction must be aborted instead (an outage failed one of its records)."""
        try:
            retrying(lambda: transactional.commit_transaction(30))
            return True
        except KafkaException as failed:
            if failed.args[0].txn_requires_abort():
                return False
            raise

    def _numbers(self, count: int, visible_if_leaked: bool) -> list[int]:
        numbers = []
        while len(numbers) < count:
            number = self.next_number
            self.next_number += 1
            # An aborted record must pass the filter if it ever leaked, or the test could not see the leak.
            if visible_if_leaked and number % 7 == 0:
                continue
            numbers.append(number)
        return numbers

    def stop(self) -> None:
        self.stop_requested.set()
        self.join(60)
        assert not self.is_alive(), "the input feeder did not stop"
        if self.failure is not None:
            raise AssertionError(f"the input feeder failed: {self.failure!r}") from self.failure
        if self.uncertain:
            wait_until_stable(self.bootstrap, self.topic)
            visible = {int(value) for value in read_values(self.bootstrap, self.topic)}
            for number in self.uncertain:
                (self.committed if number in visible else self.aborted).append(number)
            self.uncertain = []


def job_output(numbers: list[int]) -> Counter:
    """The stateless job's output for these inputs: numbers not divisible by 7, with '!' appended. Of the
    feeder's committed numbers, what the output must hold exactly once; of its aborted ones, what it must never
    hold (the feeder keeps multiples of 7 out of aborted transactions, so a leak would show)."""
    return Counter(f"{n}!".encode() for n in numbers if n % 7 != 0)


# --- topics and checkpoint ----------------------------------------------------------------------


def wait_until_stable(bootstrap: str, topic: str, timeout_s: float = 60.0) -> dict[int, int]:
    """Wait until no transaction is open on `topic` (last stable offset == high watermark everywhere)."""
    deadline = time.monotonic() + timeout_s
    while True:
        high = end_offsets(bootstrap, topic, isolation_level=READ_UNCOMMITTED)
        stable = end_offsets(bootstrap, topic)
        if stable == high:
            return high
        assert time.monotonic() < deadline, f"{topic} has transactions open for {timeout_s} s: {stable} < {high}"
        time.sleep(0.5)


def _log_ids(directory: Path) -> list[int]:
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def planned_batches(checkpoint: Path) -> list[int]:
    """Batches Spark wrote to its offset log (planned; maybe running)."""
    return _log_ids(checkpoint / "offsets")


def committed_batches(checkpoint: Path) -> list[int]:
    """Batches Spark recorded as finished in its commit log."""
    return _log_ids(checkpoint / "commits")


def batch_in_flight(checkpoint: Path) -> int | None:
    """The batch that was planned but not yet committed, if any: killing now kills it mid-batch."""
    planned, committed = planned_batches(checkpoint), committed_batches(checkpoint)
    if planned and (not committed or planned[-1] > committed[-1]):
        return planned[-1]
    return None


def batch_end_offsets(checkpoint: Path, batch: int) -> dict[str, dict[str, int]]:
    """The source end offsets Spark planned for `batch` (its offset log entry: version, metadata, offsets), by topic;
    the keys sparkeos' source keeps beside the topics (the batch's start and plan) left out."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return {topic: parts for topic, parts in json.loads(lines[2]).items() if not topic.startswith("sparkeos:")}


def caught_up(checkpoint: Path, topic: str, ends: dict[int, int]) -> bool:
    """True once Spark committed a batch that ends at `ends`, i.e. the query consumed all of the input."""
    committed = committed_batches(checkpoint)
    if not committed:
        return False
    planned = batch_end_offsets(checkpoint, committed[-1]).get(topic, {})
    return {int(p): o for p, o in planned.items()} == ends
