"""The exactly-once pipeline on a real Spark standalone cluster that loses a worker mid-stream.

A master and two workers (1 core each) are started from the pyspark installation (its bin/spark-class), each
in a session of its own; the driver (tests/support/pipeline_job.py --master spark://...) gets one executor on
each worker. While input keeps arriving, one worker is killed with SIGKILL together with its executor JVM and
the executor's Python workers. Spark re-runs the lost tasks on the surviving executor, the query goes on, and
an independent read_committed consumer finds every expected record exactly once and no aborted record.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sparkeos.verify import assert_exactly_once, read_values
from support.crash import (
    TAG_VARIABLE,
    Driver,
    InputFeeder,
    batch_in_flight,
    caught_up,
    command_line,
    committed_batches,
    descendants,
    environment_of,
    job_output,
    kill_processes,
    kill_tree,
    pipeline_job_args,
    process_tree,
    wait_until_no_tagged_processes,
    wait_until_stable,
)
from support.spark import create_topic, unique, wait_for

SOURCE_PARTITIONS = 4
SINK_PARTITIONS = 2
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class StandaloneCluster:
    """Spark's standalone master and workers, run from the installed pyspark package."""

    def __init__(self, directory: Path, tag: str):
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.directory = directory
        self.tag = tag
        self.master_port, self.master_ui_port = free_port(), free_port()
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def _spawn(self, name: str, arguments: list[str]) -> subprocess.Popen:
        environment = {
            **os.environ,
            TAG_VARIABLE: self.tag,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.directory),
            "SPARK_DAEMON_MEMORY": "512m",
            "SPARK_LOCAL_DIRS": str(self.directory / "local"),
            "PYSPARK_PYTHON": sys.executable,
        }
        with open(self.directory / f"{name}.log", "w") as log:
            # A session of its own: the worker's executors share its process group.
            return subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *arguments],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )

    def start(self, workers: int) -> StandaloneCluster:
        self.master = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_ui_port),
            ],
        )
        wait_for(lambda: self.state() is not None, timeout_s=120, what="the Spark master")
        for index in range(workers):
            work_dir = self.directory / f"worker-{index}"
            work_dir.mkdir()
            self.workers.append(
                self._spawn(
                    f"worker-{index}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(free_port()),
                        "--webui-port",
                        str(free_port()),
                        "--cores",
                        "1",
                        "--memory",
                        "1g",
                        "--work-dir",
                        str(work_dir),
                        self.url,
                    ],
                )
            )
        wait_for(lambda: self.alive_workers() == workers, timeout_s=120, what=f"{workers} workers to register")
        return self

    def state(self) -> dict | None:
        """The master's JSON status page, or None while it is not up."""
        if self.master is not None and self.master.poll() is not None:
            raise AssertionError(f"the Spark master exited:\n{(self.directory / 'master.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=5) as page:
                return json.load(page)
        except OSError:
            return None

    def alive_workers(self) -> int:
        state = self.state() or {}
        return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")

    def executors_of(self, worker: int) -> list[int]:
        return [pid for pid in descendants(self.workers[worker].pid) if EXECUTOR_CLASS in command_line(pid)]

    def python_workers_of(self, worker: int) -> list[int]:
        return [
            pid
            for pid in descendants(self.workers[worker].pid)
            if "pyspark.daemon" in command_line(pid) or "pyspark.worker" in command_line(pid)
        ]

    def kill_worker_when(self, worker: int, moment) -> list[int]:
        """SIGKILL a worker with its executor JVM and the executor's Python processes, as a machine loss, as soon
        as `moment()` is true. The process tree is listed beforehand, so the kill follows the moment at once."""
        process = self.workers[worker]
        pids, groups = process_tree(process.pid)
        wait_for(moment, timeout_s=120, interval_s=0.02, what="the moment to kill the worker")
        kill_processes(pids, groups)
        process.wait(30)
        wait_for(lambda: not any(_alive(pid) for pid in pids), timeout_s=20, what="the worker's processes to die")
        return pids

    def stop(self) -> None:
        for process in [*self.workers, self.master]:
            if process is not None:
                kill_tree(process.pid)
                process.wait(30)
        wait_until_no_tagged_processes(self.tag)


def executor_id(pid: int) -> str:
    arguments = command_line(pid)
    return arguments[arguments.index("--executor-id") + 1]


def executor_counts(ui_port: int, field: str, endpoint: str = "executors") -> dict[str, int]:
    """One count per executor id from the driver's REST API ({} while it is not up); `allexecutors` includes
    dead executors."""
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    try:
        with urllib.request.urlopen(base, timeout=5) as page:
            application = json.load(page)[0]["id"]
        with urllib.request.urlopen(f"{base}/{application}/{endpoint}", timeout=5) as page:
            return {executor["id"]: executor[field] for executor in json.load(page)}
    except (OSError, IndexError, KeyError, ValueError):
        return {}


def active_tasks(ui_port: int) -> dict[str, int]:
    return executor_counts(ui_port, "activeTasks")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def check_executor_python(cluster: StandaloneCluster, worker: int) -> None:
    """The executor and its Python workers use this test's interpreter (the venv with sparkeos installed)."""
    executors = cluster.executors_of(worker)
    assert len(executors) == 1, f"worker {worker} runs executors {executors}"
    assert environment_of(executors[0]).get("PYSPARK_PYTHON") == sys.executable
    pythons = wait_for(
        lambda: cluster.python_workers_of(worker), timeout_s=120, what=f"Python workers of worker {worker}'s executor"
    )
    interpreters = {command_line(pid)[0] for pid in pythons}
    assert interpreters == {sys.executable}, f"executor Python workers run {interpreters}"


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
