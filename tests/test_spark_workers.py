"""The program Spark runs for Python workers in a local session (sparkeos.spark.workers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkeos.spark.workers import spark_pyspark_zip, worker_python

SHOW_PATHS = "import os, sys, pyspark; print(os.environ['PYTHONPATH']); print(sys.executable); print(pyspark.__file__)"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "sparkeos"


def run_as_spark_would(program: str, pythonpath: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run([program, "-c", SHOW_PATHS], env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.splitlines()


def test_local_workers_import_the_installed_pyspark_not_sparks_zip(cache):
    zipped = spark_pyspark_zip()
    assert zipped is not None and zipped.endswith("pyspark/python/lib/pyspark.zip")
    program = worker_python("local[2]")
    assert Path(program).parent == cache and os.access(program, os.X_OK)
    # Spark's own order: its zip first, then what the job adds (py-files and the like, any characters).
    pythonpath, executable, imported = run_as_spark_would(program, f"{zipped}:/jobs/a b.zip:/jobs/c*.py::/jobs/d")
    assert pythonpath == "/jobs/a b.zip:/jobs/c*.py::/jobs/d"
    assert executable == sys.executable
    assert ".zip" not in imported and Path(imported).parent == Path(zipped).parents[2]
    # What plain Spark would run imports its zip: the difference the script makes.
    assert ".zip" in run_as_spark_would(sys.executable, zipped)[2]


def test_the_script_is_written_once_and_rewritten_if_damaged(cache):
    program = Path(worker_python("local[*]"))
    written = program.stat().st_mtime_ns
    assert worker_python("local-cluster[2,1,1024]") == str(program)
    assert program.stat().st_mtime_ns == written
    program.write_text("#!/bin/sh\nexit 3\n")
    assert worker_python("local") == str(program)
    assert "exec " in program.read_text() and os.access(program, os.X_OK)
    assert [p.name for p in cache.iterdir()] == [program.name]


@pytest.mark.parametrize("master", [None, "spark://127.0.0.1:7077", "yarn", "k8s://https://api:6443"])
def test_cluster_masters_get_this_interpreter(cache, master):
    """Executors elsewhere need not have the script; they run what the driver runs, as before."""
    assert worker_python(master) == sys.executable
    assert not cache.exists()


def test_a_spark_home_of_its_own_gets_this_interpreter(cache, tmp_path, monkeypatch):
    """A separate Spark distribution's zip need not match the installed package."""
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark-4.3.0-bin"))
    assert spark_pyspark_zip() is None
    assert worker_python("local[2]") == sys.executable


def test_no_writable_cache_gets_this_interpreter(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARK_HOME", raising=False)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert worker_python("local[2]") == sys.executable


def test_the_shared_local_session_runs_its_workers_through_the_script(spark):
    assert spark.sparkContext.pythonExec == worker_python("local[2]") != sys.executable
    imported = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("pyspark").__file__).collect()
    assert ".zip" not in imported[0]
