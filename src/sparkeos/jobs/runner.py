"""`sparkeos run JOB.yaml`: a supervisor that runs the job's Spark driver as a child process and applies
the job's restart strategy when the driver fails or dies (like Flink's fixedDelayRestart).

The driver keeps nothing but the checkpoint location, so a restarted driver resumes from the
checkpoint: Spark re-plans the unfinished batch from its offset log and the sink's markers make the
replay exactly once. The supervisor writes a JSON status file (progress, restarts) for dashboards.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..spark.workers import worker_python
from .spec import JobSpec, load_job

log = logging.getLogger("sparkeos.run")

DRIVER_MODULE = "sparkeos.jobs.runner"


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


# --- the driver (child process) -----------------------------------------------------------------


def run_driver(job_path: str, master: str | None, available_now: bool, progress_file: Path | None) -> int:
    """Run the streaming query until it stops (SIGTERM, or caught up with --available-now)."""
    spec = load_job(job_path)
    import sparkeos.spark

    from .pipeline import build

    spark = sparkeos.spark.session(spec.name, master=master or os.environ.get("SPARKEOS_MASTER") or "local[*]",
                                   config={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    query = start_query(spark, spec, build(spark, spec).output, available_now)
    stopping = []

    def stop(_signum, _frame) -> None:
        stopping.append(True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        if query.awaitTermination(0.5):
            break
        if progress_file is not None:
            report_progress(query, progress_file)
    if stopping:
        query.stop()
    if progress_file is not None:
        report_progress(query, progress_file)
    error = query.exception()
    if error is not None:
        print(f"sparkeos run: query failed: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


def start_query(spark, spec: JobSpec, output, available_now: bool):
    writer = output.writeStream.format(spec.sink.format).options(**spec.sink.options)
    writer = writer.option("checkpointLocation", spec.checkpoint).queryName(spec.name.replace("-", "_"))
    if spec.window is not None and spec.window.time == "event":
        writer = writer.outputMode("append")
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif spec.window is not None and spec.window.time == "processing":
        writer = writer.trigger(processingTime=spec.window.duration)
    elif spec.trigger_s is not None:
        writer = writer.trigger(processingTime=f"{int(spec.trigger_s * 1000)} milliseconds")
    return writer.start()


def report_progress(query, path: Path) -> None:
    progress = query.recentProgress
    totals = read_json(path)
    seen = set(totals.get("batches_seen", []))
    for item in progress:
        if item["batchId"] in seen:
            continue
        seen.add(item["batchId"])
        totals["input_rows"] = totals.get("input_rows", 0) + item.get("numInputRows", 0)
        totals["output_rows"] = totals.get("output_rows", 0) + item.get("sink", {}).get("numOutputRows", 0)
    totals["batches_seen"] = sorted(seen)[-1000:]
    totals["last_batch"] = max(seen) if seen else None
    totals["pid"] = os.getpid()
    write_json_atomically(path, totals)


# --- the supervisor -----------------------------------------------------------------------------


class Supervisor:
    """Starts the driver, restarts it per the restart strategy, and can kill it (for crash drills)."""

    def __init__(self, job_path: str, master: str | None = None, available_now: bool = False,
                 status_file: Path | None = None, env: dict[str, str] | None = None, log_file: Path | None = None):
        self.job_path = job_path
        self.spec = load_job(job_path)
        self.master = master
        self.available_now = available_now
        self.status_file = status_file
        self.env = env
        self.log_file = log_file
        self.restarts = 0
        self.driver: subprocess.Popen | None = None

    def command(self) -> list[str]:
        command = [sys.executable, "-m", DRIVER_MODULE, "--driver", self.job_path]
        if self.master:
            command += ["--master", self.master]
        if self.available_now:
            command.append("--available-now")
        if self.status_file is not None:
            command += ["--progress-file", str(self.progress_file)]
        return command

    @property
    def progress_file(self) -> Path:
        assert self.status_file is not None
        return self.status_file.with_name(self.status_file.name + ".progress")

    def start_driver(self) -> None:
        env = {**os.environ, **(self.env or {})}
        env["PYSPARK_PYTHON"] = worker_python(self.master or env.get("SPARKEOS_MASTER") or "local[*]")
        # Its own process group: a crash drill kills the driver's JVM and Python workers with it.
        output = open(self.log_file, "ab") if self.log_file is not None else None  # noqa: SIM115 - the child owns it
        self.driver = subprocess.Popen(self.command(), env=env, start_new_session=True, stdout=output,
                                       stderr=subprocess.STDOUT if output else None)
        if output is not None:
            output.close()
        self.write_status("running")

    def kill_driver(self) -> None:
        """kill -9 of the whole driver: Python, its JVM, its Python workers."""
        if self.driver is not None and self.driver.poll() is None:
            os.killpg(self.driver.pid, signal.SIGKILL)
            self.driver.wait()

    def stop(self) -> None:
        if self.driver is not None and self.driver.poll() is None:
            os.killpg(self.driver.pid, signal.SIGTERM)
            try:
                self.driver.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.driver.pid, signal.SIGKILL)
                self.driver.wait()
        self.write_status("stopped")

    def write_status(self, state: str) -> None:
        if self.status_file is not None:
            write_json_atomically(self.status_file, {"state": state, "restarts": self.restarts,
                                                     "driver_pid": self.driver.pid if self.driver else None})

    def restart_allowed(self) -> bool:
        return self.restarts < self.spec.restart.attempts

    def restart(self) -> None:
        self.restarts += 1
        log.warning("driver exited with %s; restart %d of %d in %.1f s", self.driver.returncode if self.driver else "?",
                    self.restarts, self.spec.restart.attempts, self.spec.restart.delay_s)
        self.write_status("restarting")
        time.sleep(self.spec.restart.delay_s)
        self.start_driver()

    def run(self) -> int:
        """Block until the driver finishes for good; the exit code of `sparkeos run`."""
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
        signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
        self.start_driver()
        while True:
            if stopping:
                self.stop()
                return 0
            code = self.driver.poll() if self.driver else 0
            if code is None:
                time.sleep(0.2)
                continue
            if code == 0:
                self.write_status("finished")
                return 0
            if not self.restart_allowed():
                self.write_status("failed")
                print(f"sparkeos run: driver failed (exit {code}) and the restart strategy allows no more restarts "
                      f"({self.spec.restart.attempts})", file=sys.stderr)
                return 1
            self.restart()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog=DRIVER_MODULE)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--master")
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--progress-file", type=Path)
    args = parser.parse_args(argv)
    return run_driver(args.driver, args.master, args.available_now, args.progress_file)


if __name__ == "__main__":
    sys.exit(main())
