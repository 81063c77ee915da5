"""Crash proof of the exactly-once pipeline: the Spark driver is killed with SIGKILL at random moments.
Every other driver runs with the low-latency switch on (sparkeos.spark.low_latency), from the same checkpoint.

The broker runs in a process of its own and survives. A Kafka -> Spark -> Kafka query
(tests/support/pipeline_job.py, a separate driver process with its JVM and Python workers) is killed again and
again, often in the middle of a micro-batch, and restarted from the same checkpoint each time, while a
feeder keeps appending input: plain records, committed transactions and aborted transactions. At the end
the query runs until it consumed everything, and an independent read_committed consumer checks the output
against the expected multiset: nothing lost, nothing twice, no aborted record.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from sparkeos.spark.kafka.sink.markers import MARKER_PARTITIONS, marker_key
from sparkeos.verify import READ_UNCOMMITTED, assert_exactly_once, end_offsets, read_values
from support.crash import (
    Driver,
    InputFeeder,
    batch_in_flight,
    committed_batches,
    job_output,
    pipeline_job_args,
    planned_batches,
    run_until_caught_up,
    wait_for_kill_moment,
    wait_until_stable,
)
from support.spark import create_topic, unique

CYCLES = 10  # driver kills: the crash proof calls for at least ten
SOURCE_PARTITIONS = 3
SINK_PARTITIONS = 2


@dataclass
class Kill:
    cycle: int
    moment: str
    seconds_after_start: float
    batch_in_flight: int | None  # planned in Spark's offset log, not in its commit log
    tasks_committed_in_flight_batch: int  # sink tasks whose transaction for that batch had committed
    committed_batches: int
    output_records: int


def marker_batches(bootstrap: str, prefix: str, partitions: int, checkpoint: Path, sink: str) -> dict[str, int]:
    """The last batch each transactional id of the sink committed for the checkpoint's query writing to topic
    `sink` (its marker group offset minus one)."""
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    found = {}
    for partition in range(partitions):
        transactional_id = f"{prefix}-{partition}"
        marker = TopicPartition(DEFAULT_MARKER_TOPIC, zlib.crc32(transactional_id.encode()) % MARKER_PARTITIONS)
        # read_uncommitted: no require_stable, so an open transaction of the killed driver does not block us
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": marker_key(transactional_id, query_id, sink),
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
        alternate_low_latency=True,
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
            markers = marker_batches(bootstrap, prefix, SOURCE_PARTITIONS, checkpoint, sink)
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
