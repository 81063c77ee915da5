"""Crash proof of the exactly-once pipeline: the Spark driver is killed with SIGKILL at random moments.

The broker runs in a process of its own and survives. A Kafka -> Spark -> Kafka query
(tests/support/pipeline_job.py, a separate driver process with its JVM and Python workers) is killed again and
again, often in the middle of a micro-batch, and restarted from the same checkpoint each time, while a
feeder keeps appending input: plain records, committed transactions and aborted transactions. At the end
the query runs until it consumed everything, and an independent read_committed consumer checks the output
against the expected multiset: nothing lost, nothing twice, no aborted record.
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from sparkeos.spark.kafka.sink.markers import MARKER_PARTITIONS
from sparkeos.verify import READ_UNCOMMITTED, assert_exactly_once, end_offsets, read_values
from support.crash import (
    Driver,
    InputFeeder,
    batch_in_flight,
    caught_up,
    committed_batches,
    job_output,
    pipeline_job_args,
    planned_batches,
    wait_until_stable,
)
from support.spark import create_topic, unique, wait_for

CYCLES = 10  # driver kills: the crash proof calls for at least ten
SOURCE_PARTITIONS = 3
SINK_PARTITIONS = 2
STARTUP_TIMEOUT_S = 240


@dataclass
class Kill:
    cycle: int
    moment: str
    seconds_after_start: float
    batch_in_flight: int | None  # planned in Spark's offset log, not in its commit log
    tasks_committed_in_flight_batch: int  # sink tasks whose transaction for that batch had committed
    committed_batches: int
    output_records: int


def marker_batches(bootstrap: str, prefix: str, partitions: int) -> dict[str, int]:
    """The last batch each transactional id of the sink committed (its marker group offset minus one)."""
    found = {}
    for partition in range(partitions):
        transactional_id = f"{prefix}-{partition}"
        marker = TopicPartition(DEFAULT_MARKER_TOPIC, zlib.crc32(transactional_id.encode()) % MARKER_PARTITIONS)
        # read_uncommitted: no require_stable, so an open transaction of the killed driver does not block us
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": transactional_id,
                "isolation.level": "read_uncommitted",
                "enable.auto.commit": False,
            }
        )
        try:
            offset = consumer.committed([marker], timeout=30)[0].offset
        finally:
            consumer.close()
        if offset >= 0:
            found[transactional_id] = offset - 1
    return found


def wait_for_kill_moment(driver: Driver, checkpoint: Path, cycle: int, rng: random.Random) -> str:
    """Let the driver run until a random moment to kill it at; say which kind of moment it was."""
    if cycle % 5 in (2, 4):
        # Anywhere in start-up: JVM launch, planning, the replay of the batch the last driver left unfinished.
        time.sleep(rng.uniform(1, 25))
        return "start-up"
    # First this run commits a batch, so the query moves on between kills (the first run must: Spark refuses to
    # start batch 0 once its offset log holds anything, even the empty temp file of a driver killed while
    # writing the first entry). Then a random delay, which lands in the next batch's planning, its tasks, their
    # transactions' commits or Spark's commit log entry.
    committed = len(committed_batches(checkpoint))
    driver.wait_running(STARTUP_TIMEOUT_S)
    wait_for(
        lambda: len(committed_batches(checkpoint)) > committed or not driver.alive(),
        timeout_s=STARTUP_TIMEOUT_S,
        interval_s=0.05,
        what=f"driver {cycle} to commit a batch",
    )
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


@pytest.mark.timeout(900)
def test_driver_killed_at_random_moments_output_stays_exact(broker_process, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    bootstrap = broker_process.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=SOURCE_PARTITIONS)
    sink = create_topic(bootstrap, unique("out"), partitions=SINK_PARTITIONS)
    checkpoint = tmp_path / "checkpoint"
    prefix = unique("crash")
    driver = Driver(
        tmp_path,
        unique("tag"),
        pipeline_job_args(
            bootstrap, source, sink, checkpoint, "--master", "local[2]", "--transactional-id-prefix", prefix,
            "--max-offsets-per-trigger", "1000",
        ),
    )
    feeder = InputFeeder(bootstrap, source, seed, pause_s=0.8)
    kills: list[Kill] = []
    started = time.monotonic()
    feeder.start()
    try:
        for cycle in range(CYCLES):
            logs_before = (planned_batches(checkpoint), committed_batches(checkpoint))
            driver.start(cycle)
            moment = wait_for_kill_moment(driver, checkpoint, cycle, rng)
            assert driver.alive(), f"driver {cycle} died on its own:\n{driver.error_tail()}"
            driver.kill()
            # Spark's logs no longer change: what they say now is the state the crash left.
            # Mid-batch: a batch is planned but not committed, and this run got as far as writing to the logs
            # (a run killed in start-up leaves the previous run's batch in flight without having touched it).
            advanced = (planned_batches(checkpoint), committed_batches(checkpoint)) != logs_before
            in_flight = batch_in_flight(checkpoint) if advanced else None
            markers = marker_batches(bootstrap, prefix, SOURCE_PARTITIONS)
            kills.append(
                Kill(
                    cycle,
                    moment,
                    round(time.monotonic() - driver.started_at, 1),
                    in_flight,
                    sum(1 for batch in markers.values() if in_flight is not None and batch == in_flight),
                    len(committed_batches(checkpoint)),
                    sum(end_offsets(bootstrap, sink, isolation_level=READ_UNCOMMITTED).values()),
                )
            )
        feeder.stop()
        run_until_caught_up(driver, CYCLES, checkpoint, bootstrap, source)
    finally:
        feeder.stop_requested.set()
        driver.kill()
    # A killed driver's last transactions are aborted by the broker after kafka.transaction.timeout.ms.
    wait_until_stable(bootstrap, sink)
    output = read_values(bootstrap, sink)
    elapsed = time.monotonic() - started

    mid_batch = [k for k in kills if k.batch_in_flight is not None]
    between_commits = [k for k in kills if k.tasks_committed_in_flight_batch]
    grew = sum(
        1 for before, after in zip(kills, kills[1:], strict=False) if after.output_records > before.output_records
    )
    report = (
        f"seed {seed}: {len(kills)} kills in {elapsed:.0f} s, {len(mid_batch)} mid-batch, {len(between_commits)} "
        f"after a task committed the in-flight batch; output grew between {grew} kill pairs; "
        f"input {len(feeder.committed)} committed + {len(feeder.aborted)} aborted records "
        f"({dict(feeder.transactions)} chunks); {len(committed_batches(checkpoint))} batches; "
        f"output {len(output)} records\n" + "\n".join(str(k) for k in kills)
    )
    print(report)

    assert_exactly_once(job_output(feeder.committed), output, aborted=job_output(feeder.aborted), context=report)
    assert feeder.transactions["abort"] >= 3 and feeder.transactions["commit"] >= 3, report
    assert len(mid_batch) >= 3, f"too few kills hit a running batch\n{report}"
    assert grew >= 3, f"the query hardly made progress between kills\n{report}"
