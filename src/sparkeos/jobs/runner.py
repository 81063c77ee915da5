"""`sparkeos run JOB.yaml`: a supervisor that runs the job's Spark driver as a child process and applies the job's
restart strategy (Flink's fixed-delay, failure-rate or exponential-delay, `restart`) when the driver fails or dies.

The driver keeps nothing but the checkpoint location, so a restarted driver resumes from the
checkpoint: Spark re-plans the unfinished batch from its offset log and the sink's markers make the
replay exactly once. The supervisor writes a JSON status file (progress, restarts) for dashboards.

The driver's Spark settings, from weakest to strongest: the defaults below, the job file's `spark:` section, and
`sparkeos run --conf` (or, for a driver that spark-submit starts through `sparkeos/jobs/submit.py`, whatever
spark-submit was given: its --conf, --master, spark-defaults.conf).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..metrics import MetricsExporter
from ..processes import kill_tree
from ..spark.metric_events import METRICS_DIR_ENV, QUERY_PROGRESS, emit
from ..spark.workers import worker_python
from .console import RunConsole, snapshot
from .quiet import (
    check_log_level,
    pump_stderr,
    quiet_third_party_warnings,
    setup_logging,
    with_kafka_log_level,
    with_quiet_jvm_start,
)
from .restart import RestartStrategy, restart_strategy
from .spec import JobError, JobSpec, check_spark_key, load_job

log = logging.getLogger("sparkeos.run")

DRIVER_MODULE = "sparkeos.jobs.runner"
DEFAULT_MASTER = "local[*]"
MASTER_ENV = "SPARKEOS_MASTER"
LOG_LEVEL_ENV = "SPARKEOS_LOG_LEVEL"  # sparkeos.spark.reports: from which level the driver's batch reports show
# Defaults of every driver `sparkeos run` starts. Spark's log level is the one setting among them for every master:
# the driver's stderr is the job's log, and Spark's INFO and WARN lines would drown the job's own.
DEFAULT_SPARK_CONF = {"spark.log.level": "ERROR"}
# For local masters only: a job on one machine has little data per batch, and the console would fight Spark's
# progress bar. A cluster keeps Spark's defaults (200 shuffle partitions). The web UI stays on everywhere; the
# driver prints its address.
LOCAL_SPARK_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
}
# What Spark's launcher and SparkContext accept as a master (SparkSubmit, SparkContext.createTaskScheduler).
_LOCAL_MASTER = re.compile(r"local|local\[(\d+|\*)\]|local\[(\d+|\*)\s*,\s*\d+\]"
                           r"|local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]")
_HOST_PORT = r"(\[[^\]\s]+\]|[^\s,/:\[\]]+):\d+"
_SPARK_MASTER = re.compile(rf"spark://{_HOST_PORT}(,{_HOST_PORT})*")


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def check_master(master: str) -> str:
    """`master`, if Spark would accept it; else a ValueError saying which forms Spark accepts. Only the form is
    checked: any host, port, cluster manager or core count is Spark's to judge."""
    text = master.strip()
    if text == "yarn" or (text.startswith("k8s://") and len(text) > len("k8s://")):
        return text
    if text.startswith("local"):
        if _LOCAL_MASTER.fullmatch(text) and not re.match(r"local\[0*[,\]]", text):
            return text
        raise ValueError(f"Spark master {master!r} is not one of local, local[N], local[*], local[N,F] "
                         "(F attempts per task) or local-cluster[workers,cores,memory MB]")
    if text.startswith("spark"):
        if _SPARK_MASTER.fullmatch(text):
            return text
        raise ValueError(f"Spark master {master!r} is not of the form spark://HOST:PORT (or spark://H1:P1,H2:P2 "
                         "for standby masters)")
    if text.startswith("k8s"):
        raise ValueError(f"Spark master {master!r}: a Kubernetes master is k8s://https://HOST:PORT")
    raise ValueError(f"Spark master {master!r} is not one Spark accepts: yarn, spark://HOST:PORT, "
                     "k8s://https://HOST:PORT, local, local[N], local[*], local[N,F] or local-cluster[...]")


