"""One crash drill for every sink: the Spark driver of a Kafka -> Spark -> sink query is killed with SIGKILL again and
again, and the sink's output, read by an independent reader, must end up exact.

The query (tests/support/pipeline_job.py, a driver process of its own with its JVM and Python workers) is killed at
random moments, often in the middle of a micro-batch (while tasks write and pre-commit, while the driver records its
decision or commits, before Spark logs the batch as committed), and at moments a sink's target aims at: short windows
that random moments seldom hit, such as just after a batch was decided. Each time it restarts from the same
checkpoint, every other run with the low-latency switch on, while a feeder keeps appending input: plain records,
committed transactions and aborted transactions. At the end the query runs until it consumed everything and is
stopped cleanly. The output must hold every expected record once and nothing of the aborted input, and the sink must
have left nothing pending.

What differs by sink lives in its :class:`DrillTarget`: the job's options, what its store holds after a kill, the
moments to aim at, how an independent reader reads the output, and what must be gone after the clean stop.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkeos import failpoints
from sparkeos.verify import assert_exactly_once
from support.crash import (
    Driver,
    InputFeeder,
    batch_in_flight,
    committed_batches,
    job_output,
    planned_batches,
    run_until_caught_up,
    wait_for_a_new_batch,
    wait_for_kill_moment,
)
from support.pipeline_job import RUNNING_PREFIX, STOPPED_LINE
from support.spark import FAILPOINT_DIR, create_topic, unique

# Driver kills per drill. Each sink's example job also runs under sparkeos chaos (tests/test_chaos.py) with driver
# kills at random and mid-commit, task kills, aborted input and a reader watching its output; the Kafka sink is
# killed on Apache Kafka besides (test_apache_kafka_cluster.py).
CYCLES = 5
SOURCE_PARTITIONS = 3
DRILL_TIMEOUT_S = 900  # for pytest.mark.timeout


@dataclass
class Snapshot:
    """What a sink's store holds once a driver was killed."""

    in_flight_decided: bool  # the in-flight batch was decided (for Kafka: a task committed it): a replay must keep it
    unfinished_decisions: int  # decided, not all committed: the next driver must finish them
    pending: int  # pre-committed or abandoned transactions the killed driver left
    output: int  # what readers see: records, rows or files


@dataclass
class Kill:
    cycle: int
    moment: str
    seconds_after_start: float
    batch_in_flight: int | None  # planned in Spark's offset log, not in its commit log
    committed_batches: int
    state: Snapshot


@dataclass
class AimedKill:
    """Kill just after ``found()`` gained an element, once the run committed a new batch; or, with ``hold_at``, while
    the driver is held at that step of the sink's protocol (sparkeos.failpoints): for a moment that polling misses
    when the driver goes on faster than a poll (a batch decided, then committed and logged within milliseconds on a
    loaded machine)."""

    moment: str
    found: Callable[[], set] | None = None
    max_delay_s: float = 0.02
    hold_at: str | None = None


class DrillTarget:
    """A sink under the drill. ``aimed`` maps a cycle to the moment its kill aims at; ``must_hit`` names what the
    kills must have found at least once (``decided``, ``pending``), or the drill proved less than it claims."""

    name = "sink"  # as the drill's report names it
    aimed: dict[int, AimedKill] = {}
    must_hit: frozenset[str] = frozenset()

    def job_args(self, bootstrap: str, source: str, checkpoint: Path) -> list[str]:
        raise NotImplementedError

    def ran(self, query_id: str) -> None:
        """The query's id, once a driver printed it."""

    def snapshot(self, in_flight: int | None) -> Snapshot:
        raise NotImplementedError

    def start_watching(self) -> None:
        """Start readers that watch the output while the drill runs."""

    def stop_watching(self) -> None:
        """Stop them."""

    def watched_problems(self, expected: Counter) -> list[str]:
        """What the watching readers saw wrong, ``expected`` the job's output."""
        return []

    def output_values(self) -> dict[str, list[bytes]]:
        """The job's output values as each independent reader reads them, after the clean stop."""
        raise NotImplementedError

    def leftovers(self) -> list[str]:
        """What must not be there after the clean stop, and is: pending transactions, unfinished decisions, rows
        whose columns disagree."""
        return []

    def describe(self) -> str:
        return ""

    def close(self) -> None:
        """Release what the target holds open (connections)."""


@dataclass
class DrillResult:
    sink: str
    seed: int
    kills: list[Kill]
    elapsed_s: float
    feeder: InputFeeder
    batches: int
    notes: list[str] = field(default_factory=list)

    @property
    def mid_batch(self) -> int:
        return sum(k.batch_in_flight is not None for k in self.kills)

    @property
    def grew(self) -> int:
        """Between how many pairs of kills the output grew."""
        return sum(1 for a, b in zip(self.kills, self.kills[1:], strict=False) if b.state.output > a.state.output)

    def report(self) -> str:
        mid_batch, grew = self.mid_batch, self.grew
        return (
            f"{self.sink}, seed {self.seed}: {len(self.kills)} kills in {self.elapsed_s:.0f} s, {mid_batch} mid-batch, "
            f"{sum(k.state.in_flight_decided for k in self.kills)} after the in-flight batch was decided, "
            f"{sum(k.state.unfinished_decisions > 0 for k in self.kills)} with a decision unfinished, "
            f"{sum(k.state.pending > 0 for k in self.kills)} with transactions pending; output grew between {grew} "
            f"kill pairs; input {len(self.feeder.committed)} committed + {len(self.feeder.aborted)} aborted records "
            f"({dict(self.feeder.transactions)} chunks); {self.batches} batches; {'; '.join(self.notes)}\n"
            + "\n".join(str(k) for k in self.kills)
        )


