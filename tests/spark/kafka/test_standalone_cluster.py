"""The exactly-once pipeline on a real Spark standalone cluster that loses a worker mid-stream.

A master and two workers (1 core each) are started from the pyspark installation (its bin/spark-class), each
in a session of its own; the driver (tests/support/pipeline_job.py --master spark://...) gets one executor on
each worker. While input keeps arriving, one worker is killed with SIGKILL together with its executor JVM and
the executor's Python workers. Spark re-runs the lost tasks on the surviving executor, the query goes on, and
an independent read_committed consumer finds every expected record exactly once and no aborted record.
"""

from __future__ import annotations

import random
import time

import pytest

from sparkeos.verify import assert_exactly_once, read_values
from support.crash import (
    Driver,
    InputFeeder,
    batch_in_flight,
    caught_up,
    committed_batches,
    job_output,
    pipeline_job_args,
    wait_until_stable,
)
from support.spark import create_topic, unique, wait_for
from support.standalone_cluster import (
    StandaloneCluster,
    active_tasks,
    check_executor_python,
    executor_counts,
    executor_id,
    free_port,
)

SOURCE_PARTITIONS = 4
SINK_PARTITIONS = 2


@pytest.mark.timeout(900)
def test_worker_killed_mid_stream_output_stays_exact(broker_process, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    bootstrap = broker_process.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=SOURCE_PARTITIONS)
    sink = create_topic(bootstrap, unique("out"), partitions=SINK_PARTITIONS)
    checkpoint = tmp_path / "checkpoint"
    cluster = StandaloneCluster(tmp_path, unique("cluster"))
    ui_port = free_port()
    driver = Driver(
        tmp_path,
        unique("driver"),
        pipeline_job_args(
            bootstrap, source, sink, checkpoint, "--master", cluster.url, "--max-offsets-per-trigger", "1000",
            "--ui-port", str(ui_port),
        ),
    )
    feeder = InputFeeder(bootstrap, source, seed, pause_s=0.15)
    started = time.monotonic()
    try:
        cluster.start(workers=2)
        cluster_ready = time.monotonic() - started
        feeder.start()
        driver.start(0)
        driver.wait_running(300)
        wait_for(
            lambda: len(committed_batches(checkpoint)) >= 3 or not driver.alive(),
            timeout_s=300,
            what="three batches on two workers",
        )
        for worker in (0, 1):
            check_executor_python(cluster, worker)
        # Kill the worker while its executor runs a task: Spark must notice the loss and re-run that task.
        victim = executor_id(cluster.executors_of(0)[0])
        time.sleep(rng.uniform(0, 2))
        killed = cluster.kill_worker_when(0, lambda: active_tasks(ui_port).get(victim, 0) > 0)
        in_flight = batch_in_flight(checkpoint)
        batches_at_kill = len(committed_batches(checkpoint))
        wait_for(lambda: cluster.alive_workers() == 1, timeout_s=120, what="the master to drop the dead worker")
        wait_for(
            lambda: len(committed_batches(checkpoint)) >= batches_at_kill + 3 or not driver.alive(),
            timeout_s=300,
            what="three more batches on the surviving worker",
        )
        assert driver.alive(), f"the query died with the worker:\n{driver.error_tail()}"
        assert len(cluster.executors_of(1)) == 1, "the surviving worker lost its executor"
        # Reported, not asserted: in three runs the status store counted 0 failed tasks on the dead executor
        # even when it was killed while the REST API showed it running one (Spark logs such a loss only at INFO).
        failed_on_victim = executor_counts(ui_port, "failedTasks", "allexecutors").get(victim, 0)
        feeder.stop()
        ends = wait_until_stable(bootstrap, source)
        wait_for(
            lambda: caught_up(checkpoint, source, ends) or not driver.alive(),
            timeout_s=300,
            interval_s=0.5,
            what="the query to consume all of the input",
        )
        assert driver.alive(), f"the driver died:\n{driver.error_tail()}"
    finally:
        feeder.stop_requested.set()
        driver.kill()
        cluster.stop()
    wait_until_stable(bootstrap, sink)
    output = read_values(bootstrap, sink)
    driver_log = (tmp_path / "driver-0.err").read_text(errors="replace")
    report = (
        f"seed {seed}: cluster up in {cluster_ready:.0f} s; worker 0 killed ({len(killed)} processes) during batch "
        f"{in_flight}, {batches_at_kill} batches before, {len(committed_batches(checkpoint))} in all; "
        f"executor {victim} lost with {failed_on_victim} tasks failed on it; "
        f"input {len(feeder.committed)} committed + {len(feeder.aborted)} aborted records; "
        f"output {len(output)} records; {time.monotonic() - started:.0f} s"
    )
    print(report)

    assert "Lost executor" in driver_log, f"the driver never noticed the dead executor\n{report}"
    assert_exactly_once(job_output(feeder.committed), output, aborted=job_output(feeder.aborted), context=report)