def parse_conf(pairs: list[str]) -> dict[str, str]:
    """`--conf KEY=VALUE` arguments, the later of two for one key winning (as spark-submit takes them)."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--conf {pair!r}: expected KEY=VALUE")
        check_spark_key(key.strip(), lambda message, pair=pair: ValueError(f"--conf {pair!r}: {message}"))
        settings[key.strip()] = value
    return settings


def resolve_master(master: str | None, spec: JobSpec, conf: dict[str, str]) -> str:
    """--master, else spark.master from --conf or the job file, else $SPARKEOS_MASTER, else local[*]; checked."""
    chosen = master or conf.get("spark.master") or spec.spark.get("spark.master") or os.environ.get(MASTER_ENV)
    try:
        return check_master(chosen or DEFAULT_MASTER)
    except ValueError as exc:
        raise JobError(str(exc)) from None


def spark_settings(spec: JobSpec, master: str | None, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's Spark settings: defaults, then the low-latency switch's if the job turns it on, then the job's
    `spark:` section, then `overrides` (--conf)."""
    from ..spark.low_latency import SETTINGS as LOW_LATENCY_SETTINGS

    defaults = {**DEFAULT_SPARK_CONF, **(LOCAL_SPARK_CONF if (master or "").startswith("local") else {})}
    if spec.low_latency:
        defaults.update(LOW_LATENCY_SETTINGS)
    return {**defaults, **spec.spark, **(overrides or {})}


def quiet_clients(spec: JobSpec, level: str) -> JobSpec:
    """The job with its Kafka clients logging at `level` (see `quiet`), unless its options set kafka.log_level."""
    from dataclasses import replace

    sink = spec.sink
    if sink.is_kafka:
        sink = replace(sink, options=with_kafka_log_level(sink.options, level))
    return replace(spec, source=with_kafka_log_level(spec.source, level), sink=sink)


# --- the driver (child process) -----------------------------------------------------------------


