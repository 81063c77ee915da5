"""`sparkeos demo` end to end (small N): the seed's job on the embedded broker, with and without crashes, run as after
the README's demo command: in a virtualenv of sparkeos's runtime dependencies only."""

from __future__ import annotations

import json
import re
import subprocess

from support.runtime_only import runtime_environment

EXPECTED_KEYS = {"expected", "delivered", "missing", "duplicated", "dead_lettered", "restarts"}


def run_demo(python, tmp_path, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    command = [str(python), "-m", "sparkeos", "demo", "--json", "--data-dir", str(tmp_path / "demo"), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=runtime_environment(python))
    last_line = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "{}"
    return json.loads(last_line), result


def test_demo_with_event_time_windows_is_exact(runtime_python, tmp_path):
    report, result = run_demo(runtime_python, tmp_path, "--records", "3000", "--event-time")
    assert result.returncode == 0, result.stderr[-3000:]
    assert EXPECTED_KEYS <= set(report)
    assert report["missing"] == report["duplicated"] == 0
    assert report["delivered"] == report["expected"] > 2000
    assert report["dead_lettered"] == 5
    assert "[Stage " not in result.stderr, "Spark's progress bars are drawn through the audit table"
    noise = re.findall(r"^%\d\|.*|.*(?:DeprecationWarning|FutureWarning|Using Spark's default log4j profile"
                       r"|Using incubator modules).*", result.stdout + result.stderr, re.MULTILINE)
    assert not noise, f"librdkafka's, third-party warnings' or Spark's start-up lines on the terminal: {noise}"


def test_demo_survives_driver_crashes(runtime_python, tmp_path):
    """Processing-time windows (the default), with the Spark driver killed with SIGKILL every 20 s.

    Spark aligns processing-time triggers to the wall clock, so one batch of input can be finished and reported
    in under 20 s. More records than the job's maxOffsetsPerTrigger (60,000) take two 20 s windows: the first
    kill, 20 s after the start, always comes before the job is done."""
    report, result = run_demo(runtime_python, tmp_path, "--records", "70000", "--crash-every", "20")
    assert result.returncode == 0, result.stderr[-3000:]
    assert report["restarts"] >= 1, "the crash drill never killed the driver"
    assert report["missing"] == report["duplicated"] == 0
    assert report["delivered"] == report["expected"]
    assert report["dead_lettered"] == 5
