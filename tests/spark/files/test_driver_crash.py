"""Crash proof of the `sparkeos.files` sink: the Spark driver is killed with SIGKILL at random moments.
Every other driver runs with the low-latency switch on (sparkeos.spark.low_latency), from the same checkpoint.

A Kafka -> Spark -> files query (tests/support/pipeline_job.py --sink-path, a separate driver process with its JVM
and Python workers) is killed again and again, often in the middle of a micro-batch (while tasks stage files,
while the driver records its decision or moves the files, before Spark logs the batch as committed), and restarted
from the same checkpoint each time, while a feeder keeps appending input: plain records, committed transactions
and aborted transactions. Two kills in ten are aimed just after the sink recorded a batch's decision, a short
window that random moments seldom hit. At the end the query runs until it consumed everything and is stopped
cleanly.

The directory, read by pyarrow.dataset and by DuckDB, must hold every expected record exactly once and nothing of
the aborted input; nothing may stay staged; every decision must be finished, and every published file named by
one. A reader polls the directory all along: it must never fail to open a file, see a record twice, or see a
record disappear.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkeos.verify import assert_exactly_once
from support.crash import (
    STARTUP_TIMEOUT_S,
    Driver,
    InputFeeder,
    batch_in_flight,
    committed_batches,
    file_pipeline_job_args,
    job_output,
    planned_batches,
    run_until_caught_up,
    wait_for_kill_moment,
)
from support.file_sink import (
    DirectoryReader,
    decision_problems,
    decisions,
    output_rows,
    output_values,
    published_files,
    row_problems,
    staged_files,
    staging_entries,
)
from support.pipeline_job import STOPPED_LINE
from support.spark import create_topic, unique, wait_for

CYCLES = 10  # driver kills: the crash proof calls for at least ten
SOURCE_PARTITIONS = 3
# The sink's report when Spark replays a batch that the sink had decided before the driver died.
DECIDED_BEFORE = "it had been decided before"


@dataclass
class Kill:
    cycle: int
    moment: str
    seconds_after_start: float
    batch_in_flight: int | None  # planned in Spark's offset log, not in its commit log
    in_flight_decided: bool  # the sink had recorded its decision for that batch: the replay must keep it
    unfinished_decisions: int  # decided, not all files moved: the next driver must finish them
    staged_transactions: int  # staging directories the killed driver's tasks left
    committed_batches: int
    published_files: int


def decision_files(path: Path) -> set[str]:
    return {file.name for file in path.glob("_sparkeos/*/decisions/*.decision")}


def kill_once_a_batch_is_decided(driver: Driver, checkpoint: Path, path: Path, cycle: int, rng: random.Random) -> str:
    """Kill the driver just after the sink recorded the decision of a batch: while it moves the batch's files, or
    once it moved them and before Spark logged the batch as committed. Spark then replays a batch whose decision
    must hold, and the next driver must finish it. Random moments seldom land there: the window is short."""
    committed = len(committed_batches(checkpoint))
    driver.wait_running(STARTUP_TIMEOUT_S)
    wait_for(
        lambda: len(committed_batches(checkpoint)) > committed or not driver.alive(),
        timeout_s=STARTUP_TIMEOUT_S,
        interval_s=0.05,
        what=f"driver {cycle} to commit a batch",
    )
    known = decision_files(path)
    driver.kill_when(lambda: bool(decision_files(path) - known), delay_s=rng.uniform(0, 0.03))
    return "decided"


def replays_of_decided_batches(log_dir: Path) -> int:
    return sum(path.read_text(errors="replace").count(DECIDED_BEFORE) for path in log_dir.glob("driver-*.err"))


@pytest.mark.timeout(900)
def test_driver_killed_at_random_moments_files_stay_exact(broker_process, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    bootstrap = broker_process.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=SOURCE_PARTITIONS)
    path, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    driver = Driver(
        tmp_path,
        unique("tag"),
        file_pipeline_job_args(
            bootstrap, source, path, checkpoint, "--master", "local[2]", "--max-offsets-per-trigger", "1000"
        ),
        alternate_low_latency=True,
    )
    feeder = InputFeeder(bootstrap, source, seed, pause_s=0.8)
    reader = DirectoryReader(path)
    kills: list[Kill] = []
    exit_code = None
    started = time.monotonic()
    feeder.start()
    reader.start()
    try:
        for cycle in range(CYCLES):
            logs_before = (planned_batches(checkpoint), committed_batches(checkpoint))
            driver.start(cycle)
            if cycle % 5 == 3:
                moment = kill_once_a_batch_is_decided(driver, checkpoint, path, cycle, rng)
                assert driver.process.returncode == -9, f"driver {cycle} died on its own:\n{driver.error_tail()}"
            else:
                moment = wait_for_kill_moment(driver, checkpoint, cycle, rng)
                assert driver.alive(), f"driver {cycle} died on its own:\n{driver.error_tail()}"
                driver.kill()
            # Nothing writes to the checkpoint or the directory now: what they hold is the state the crash left.
            advanced = (planned_batches(checkpoint), committed_batches(checkpoint)) != logs_before
            in_flight = batch_in_flight(checkpoint) if advanced else None
            recorded = decisions(path)
            kills.append(
                Kill(
                    cycle,
                    moment,
                    round(time.monotonic() - driver.started_at, 1),
                    in_flight,
                    any(batch == in_flight for _query, batch in recorded),
                    sum(1 for decision in recorded.values() if not decision["finished"]),
                    len({entry.relative_to(path).parts[:4] for entry in staging_entries(path)}),
                    len(committed_batches(checkpoint)),
                    len(published_files(path)),
                )
            )
        feeder.stop()
        run_until_caught_up(driver, CYCLES, checkpoint, bootstrap, source)
        exit_code = driver.stop()
    finally:
        feeder.stop_requested.set()
        reader.stop()
        driver.kill()
    elapsed = time.monotonic() - started

    mid_batch = [k for k in kills if k.batch_in_flight is not None]
    grew = sum(
        1 for before, after in zip(kills, kills[1:], strict=False) if after.published_files > before.published_files
    )
    report = (
        f"seed {seed}: {len(kills)} kills in {elapsed:.0f} s, {len(mid_batch)} mid-batch, "
        f"{sum(k.in_flight_decided for k in kills)} after the sink decided the in-flight batch, "
        f"{sum(k.unfinished_decisions > 0 for k in kills)} with a decision unfinished, "
        f"{sum(k.staged_transactions > 0 for k in kills)} with transactions staged; "
        f"{replays_of_decided_batches(tmp_path)} replays of a decided batch; published files grew between {grew} "
        f"kill pairs; input {len(feeder.committed)} committed + {len(feeder.aborted)} aborted records "
        f"({dict(feeder.transactions)} chunks); {len(committed_batches(checkpoint))} batches; "
        f"{len(published_files(path))} files; reader: {reader.describe()}\n" + "\n".join(str(k) for k in kills)
    )
    print(report)

    assert exit_code == 0 and STOPPED_LINE in driver.output(), f"no clean stop:\n{driver.error_tail()}\n{report}"
    expected, aborted = job_output(feeder.committed), job_output(feeder.aborted)
    for name in ("pyarrow", "duckdb"):
        rows = output_rows(path, name)
        assert_exactly_once(expected, output_values(rows), aborted=aborted, context=f"read by {name}; {report}")
        assert row_problems(rows) == [], report
    assert staged_files(path) == [], f"files left staged after the clean stop\n{report}"
    assert staging_entries(path) == [], f"transactions left in the staging area after the clean stop\n{report}"
    assert decision_problems(path) == [], report

    assert reader.problems == [], "the polling reader saw:\n" + "\n".join(reader.problems) + f"\n{report}"
    assert reader.reads >= 100, f"the polling reader hardly read\n{report}"
    never_expected = {value for value in reader.seen if value.encode() not in expected}
    assert not never_expected, f"the reader saw records never expected: {sorted(never_expected)[:5]}\n{report}"
    assert feeder.transactions["abort"] >= 3 and feeder.transactions["commit"] >= 3, report
    assert len(mid_batch) >= 3, f"too few kills hit a running batch\n{report}"
    assert any(k.in_flight_decided for k in kills), f"no kill came after the sink decided a batch\n{report}"
    assert grew >= 3, f"the query hardly made progress between kills\n{report}"