def run_driver(job_path: str, master: str | None, available_now: bool, progress_file: Path | None,
               conf: dict[str, str] | None = None, log_level: str = "INFO", submitted: dict[str, str] | None = None
               ) -> int:
    """Run the streaming query until it stops (SIGTERM, or caught up with --available-now).

    `submitted`: the Spark settings spark-submit started the driver with, when it did (then `master` is None); the
    defaults and the job file's settings do not override them."""
    import sparkeos.spark

    from .pipeline import build, load_transforms

    try:
        spec = quiet_clients(load_job(job_path), log_level)
        # Before Spark starts: a transform that cannot load fails the driver at once, not after a JVM's start.
        load_transforms(spec)
    except ValueError as exc:  # JobError too: the file may have changed since the supervisor read it
        print(f"sparkeos run: {exc}", file=sys.stderr, flush=True)
        return 1
    if submitted is None:
        master = master or resolve_master(None, spec, conf or {})
        settings = with_quiet_jvm_start(spark_settings(spec, master, conf))
        settings.pop("spark.master", None)
    else:
        settings = {k: v for k, v in spark_settings(spec, submitted.get("spark.master"), conf).items()
                    if k not in submitted}
    spark = sparkeos.spark.session(spec.name, master=master, config=settings)
    if spark.sparkContext.uiWebUrl:
        log.info("Spark UI at %s", spark.sparkContext.uiWebUrl)
    query = start_query(spark, spec, build(spark, spec).output, available_now)
    stopping = []

    def stop(_signum, _frame) -> None:
        stopping.append(True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    progress_sent: set[tuple[str, int]] = set()
    while not stopping:
        if query.awaitTermination(0.5):
            break
        send_progress(query, progress_sent)
        if progress_file is not None:
            report_progress(query, progress_file)
    if stopping:
        query.stop()
    send_progress(query, progress_sent)
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


def send_progress(query, sent: set[tuple[str, int]]) -> None:
    """Each new batch's progress as an event for the supervisor's metrics exporter (when it reads events). Polled
    here rather than through a StreamingQueryListener, whose calls from the JVM need py4j's callback server."""
    if not os.environ.get(METRICS_DIR_ENV):
        return
    current = set()
    for progress in query.recentProgress:
        key = (progress["runId"], progress["batchId"])
        current.add(key)
        if key not in sent:
            emit(QUERY_PROGRESS, json.loads(progress.json))
    # Spark keeps the latest progress updates only: what it dropped cannot come back.
    sent.clear()
    sent.update(current)


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
    """Starts the driver, restarts it per the job's restart strategy, and can kill it (for crash drills).

    `clock` is the monotonic clock the restart strategy's decisions are taken on."""

    def __init__(self, job_path: str, master: str | None = None, available_now: bool = False,
                 status_file: Path | None = None, env: dict[str, str] | None = None, log_file: Path | None = None,
                 conf: dict[str, str] | None = None, log_level: str | None = None,
                 clock: Callable[[], float] = time.monotonic, strategy: RestartStrategy | None = None,
                 metrics_port: int | None = None, console: RunConsole | None = None):
        self.job_path = job_path
        self.spec = load_job(job_path)
        self.conf = dict(conf or {})
        self.master = resolve_master(master, self.spec, self.conf)
        self.available_now = available_now
        self.status_file = status_file
        self.env = env
        self.log_file = log_file
        self.log_level = check_log_level(log_level or {**os.environ, **(env or {})}.get(LOG_LEVEL_ENV) or "INFO")
        self.clock = clock
        self.strategy = strategy or restart_strategy(self.spec.restart)
        self.restarts = 0
        self.driver: subprocess.Popen | None = None
        self._stderr_pump: threading.Thread | None = None
        # run() reads the drivers' metrics events (sparkeos.metrics) from a directory of its own, serves them on
        # metrics_port if given, and shows them on `console`; its counters go on across driver restarts.
        self.metrics_port = metrics_port
        self.console = console
        self.exporter: MetricsExporter | None = None
        self.state = "starting"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", DRIVER_MODULE, "--driver", self.job_path, "--master", self.master,
                   "--log-level", self.log_level]
        for key, value in self.conf.items():
            command += ["--conf", f"{key}={value}"]
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
        env.setdefault("PYSPARK_PYTHON", worker_python(self.master))
        # The batch reports of the driver's sinks (sparkeos.spark.reports) follow the level asked.
        env[LOG_LEVEL_ENV] = self.log_level
        if self.exporter is not None:
            env[METRICS_DIR_ENV] = str(self.exporter.directory)
        # Its own process group: a crash drill kills the driver's JVM and Python workers with it.
        output = open(self.log_file, "ab") if self.log_file is not None else None  # noqa: SIM115 - the child owns it
        self.driver = subprocess.Popen(self.command(), env=env, start_new_session=True, stdout=output,
                                       stderr=subprocess.STDOUT if output else subprocess.PIPE)
        if output is not None:
            output.close()
        else:
            assert self.driver.stderr is not None
            self._stderr_pump = pump_stderr(self.driver.stderr)
        self.write_status("running")

    def _drain_stderr(self) -> None:
        """Wait (briefly) until the driver's last lines are copied: its own last words come before ours."""
        if self._stderr_pump is not None:
            self._stderr_pump.join(10)
            self._stderr_pump = None

    def kill_driver(self) -> None:
        """kill -9 of the whole driver: Python, its JVM, its Python workers (pyspark's daemon among them, in a process
        group of its own)."""
        if self.driver is not None and self.driver.poll() is None:
            kill_tree(self.driver.pid)
            self.driver.wait()
        self._drain_stderr()

    def stop(self) -> None:
        """SIGTERM to the driver's Python process alone: it stops its query, and its JVM and Python workers end with
        it (a SIGTERM to the whole group would end the JVM under the query's stop). What is left after a minute, or
        of the group a few seconds after the driver, is killed."""
        if self.driver is not None and self.driver.poll() is None:
            os.kill(self.driver.pid, signal.SIGTERM)
            try:
                self.driver.wait(60)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + 10
            while self.driver.poll() is None or _group_alive(self.driver.pid):
                if time.monotonic() >= deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.driver.pid, signal.SIGKILL)
                    self.driver.wait()
                    break
                time.sleep(0.1)
        self._drain_stderr()
        self.write_status("stopped")

    def write_status(self, state: str) -> None:
        self.state = state
        if self.status_file is not None:
            write_json_atomically(self.status_file, {"state": state, "restarts": self.restarts,
                                                     "driver_pid": self.driver.pid if self.driver else None})

    def next_delay(self) -> float | None:
        """The driver has failed (now): how long to wait before restarting it, or None when the strategy gives up."""
        return self.strategy.on_failure(self.clock())

    def restart(self, delay: float, stopping: list | None = None) -> None:
        """Start the driver again after `delay` seconds (no restart once `stopping` holds anything)."""
        self.restarts += 1
        if self.exporter is not None:
            self.exporter.count_restart()
        code = self.driver.returncode if self.driver else "?"
        log.warning("driver exited with %s; restart %d in %.1f s (restart strategy %s)", code, self.restarts, delay,
                    self.strategy.describe())
        self.write_status("restarting")
        deadline = time.monotonic() + delay
        while not stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        if not stopping:
            self.start_driver()

    def run(self) -> int:
        """Block until the driver finishes for good; the exit code of `sparkeos run`."""
        directory = Path(tempfile.mkdtemp(prefix="sparkeos-metrics-"))
        dead_letters = self.spec.bad_records.topic if self.spec.bad_records.policy == "dead-letter" else None
        self.exporter = MetricsExporter(directory, dead_letters).start(self.metrics_port)
        if self.exporter.port is not None:
            log.info("metrics on http://%s:%d/metrics", socket.gethostname(), self.exporter.port)
        try:
            return self._supervise()
        finally:
            self.exporter.stop()
            if self.console is not None:
                self.console.close(snapshot(self.exporter.metrics, self.state))
            shutil.rmtree(directory, ignore_errors=True)

    def _supervise(self) -> int:
        stopping: list[bool] = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
        signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
        self.start_driver()
        while True:
            if stopping:
                self.stop()
                return 0
            code = self.driver.poll() if self.driver else 0
            if code is None:
                if self.console is not None:
                    self.console.show(snapshot(self.exporter.metrics, self.state))
                time.sleep(0.2)
                continue
            self._drain_stderr()
            if code == 0:
                self.write_status("finished")
                return 0
            delay = self.next_delay()
            if delay is None:
                self.write_status("failed")
                print(f"sparkeos run: driver failed (exit {code}) and the restart strategy "
                      f"{self.strategy.describe()} allows no more restarts ({self.restarts} so far)", file=sys.stderr)
                return 1
            self.restart(delay, stopping)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    """The driver: `python -m sparkeos.jobs.runner --driver JOB.yaml ...`, as the supervisor starts it."""
    import argparse

    parser = argparse.ArgumentParser(prog=DRIVER_MODULE)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--master")
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--progress-file", type=Path)
    parser.add_argument("--conf", action="append", default=[])
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    quiet_third_party_warnings()
    setup_logging(check_log_level(args.log_level))
    return run_driver(args.driver, args.master, args.available_now, args.progress_file, parse_conf(args.conf),
                      args.log_level)


