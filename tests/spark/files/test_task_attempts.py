"""Several attempts of one task: a retry after a failure, and a speculative copy, with the `sparkeos.files` sink.

Every attempt of a task stages its own files and pre-commits them; the files of every attempt of one task get the
same final names. Only the attempt whose commit message reached the driver may be published: the other attempts'
files must be deleted, never moved in place of (or beside) the published ones. To tell whose files were published,
the job (tests/support/pipeline_job.py --attempt-column) writes the task's attempt number into every row, and a
watcher reads each pre-committed staged file while it exists.

Retries run in a driver on `local[2,4]`, Spark's local master with up to 4 attempts per task, so a task that fails
after its pre-commit is retried inside the same query. Speculative copies need a cluster: Spark never runs a
speculative copy on a host that already runs an attempt of the task, so the standalone cluster's two workers get
hosts of their own (127.0.0.1 and 127.0.0.2). The job holds both attempts of the slow task until each has passed
on all of its rows, so that they pre-commit together, before the first to finish has Spark kill the other.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sparkeos.ports import free_port
from sparkeos.verify import assert_exactly_once, end_offsets
from support.crash import Driver, caught_up, committed_batches, file_pipeline_job_args, wait_until_stable
from support.file_sink import (
    PUBLISHED_NAME,
    StagingWatcher,
    decision_problems,
    decisions,
    handle_place,
    output_rows,
    output_values,
    published_files,
    row_problems,
    staging_entries,
)
from support.pipeline_job import STOPPED_LINE
from support.spark import arm_failpoint, clear_failpoints, create_topic, fired, produce, unique, wait_for
from support.standalone_cluster import StandaloneCluster

FAILPOINT = "2pc.task_pre_committed"
STARTUP_TIMEOUT_S = 240


@pytest.fixture(autouse=True)
def _no_failpoints_left():
    clear_failpoints()
    yield
    clear_failpoints()


def expected_text(numbers) -> list[bytes]:
    return [f"{n}!".encode() for n in numbers if n % 7]


def produce_and_wait(driver: Driver, bootstrap: str, source: str, checkpoint: Path, numbers: range,
                     partitions: int) -> None:
    """Append `numbers` spread over every partition of `source`, then wait until the query committed them."""
    for partition in range(partitions):
        produce(bootstrap, source, [str(n) for n in numbers if n % partitions == partition], partition=partition)
    ends = wait_until_stable(bootstrap, source)
    wait_for(lambda: caught_up(checkpoint, source, ends) or not driver.alive(), timeout_s=STARTUP_TIMEOUT_S,
             interval_s=0.2, what=f"the query to write up to {numbers.stop}")
    assert driver.alive(), f"the query died:\n{driver.error_tail()}"


def published_attempts(path: Path) -> dict[tuple[int, int], set[int]]:
    """(batch, partition) -> the attempt numbers in the rows of its published files (of the files named as the sink
    names them: `decision_problems` reports the others)."""
    found: dict[tuple[int, int], set[int]] = defaultdict(set)
    for file in published_files(path):
        match = PUBLISHED_NAME.match(file.name)
        if match:
            place = (int(match.group(1)), int(match.group(2)))
            found[place].update(pq.read_table(file).column("attempt").to_pylist())
    return dict(found)


def decided_handles(path: Path) -> dict[tuple[int, int], list[str]]:
    """(batch, partition) -> the handle ids the batch's decision names for that partition."""
    named: dict[tuple[int, int], list[str]] = defaultdict(list)
    for (_query, batch), decision in decisions(path).items():
        for handle in decision["handles"]:
            named[(batch, handle["partition"])].append(handle["id"])
    return dict(named)


def check_directory(path: Path, numbers: range, context: str) -> list[dict]:
    """Exactly the expected records for both readers, nothing staged, every decision finished and obeyed."""
    rows = []
    for reader in ("pyarrow", "duckdb"):
        rows = output_rows(path, reader)
        assert_exactly_once(expected_text(numbers), output_values(rows), context=f"read by {reader}; {context}")
        assert row_problems(rows) == [], context
    assert staging_entries(path) == [], f"left in the staging area: {staging_entries(path)}\n{context}"
    assert decision_problems(path) == [], context
    return rows


def losing_attempts(watcher: StagingWatcher, named: dict[tuple[int, int], list[str]]) -> dict[str, tuple[int, int]]:
    """Pre-committed transactions that no decision names, with their (batch, partition)."""
    chosen = {handle for handles in named.values() for handle in handles}
    return {handle: handle_place(handle) for handle in watcher.pre_committed - chosen}


