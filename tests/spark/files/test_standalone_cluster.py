"""The `sparkeos.files` sink on a real Spark standalone cluster that loses a worker mid-stream.

A master and two workers (1 core each, support.standalone_cluster); the driver (tests/support/pipeline_job.py
--sink-path --master spark://...) gets one executor on each. While input keeps arriving, one worker is killed with
SIGKILL together with its executor JVM and the executor's Python workers, while that executor runs a task: its
staged files are left behind half-written or pre-committed, and Spark re-runs the task on the surviving executor.
The directory (JSON lines here, parquet in the driver crash test) must end up with every expected record exactly
once, as pyarrow.dataset and DuckDB read it, with nothing left staged after the query's clean stop, and a reader
polling it all along must never fail or see a record twice.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from sparkeos.ports import free_port
from sparkeos.verify import assert_exactly_once
from support.crash import (
    Driver,
    InputFeeder,
    batch_in_flight,
    caught_up,
    committed_batches,
    file_pipeline_job_args,
    job_output,
    wait_until_stable,
)
from support.file_sink import (
    DirectoryReader,
    decision_problems,
    output_rows,
    output_values,
    row_problems,
    staging_entries,
)
from support.pipeline_job import STOPPED_LINE
from support.spark import create_topic, unique, wait_for
from support.standalone_cluster import (
    StandaloneCluster,
    active_tasks,
    check_executor_python,
    executor_id,
)

SOURCE_PARTITIONS = 4
FORMAT = "json"  # the driver crash test writes parquet
# How long to wait for the moment the doomed executor writes a staged file before killing it in any task.
MID_TRANSACTION_WAIT_S = 60


def writing_a_staged_file(pids: list[int]) -> bool:
    """Whether one of these processes has a file of the sink's staging area open: a task in its transaction."""
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
            except OSError:
                continue
            if "/_sparkeos/" in target and "/staging/" in target:
                return True
    return False


class KillMoment:
    """True once the worker's executor writes a staged file (its Python workers are listed again every half
    second), or, after MID_TRANSACTION_WAIT_S, once the executor runs any task."""

    def __init__(self, cluster: StandaloneCluster, worker: int, victim: str, ui_port: int):
        self.cluster, self.worker, self.victim, self.ui_port = cluster, worker, victim, ui_port
        self.started = time.monotonic()
        self.listed_at = 0.0
        self.pythons: list[int] = []
        self.mid_transaction = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self.listed_at > 0.5:
            self.pythons, self.listed_at = self.cluster.python_workers_of(self.worker), now
        if writing_a_staged_file(self.pythons):
            self.mid_transaction = True
            return True
        return now - self.started > MID_TRANSACTION_WAIT_S and active_tasks(self.ui_port).get(self.victim, 0) > 0


@pytest.mark.timeout(900)
def test_worker_killed_mid_stream_files_stay_exact(broker_process, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    bootstrap = broker_process.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=SOURCE_PARTITIONS)
    path, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    cluster = StandaloneCluster(tmp_path, unique("cluster"))
    ui_port = free_port()
    driver = Driver(
        tmp_path,
        unique("driver"),
        file_pipeline_job_args(
            bootstrap, source, path, checkpoint, "--master", cluster.url, "--max-offsets-per-trigger", "1000",
            "--ui-port", str(ui_port), "--sink-format", FORMAT,
        ),
    )
    feeder = InputFeeder(bootstrap, source, seed, pause_s=0.15)
    reader = DirectoryReader(path, FORMAT)
    exit_code = None
    started = time.monotonic()
    try:
        cluster.start(workers=2)
        cluster_ready = time.monotonic() - started
        feeder.start()
        reader.start()
        driver.start(0)
        driver.wait_running(300)
        wait_for(
            lambda: len(committed_batches(checkpoint)) >= 3 or not driver.alive(),
            timeout_s=300,
            what="three batches on two workers",
        )
        for worker in (0, 1):
            check_executor_python(cluster, worker)
        # Kill the worker while its executor writes a task's files: they stay staged, and Spark re-runs the task.
        victim = executor_id(cluster.executors_of(0)[0])
        time.sleep(rng.uniform(0, 2))
        moment = KillMoment(cluster, 0, victim, ui_port)
        killed = cluster.kill_worker_when(0, moment, interval_s=0.002)
        in_flight = batch_in_flight(checkpoint)
        staged_at_kill = len(staging_entries(path))
        batches_at_kill = len(committed_batches(checkpoint))
        wait_for(lambda: cluster.alive_workers() == 1, timeout_s=120, what="the master to drop the dead worker")
        wait_for(
            lambda: len(committed_batches(checkpoint)) >= batches_at_kill + 3 or not driver.alive(),
            timeout_s=300,
            what="three more batches on the surviving worker",
        )
        assert driver.alive(), f"the query died with the worker:\n{driver.error_tail()}"
        assert len(cluster.executors_of(1)) == 1, "the surviving worker lost its executor"
        feeder.stop()
        ends = wait_until_stable(bootstrap, source)
        wait_for(
            lambda: caught_up(checkpoint, source, ends) or not driver.alive(),
            timeout_s=300,
            interval_s=0.5,
            what="the query to consume all of the input",
        )
        assert driver.alive(), f"the driver died:\n{driver.error_tail()}"
        exit_code = driver.stop()
    finally:
        feeder.stop_requested.set()
        reader.stop()
        driver.kill()
        cluster.stop()
    driver_log = (tmp_path / "driver-0.err").read_text(errors="replace")
    report = (
        f"seed {seed}: cluster up in {cluster_ready:.0f} s; worker 0 killed ({len(killed)} processes, "
        f"{'while' if moment.mid_transaction else 'not seen'} writing a staged file) during batch {in_flight} with "
        f"{staged_at_kill} staging entries, {batches_at_kill} batches before, "
        f"{len(committed_batches(checkpoint))} in all; input {len(feeder.committed)} committed + "
        f"{len(feeder.aborted)} aborted records; reader: {reader.describe()}; {time.monotonic() - started:.0f} s"
    )
    print(report)

    assert "Lost executor" in driver_log, f"the driver never noticed the dead executor\n{report}"
    assert exit_code == 0 and STOPPED_LINE in driver.output(), f"no clean stop:\n{driver.error_tail()}\n{report}"
    expected, aborted = job_output(feeder.committed), job_output(feeder.aborted)
    for name in ("pyarrow", "duckdb"):
        rows = output_rows(path, name, FORMAT)
        assert_exactly_once(expected, output_values(rows), aborted=aborted, context=f"read by {name}; {report}")
        assert row_problems(rows) == [], report
    assert staging_entries(path) == [], f"left in the staging area after the clean stop\n{report}"
    assert decision_problems(path) == [], report
    assert reader.problems == [], "the polling reader saw:\n" + "\n".join(reader.problems) + f"\n{report}"
    assert reader.reads >= 50, f"the polling reader hardly read\n{report}"
    never_expected = {value for value in reader.seen if value.encode() not in expected}
    assert not never_expected, f"the reader saw records never expected: {sorted(never_expected)[:5]}\n{report}"