def submit_main(argv: list[str] | None = None) -> int:
    """The driver as spark-submit runs it (`sparkeos/jobs/submit.py JOB.yaml [--available-now]`): the settings
    spark-submit was given win over the job file's, and spark-submit's cluster manager does the restarting."""
    import argparse

    from pyspark import SparkConf, SparkContext

    parser = argparse.ArgumentParser(prog="spark-submit ... sparkeos/jobs/submit.py")
    parser.add_argument("job", help="the job file")
    parser.add_argument("--available-now", action="store_true",
                        help="process what is in the input now, then stop (Trigger.AvailableNow)")
    parser.add_argument("--progress-file", type=Path, help="keep the query's progress there, as JSON")
    parser.add_argument("--log-level", default=os.environ.get(LOG_LEVEL_ENV) or "INFO",
                        help="DEBUG, INFO (default, or $SPARKEOS_LOG_LEVEL), WARNING or ERROR")
    args = parser.parse_args(argv)
    level = check_log_level(args.log_level)
    quiet_third_party_warnings()
    setup_logging(level)
    try:
        load_job(args.job)
    except JobError as exc:
        print(f"sparkeos: {exc}", file=sys.stderr)
        return 2
    # spark-submit's JVM is running already: its settings (--conf, --master, spark-defaults.conf) are read from it
    # before the SparkContext starts, so that neither the defaults nor the job file override them.
    SparkContext._ensure_initialized()
    submitted = dict(SparkConf().getAll())
    return run_driver(args.job, None, args.available_now, args.progress_file, None, level, submitted)


if __name__ == "__main__":
    sys.exit(main())
