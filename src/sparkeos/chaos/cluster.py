"""A Spark standalone cluster on this machine: a master and workers run from the installed pyspark package.

`sparkeos chaos` starts one when it kills executors and the job's master is local: in local mode the executor is the
driver's own JVM. Each process runs in a session of its own (a worker's executors share its process group), and every
one inherits the environment given, which the workers hand on to their executors and those to their Python workers.

Each worker may listen on a loopback address of its own (127.0.0.1, 127.0.0.2, ...): Spark never runs a speculative
copy of a task on a host that already runs an attempt of it, so speculation needs workers on two hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from ..ports import free_port
from ..processes import command_line, kill_processes, kill_tree, process_table, process_tree

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
MASTER_HOST = "127.0.0.1"
START_TIMEOUT_S = 120


class ClusterError(RuntimeError):
    """The cluster did not come up; the message holds the end of the failing process's log."""


def executor_of(pid: int) -> int | None:
    """The executor JVM `pid` runs under (itself, or an ancestor: an executor's Python daemon and workers), if any."""
    table = process_table()
    while pid in table and pid > 1:
        if EXECUTOR_CLASS in command_line(pid):
            return pid
        pid = table[pid][0]
    return None


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.2):
    """`predicate()`'s first true value, polled until `timeout_s`; ClusterError naming `what` after that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"gave up waiting for {what} after {timeout_s:.0f} s")
        time.sleep(interval_s)


class StandaloneCluster:
    """Spark's standalone master and workers of one core each, logging into `directory`."""

    def __init__(self, directory: Path, env: dict[str, str] | None = None, worker_memory: str = "1g"):
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.directory = Path(directory)
        self.env = dict(env or {})
        self.worker_memory = worker_memory
        self.master_port, self.master_ui_port = free_port(), free_port()
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"spark://{MASTER_HOST}:{self.master_port}"

    def _spawn(self, name: str, arguments: list[str], host: str = MASTER_HOST) -> subprocess.Popen:
        environment = {
            **os.environ,
            **self.env,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": host,
            "SPARK_LOG_DIR": str(self.directory),
            "SPARK_DAEMON_MEMORY": "512m",
            "SPARK_LOCAL_DIRS": str(self.directory / "local"),
            "PYSPARK_PYTHON": sys.executable,
        }
        with open(self.directory / f"{name}.log", "w") as log:
            return subprocess.Popen([str(self.home / "bin" / "spark-class"), *arguments], stdout=log,
                                    stderr=subprocess.STDOUT, env=environment, start_new_session=True)

    def start(self, workers: int, hosts: Sequence[str] = ()) -> StandaloneCluster:
        """Start the master and `workers` workers; worker i listens on `hosts[i]` (default 127.0.0.1)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", MASTER_HOST,
                                             "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)])
        wait_until(lambda: self.state() is not None, START_TIMEOUT_S, "the Spark master")
        for index in range(workers):
            host = hosts[index] if index < len(hosts) else MASTER_HOST
            work_dir = self.directory / f"worker-{index}"
            work_dir.mkdir()
            self.workers.append(self._spawn(
                f"worker-{index}",
                ["org.apache.spark.deploy.worker.Worker", "--host", host, "--port", str(free_port()),
                 "--webui-port", str(free_port()), "--cores", "1", "--memory", self.worker_memory,
                 "--work-dir", str(work_dir), self.url],
                host))
        wait_until(lambda: self.alive_workers() == workers, START_TIMEOUT_S, f"{workers} Spark workers to register")
        return self

    def state(self) -> dict | None:
        """The master's JSON status page, or None while it is not up."""
        if self.master is not None and self.master.poll() is not None:
            raise ClusterError(f"the Spark master exited:\n{(self.directory / 'master.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{MASTER_HOST}:{self.master_ui_port}/json/", timeout=5) as page:
                return json.load(page)
        except OSError:
            return None
        except ValueError:  # a master still starting its web UI can answer /json/ with its HTML page
            return None

    def alive_workers(self) -> int:
        state = self.state() or {}
        return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")

    def kill_executor(self, executor: int) -> None:
        """kill -9 of an executor JVM and its Python daemon and workers, not of the worker that launched it (whose
        process group it shares): the worker stays, and starts another executor for the application."""
        pids, groups = process_tree(executor)
        kill_processes(pids, groups - {process_table().get(executor, (0, 0, ""))[1]})

    def stop(self) -> None:
        """kill -9 of the workers with their executors, then of the master."""
        for process in [*self.workers, self.master]:
            if process is not None:
                kill_tree(process.pid)
                process.wait(30)