def query_id(driver: Driver) -> str | None:
    for line in driver.output().splitlines():
        if line.startswith(RUNNING_PREFIX):
            return line.split()[-1]
    return None


def kill_aimed(driver: Driver, checkpoint: Path, cycle: int, rng: random.Random, aimed: AimedKill) -> str:
    wait_for_a_new_batch(driver, checkpoint, cycle)
    if aimed.hold_at is not None:
        held = failpoints.arm_hold(FAILPOINT_DIR, aimed.hold_at)
        try:
            driver.kill_when(lambda: bool(failpoints.holds(FAILPOINT_DIR, aimed.hold_at) - held))
        finally:
            failpoints.disarm_hold(FAILPOINT_DIR, aimed.hold_at)  # untaken, it would hold the next driver
        return aimed.moment
    found = aimed.found()
    driver.kill_when(lambda: bool(aimed.found() - found), delay_s=rng.uniform(0, aimed.max_delay_s))
    return aimed.moment


def run_drill(target: DrillTarget, bootstrap: str, tmp_path: Path) -> None:
    """The drill, then its checks; fails with the drill's report."""
    try:
        _drill(target, bootstrap, tmp_path)
    finally:
        target.close()


def _drill(target: DrillTarget, bootstrap: str, tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    source = create_topic(bootstrap, unique("in"), partitions=SOURCE_PARTITIONS)
    checkpoint = tmp_path / "checkpoint"
    args = [*target.job_args(bootstrap, source, checkpoint), "--checkpoint", str(checkpoint),
            "--master", "local[2]", "--max-offsets-per-trigger", "1000"]
    driver = Driver(tmp_path, unique("tag"), ["--bootstrap", bootstrap, "--source", source, *args],
                    alternate_low_latency=True)
    feeder = InputFeeder(bootstrap, source, seed, pause_s=0.8)
    kills: list[Kill] = []
    exit_code = None
    started = time.monotonic()
    feeder.start()
    target.start_watching()
    try:
        for cycle in range(CYCLES):
            logs_before = (planned_batches(checkpoint), committed_batches(checkpoint))
            driver.start(cycle)
            if cycle in target.aimed:
                moment = kill_aimed(driver, checkpoint, cycle, rng, target.aimed[cycle])
                assert driver.process.returncode == -9, f"driver {cycle} died on its own:\n{driver.error_tail()}"
            else:
                moment = wait_for_kill_moment(driver, checkpoint, cycle, rng)
                assert driver.alive(), f"driver {cycle} died on its own:\n{driver.error_tail()}"
                driver.kill()
            if (found := query_id(driver)) is not None:
                target.ran(found)
            # Nothing writes to the checkpoint or the store now: what they hold is the state the crash left. A run
            # killed in start-up leaves the previous run's batch in flight without having touched it.
            advanced = (planned_batches(checkpoint), committed_batches(checkpoint)) != logs_before
            in_flight = batch_in_flight(checkpoint) if advanced else None
            kills.append(Kill(cycle, moment, round(time.monotonic() - driver.started_at, 1), in_flight,
                              len(committed_batches(checkpoint)), target.snapshot(in_flight)))
        feeder.stop()
        run_until_caught_up(driver, CYCLES, checkpoint, bootstrap, source)
        last = query_id(driver)
        assert last is not None, f"the driver did not print its query id:\n{driver.error_tail()}"
        target.ran(last)
        exit_code = driver.stop()
    finally:
        feeder.stop_requested.set()
        target.stop_watching()
        driver.kill()
    result = DrillResult(target.name, seed, kills, time.monotonic() - started, feeder,
                         len(committed_batches(checkpoint)), [target.describe()])
    report = result.report()
    print(report)
    assert exit_code == 0 and STOPPED_LINE in driver.output(), f"no clean stop:\n{driver.error_tail()}\n{report}"
    expected, aborted = job_output(feeder.committed), job_output(feeder.aborted)
    for reader, values in target.output_values().items():
        assert_exactly_once(expected, values, aborted=aborted, context=f"read by {reader}; {report}")
    assert target.leftovers() == [], report
    watched = target.watched_problems(expected)
    assert watched == [], "the readers watching the output saw:\n" + "\n".join(watched) + f"\n{report}"

    assert feeder.transactions["abort"] >= 3 and feeder.transactions["commit"] >= 3, report
    assert result.mid_batch >= 2, f"too few kills hit a running batch\n{report}"
    assert result.grew >= 2, f"the query hardly made progress between kills\n{report}"
    if "decided" in target.must_hit:
        assert any(k.state.in_flight_decided for k in kills), f"no kill came after a batch was decided\n{report}"
    if "pending" in target.must_hit:
        assert any(k.state.pending for k in kills), f"no kill left a transaction pending\n{report}"
