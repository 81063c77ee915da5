"""The program Spark runs for Python workers in a local session (sparkeos.spark.workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sparkeos.spark.workers import installed_py4j_version, needless_python_path, spark_package, worker_python

SHOW_PATHS = (
    "import os, sys, pyspark, py4j; print(os.environ['PYTHONPATH']); print(sys.executable); print(pyspark.__file__); "
    "print(py4j.__file__); print([p for p in sys.path if 'pyspark' in p and p.endswith(('.zip', '.jar'))])"
)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "sparkeos"


def run_as_spark_would(program: str, pythonpath: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run([program, "-c", SHOW_PATHS], env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.splitlines()


def sparks_own_python_path() -> list[str]:
    """The archives Spark puts first on a worker's PYTHONPATH when pyspark is pip-installed: its pyspark and py4j
    zips and the spark-core jar it was loaded from."""
    package = spark_package()
    assert package is not None
    py4j_zip = package / "python" / "lib" / f"py4j-{installed_py4j_version()}-src.zip"
    (core_jar,) = (package / "jars").glob("spark-core_*.jar")
    return [str(package / "python" / "lib" / "pyspark.zip"), str(py4j_zip), str(core_jar)]


def test_local_workers_import_the_installed_pyspark_and_py4j_not_sparks_archives(cache):
    archives = sparks_own_python_path()
    assert all(Path(archive).is_file() for archive in archives)
    program = worker_python("local[2]")
    assert Path(program).parent == cache and os.access(program, os.X_OK)
    # Spark's own order: its archives first, then what the job adds (py-files and the like, any characters).
    spark_path = ":".join([*archives, "/jobs/a b.zip", "/jobs/c*.py", "", "/jobs/d"])
    pythonpath, executable, pyspark_file, py4j_file, archives_on_path = run_as_spark_would(program, spark_path)
    assert pythonpath == "/jobs/a b.zip:/jobs/c*.py::/jobs/d"
    assert executable == sys.executable
    assert Path(pyspark_file).parent == Path(archives[0]).parents[2]
    assert ".zip" not in py4j_file and Path(py4j_file).parents[1] == Path(archives[0]).parents[3]
    assert archives_on_path == "[]"
    # What plain Spark would run imports both zips and searches the jar: the difference the script makes.
    plain = run_as_spark_would(sys.executable, ":".join(archives))
    assert plain[2].startswith(archives[0]) and plain[3].startswith(archives[1]) and archives[2] in plain[4]


def test_only_archives_the_installed_packages_make_needless_are_dropped(tmp_path):
    package = tmp_path / "pyspark"
    lib, jars = package / "python" / "lib", package / "jars"
    lib.mkdir(parents=True)
    jars.mkdir()
    assert needless_python_path(package, "0.10.9.9") == []  # no pyspark zip: not a pip-installed Spark
    for name, members in [
        (lib / "pyspark.zip", ["pyspark/__init__.py"]),
        (lib / "py4j-0.10.9.9-src.zip", ["py4j/__init__.py"]),
        (jars / "spark-core_2.13-4.3.0.jar", ["org/apache/spark/SparkContext.class"]),
        (jars / "spark-core_2.13-4.3.1.jar", ["org/apache/spark/SparkContext.class", "pyspark/rdd.py"]),
        (jars / "spark-sql_2.13-4.3.0.jar", ["org/apache/spark/sql/Dataset.class"]),
    ]:
        with zipfile.ZipFile(name, "w") as archive:
            for member in members:
                archive.writestr(member, "")
    (jars / "spark-core_2.13-4.4.0.jar").write_bytes(b"not a zip")
    pyspark_zip, py4j_zip, core_jar = (
        str(lib / "pyspark.zip"),
        str(lib / "py4j-0.10.9.9-src.zip"),
        str(jars / "spark-core_2.13-4.3.0.jar"),
    )
    assert needless_python_path(package, "0.10.9.9") == [pyspark_zip, py4j_zip, core_jar]
    # py4j installed at another version than Spark's zip, or not installed: the zip stays.
    assert needless_python_path(package, "0.10.9.7") == [pyspark_zip, core_jar]
    assert needless_python_path(package, None) == needless_python_path(package, "0.10.9.7")
    assert needless_python_path(None, "0.10.9.9") == []


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
    assert spark_package() is None
    assert worker_python("local[2]") == sys.executable


def test_no_writable_cache_gets_this_interpreter(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARK_HOME", raising=False)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert worker_python("local[2]") == sys.executable


def test_the_shared_local_session_runs_its_workers_through_the_script(spark):
    assert spark.sparkContext.pythonExec == worker_python("local[2]") != sys.executable
    imported = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: (__import__("pyspark").__file__, __import__("py4j").__file__, __import__("sys").path))
        .collect()
    )
    pyspark_file, py4j_file, path = imported[0]
    assert ".zip" not in pyspark_file and ".zip" not in py4j_file
    # Spark's archives by their place, not by the names this module gives them: any spelling Spark used would show.
    assert [entry for entry in path if "pyspark" in entry and entry.endswith((".zip", ".jar"))] == []
