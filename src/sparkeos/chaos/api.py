"""The chaos run from Python, for a test of your own pipeline: `run(job, ...)` runs `sparkeos chaos` on a job file, or
on a job built in code (a dict in the job file's shape, its transformation your functions as `python: module:function`
steps), and returns the report.

    from sparkeos.chaos import run

    def test_my_pipeline_is_exact_under_faults(tmp_path):
        report = run(my_job(), faults="driver-kill-mid-commit=10,broker-kill=20", duration_s=60)
        assert report.exact, report.problems or report.audit.summary()

The run goes in a process of its own, as `sparkeos chaos` does: its drivers, its audit's Spark session and its sandbox
never meet a Spark session of the calling process. The modules your steps name are found as the caller finds them
(its `sys.path` is handed on).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from .faults import DEFAULT_MASTER
from .report import ChaosReport, report_from_json


class ChaosRunFailed(RuntimeError):
    """`sparkeos chaos` ended without a report: bad arguments or a job it cannot run (the message is its own)."""


def run(job: str | Path | dict[str, Any], faults: str | dict[str, float] | None = None, *, seed: int = 1,
        rate: int = 100, duration_s: float = 120.0, partitions: int = 2, master: str = DEFAULT_MASTER,
        timeout_s: float = 900.0, workdir: str | Path | None = None, report_html: str | Path | None = None,
        env: dict[str, str] | None = None, bootstrap_server: str | None = None,
        sample_input: int | None = None, kafka_version: str | None = None,
        use_job_endpoints: bool = False) -> ChaosReport:
    """Run `job` (a job file, or a job as a dict) under `faults` (`--faults`'s text, or {kind: mean seconds}; None
    for every kind that applies) and return the report; the other arguments are `sparkeos chaos`'s options."""
    with tempfile.TemporaryDirectory(prefix="sparkeos-chaos-api-") as scratch:
        if isinstance(job, dict):
            job_file = Path(scratch) / "job.yaml"
            job_file.write_text(yaml.safe_dump(job, sort_keys=False))
        else:
            job_file = Path(job)
        command = [sys.executable, "-m", "sparkeos", "chaos", str(job_file), "--json", "--seed", str(seed),
                   "--rate", str(rate), "--duration", str(duration_s), "--partitions", str(partitions),
                   "--master", master, "--timeout", str(timeout_s)]
        if faults is not None:
            command += ["--faults", faults if isinstance(faults, str)
                        else ",".join(f"{kind}={seconds}" for kind, seconds in faults.items())]
        if workdir is not None:
            command += ["--workdir", str(workdir)]
        if bootstrap_server is not None:
            command += ["--bootstrap-server", bootstrap_server]
        if kafka_version is not None:
            command += ["--kafka-version", kafka_version]
        if use_job_endpoints:
            command.append("--use-job-endpoints")
        if sample_input is not None:
            command += ["--sample-input", str(sample_input)]
        if report_html is not None:
            command += ["--report", str(report_html)]
        environment = {**os.environ, **(env or {})}
        environment["PYTHONPATH"] = os.pathsep.join(
            [part for part in (environment.get("PYTHONPATH") or "").split(os.pathsep) if part]
            + [entry for entry in sys.path if entry and Path(entry).is_dir()])
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + 300, env=environment)
    lines = result.stdout.strip().splitlines()
    if result.returncode not in (0, 1) or not lines or not lines[-1].startswith("{"):
        raise ChaosRunFailed(result.stderr.strip().splitlines()[-1] if result.stderr.strip()
                             else f"sparkeos chaos exited with {result.returncode}")
    return report_from_json(json.loads(lines[-1]))
