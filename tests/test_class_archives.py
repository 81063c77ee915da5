"""Class-data-sharing archives (sparkeos/class_archives.py): one per JDK and class path, made by a run that exits
normally, published whole, mapped by later JVMs, and never required; the test run's own (support/class_archives.py)
mapped by its Spark drivers and Apache Kafka nodes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sparkeos import class_archives
from support import apache_kafka
from support.class_archives import spark_driver_archive


def mapped_files(pid: int) -> set[str]:
    return {line.split(maxsplit=5)[5] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if len(line.split(maxsplit=5)) == 6}


def java(*options: str) -> subprocess.CompletedProcess:
    return subprocess.run(["java", *options, "-version"], capture_output=True, text=True, timeout=120)


def test_an_archive_is_named_by_its_jdk_and_class_path_and_published_only_once_written(tmp_path: Path) -> None:
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"one")
    archive = class_archives.archive_path("program", "java", [jar], cache_dir=tmp_path)
    assert archive == class_archives.archive_path("program", "java", [jar], cache_dir=tmp_path)
    assert archive != class_archives.archive_path("other", "java", [jar], cache_dir=tmp_path)
    jar.write_bytes(b"two, longer")
    assert archive != class_archives.archive_path("program", "java", [jar], cache_dir=tmp_path)
    assert class_archives.use_options(archive) == []

    options, written = class_archives.dump_options(archive)
    # A run that died before it exited wrote nothing: nothing is published.
    assert not class_archives.publish(written, archive) and not archive.exists()
    done = java(*options)
    assert done.returncode == 0 and "Warning" not in done.stdout + done.stderr, done.stderr
    assert class_archives.publish(written, archive) and archive.is_file() and not written.exists()
    assert java("-Xshare:on", *class_archives.use_options(archive)).returncode == 0


def test_a_jvm_given_an_archive_it_cannot_use_runs_without_it_and_says_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "foreign.jsa"
    archive.write_bytes(b"not an archive " * 1000)
    done = java(*class_archives.use_options(archive))
    assert done.returncode == 0, done.stderr
    assert "cds" not in (done.stdout + done.stderr).lower(), done.stderr
    # Refused when sharing is demanded: the archive really was unusable.
    assert java("-Xshare:on", *class_archives.use_options(archive)).returncode != 0


def test_the_runs_spark_drivers_map_their_archive(spark) -> None:
    archive = spark_driver_archive()
    assert archive.is_file(), "the run made no archive for Spark's drivers: see the warnings of tests/conftest.py"
    assert str(archive) in os.environ["SPARK_SUBMIT_OPTS"]
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    assert str(archive) in mapped_files(pid)


@pytest.mark.parametrize("version", apache_kafka.tested_versions())
def test_an_apache_kafka_node_maps_its_versions_archive(version: str, apache_kafka_nodes) -> None:
    cluster = apache_kafka_nodes.node(version)
    assert cluster.class_archive.is_file(), "the run made no archive for this version: see tests/conftest.py's warnings"
    assert str(cluster.class_archive) in mapped_files(cluster.nodes[1].process.pid)


def test_each_test_process_arms_failpoints_of_its_own() -> None:
    """Making the archives imports nothing into the run's first process that sets the environment the test processes
    inherit: with one failpoint directory for all, a failpoint armed by one test fired in another's query."""
    from support.spark import FAILPOINT_DIR

    assert FAILPOINT_DIR == Path(f"/tmp/sparkeos-failpoints-{os.getpid()}")
