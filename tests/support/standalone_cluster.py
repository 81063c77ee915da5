"""A real Spark standalone cluster on this machine, for the tests that lose a worker or run speculative tasks.

A master and workers are started from the pyspark installation (its bin/spark-class), each in a session of its
own, so that a worker can be killed with SIGKILL together with its executor JVM and the executor's Python workers,
as a machine loss. Every process carries the tag of `support.crash`, so that `stop` can prove nothing survived.

Each worker may get a loopback address of its own (127.0.0.1, 127.0.0.2, ...): Spark never runs a speculative copy
of a task on a host that already runs an attempt of it, so speculation needs workers on two hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from sparkeos.ports import free_port
from sparkeos.processes import descendants, kill_processes, kill_tree, process_tree
from support.crash import TAG_VARIABLE, command_line, environment_of, wait_until_no_tagged_processes
from support.spark import wait_for

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
MASTER_HOST = "127.0.0.1"


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
        return f"spark://{MASTER_HOST}:{self.master_port}"

    def _spawn(self, name: str, arguments: list[str], host: str = MASTER_HOST) -> subprocess.Popen:
        environment = {
            **os.environ,
            TAG_VARIABLE: self.tag,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": host,
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

    def start(self, workers: int, hosts: Sequence[str] = ()) -> StandaloneCluster:
        """Start the master and `workers` workers of 1 core each; worker i listens on `hosts[i]` (default
        127.0.0.1)."""
        self.master = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                MASTER_HOST,
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_ui_port),
            ],
        )
        wait_for(lambda: self.state() is not None, timeout_s=120, what="the Spark master")
        for index in range(workers):
            host = hosts[index] if index < len(hosts) else MASTER_HOST
            work_dir = self.directory / f"worker-{index}"
            work_dir.mkdir()
            self.workers.append(
                self._spawn(
                    f"worker-{index}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        host,
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
                    host,
                )
            )
        wait_for(lambda: self.alive_workers() == workers, timeout_s=120, what=f"{workers} workers to register")
        return self

    def state(self) -> dict | None:
        """The master's JSON status page, or None while it is not up."""
        if self.master is not None and self.master.poll() is not None:
            raise AssertionError(f"the Spark master exited:\n{(self.directory / 'master.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{MASTER_HOST}:{self.master_ui_port}/json/", timeout=5) as page:
                return json.load(page)
        except OSError:
            return None
        except ValueError:
            # A master still starting its web UI can answer /json/ with its HTML page.
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

    def kill_worker_when(self, worker: int, moment, interval_s: float = 0.02) -> list[int]:
        """SIGKILL a worker with its executor JVM and the executor's Python processes, as a machine loss, as soon
        as `moment()` is true. The process tree is listed beforehand, so the kill follows the moment at once."""
        process = self.workers[worker]
        pids, groups = process_tree(process.pid)
        wait_for(moment, timeout_s=120, interval_s=interval_s, what="the moment to kill the worker")
        kill_processes(pids, groups)
        process.wait(30)
        wait_for(lambda: not any(alive(pid) for pid in pids), timeout_s=20, what="the worker's processes to die")
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


def application_api(ui_port: int, endpoint: str):
    """A page of the driver's REST API about its (only) application, or None while it is not up."""
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    try:
        with urllib.request.urlopen(base, timeout=5) as page:
            application = json.load(page)[0]["id"]
        with urllib.request.urlopen(f"{base}/{application}/{endpoint}", timeout=5) as page:
            return json.load(page)
    except (OSError, IndexError, KeyError, ValueError):
        return None


def executor_counts(ui_port: int, field: str, endpoint: str = "executors") -> dict[str, int]:
    """One count per executor id from the driver's REST API ({} while it is not up); `allexecutors` includes
    dead executors."""
    try:
        return {executor["id"]: executor[field] for executor in application_api(ui_port, endpoint) or []}
    except (KeyError, TypeError):
        return {}


def active_tasks(ui_port: int) -> dict[str, int]:
    return executor_counts(ui_port, "activeTasks")


def alive(pid: int) -> bool:
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