@pytest.mark.timeout(600)
def test_a_task_failing_after_its_pre_commit_is_retried_and_only_the_retry_is_published(broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    path, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    driver = Driver(
        tmp_path,
        unique("retry"),
        file_pipeline_job_args(
            bootstrap, source, path, checkpoint, "--master", "local[2,4]", "--conf", "spark.task.maxFailures=4",
            "--attempt-column",
        ),
    )
    watcher = StagingWatcher(path)
    exit_code = None
    driver.start(0)
    watcher.start()
    try:
        driver.wait_running(STARTUP_TIMEOUT_S)
        produce_and_wait(driver, bootstrap, source, checkpoint, range(0, 300), 2)
        arm_failpoint(FAILPOINT)
        produce_and_wait(driver, bootstrap, source, checkpoint, range(300, 600), 2)
        assert fired(FAILPOINT), "no task reached the failpoint"
        produce_and_wait(driver, bootstrap, source, checkpoint, range(600, 900), 2)
        exit_code = driver.stop()
    finally:
        watcher.stop()
        driver.kill()
    named = decided_handles(path)
    losers = losing_attempts(watcher, named)
    attempts = published_attempts(path)
    context = (f"decisions {named}; pre-committed {sorted(watcher.pre_committed)}; staged attempts "
               f"{watcher.attempts}; published attempts {attempts}")
    print(context)

    assert exit_code == 0 and STOPPED_LINE in driver.output(), f"the query did not run through:\n{driver.error_tail()}"
    assert f"failpoint {FAILPOINT} fired" in driver.errors(), "Spark logged no failed task"
    check_directory(path, range(900), context)
    # One task failed once, after its pre-commit: its (batch, partition) was published from the retry alone.
    retried = {place for place, numbers in attempts.items() if numbers != {0}}
    assert len(retried) == 1 and attempts[next(iter(retried))] == {1}, context
    assert all(len(handles) == 1 for handles in named.values()), context
    # The failed attempt's pre-committed transaction was seen staged, with rows of attempt 0, and then deleted.
    assert list(losers.values()) == list(retried), context
    assert all(watcher.attempts.get(handle) == {0} for handle in losers), context


SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.minTaskRuntime": "1s",
    # A batch may have a single task, which no finished task can be compared with: speculate it after this long.
    "spark.speculation.task.duration.threshold": "2s",
    # Speculate by duration alone: the efficiency check would also weigh how many rows the held attempt had read.
    "spark.speculation.efficiency.enabled": "false",
}
SPECULATIVE_BATCHES = 3
SOURCE_PARTITIONS = 4
FIRST_ATTEMPT_WAIT_S = 20


@pytest.mark.timeout(900)
def test_a_speculative_copy_and_its_first_attempt_both_pre_commit_and_only_one_is_published(broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=SOURCE_PARTITIONS)
    path, checkpoint, rendezvous = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "rendezvous"
    rendezvous.mkdir()
    cluster = StandaloneCluster(tmp_path, unique("cluster"))
    ui_port = free_port()
    conf = [item for key, value in SPECULATION.items() for item in ("--conf", f"{key}={value}")]
    driver = Driver(
        tmp_path,
        unique("speculation"),
        file_pipeline_job_args(
            bootstrap, source, path, checkpoint, "--master", cluster.url, "--ui-port", str(ui_port),
            "--slow-first-attempt", str(FIRST_ATTEMPT_WAIT_S), "--rendezvous-dir", str(rendezvous), *conf,
        ),
    )
    watcher = StagingWatcher(path)
    exit_code = None
    started = time.monotonic()
    try:
        cluster.start(workers=2, hosts=("127.0.0.1", "127.0.0.2"))
        driver.start(0)
        watcher.start()
        driver.wait_running(300)
        for batch in range(SPECULATIVE_BATCHES):
            produce_and_wait(driver, bootstrap, source, checkpoint, range(400 * batch, 400 * (batch + 1)),
                             SOURCE_PARTITIONS)
        meetings = sorted(name for name in os.listdir(rendezvous) if not name.endswith("-attempt-0"))
        # Without the rendezvous directory no attempt waits: the last batch runs plainly, and its commit deletes
        # whatever a losing attempt of an earlier batch staged after that batch's commit.
        shutil.rmtree(rendezvous)
        produce_and_wait(driver, bootstrap, source, checkpoint, range(400 * SPECULATIVE_BATCHES,
                                                                      400 * (SPECULATIVE_BATCHES + 1)),
                         SOURCE_PARTITIONS)
        batches = len(committed_batches(checkpoint))
        exit_code = driver.stop()
    finally:
        watcher.stop()
        driver.kill()
        cluster.stop()
    total = 400 * (SPECULATIVE_BATCHES + 1)
    named = decided_handles(path)
    losers = losing_attempts(watcher, named)
    attempts = published_attempts(path)
    # Losing attempts whose pre-committed files were read while staged: their place's decision chose another
    # attempt, which pre-committed too.
    traced = {handle: place for handle, place in losers.items() if watcher.attempts.get(handle) and place in named}
    denied = driver.errors().count("Commit denied for partition")
    context = (f"{batches} batches in {time.monotonic() - started:.0f} s; speculative copies met: {meetings}; "
               f"{len(traced)} losing attempts pre-committed and traced, {denied} denied their commit by Spark; "
               f"decisions {named}; pre-committed {sorted(watcher.pre_committed)}; staged attempts "
               f"{watcher.attempts}; published attempts {attempts}; input ends {end_offsets(bootstrap, source)}")
    print(context)

    assert exit_code == 0 and STOPPED_LINE in driver.output(), f"the query did not run through:\n{driver.error_tail()}"
    assert meetings, f"Spark launched no speculative copy of the slow task\n{context}"
    check_directory(path, range(total), context)
    assert all(len(handles) == 1 for handles in named.values()), context
    assert traced, f"no batch had two attempts of a task pre-committed\n{context}"
    for handle, place in traced.items():
        assert attempts[place].isdisjoint(watcher.attempts[handle]), (
            f"{place}: published rows of attempts {attempts[place]}, among them the losing attempt's "
            f"{watcher.attempts[handle]}\n{context}")
