"""The low-latency switch (sparkeos.spark.low_latency): its settings, who wins over them, and the planner workers'
frozen garbage collector. That the output stays exact with the switch on is proven where the guarantee is: the
driver-crash tests of each sink turn it on for every other driver."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparkeos.jobs.runner import spark_settings
from sparkeos.jobs.spec import JobError, parse_job
from sparkeos.spark.low_latency import SETTINGS, with_low_latency


def job(**changes) -> dict:
    return {"source": {"kafka.bootstrap.servers": "b:1", "subscribe": "in"}, "sink": {"topic": "out"},
            "checkpoint": "/ck", **changes}


def test_explicit_settings_win_over_the_switch():
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    assert with_low_latency(None) == SETTINGS
    assert with_low_latency({key: "500", "spark.other": "x"}) == {**SETTINGS, key: "500", "spark.other": "x"}


def test_a_job_file_turns_it_on_under_its_spark_section_and_the_command_line():
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    assert not SETTINGS.items() & spark_settings(parse_job(job()), "local[2]").items()
    on = parse_job(job(low_latency=True))
    assert SETTINGS.items() <= spark_settings(on, "local[2]").items()
    assert spark_settings(parse_job(job(low_latency=True, spark={key: 500})), "local[2]")[key] == "500"
    assert spark_settings(on, "local[2]", {key: "100"})[key] == "100"


def test_a_job_file_value_that_is_not_a_boolean_is_refused():
    with pytest.raises(JobError, match="low_latency: must be true or false"):
        parse_job(job(low_latency="yes"))


FREEZE_PROBE = """
import gc
from sparkeos.spark.gc_pause import freeze_planner_worker_once
freeze_planner_worker_once()
print(gc.get_freeze_count())
"""


@pytest.mark.parametrize(("in_a_spark_worker", "frozen"), [(True, True), (False, False)])
def test_a_sinks_planner_worker_freezes_what_it_holds_and_a_driver_does_not(in_a_spark_worker, frozen):
    environment = {k: v for k, v in os.environ.items() if k != "PYTHON_WORKER_FACTORY_SECRET"}
    if in_a_spark_worker:
        environment["PYTHON_WORKER_FACTORY_SECRET"] = "set by Spark for its workers"
    result = subprocess.run([sys.executable, "-c", FREEZE_PROBE], capture_output=True, text=True, env=environment,
                            timeout=60, check=True)
    assert (int(result.stdout) > 0) == frozen
