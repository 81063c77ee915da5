"""The class archives (sparkeos/class_archives.py) of the JVMs the tests start most: Spark's drivers, and Apache
Kafka's nodes of each version tested. The run makes the missing ones once, before any test (tests/conftest.py), and
gives the drivers theirs through SPARK_SUBMIT_OPTS, which spark-submit adds to a driver's JVM whoever starts it (a
test's own session, tests/support/pipeline_job.py, `sparkeos run`); the nodes map theirs by themselves. Every kill
of a driver or a node is followed by a start, and the suite starts hundreds.

The drivers' archive holds what a driver of tests/support/pipeline_job.py loads up to its first batch: the job runs
from the embedded broker to it, is stopped with SIGTERM, and its JVM writes the archive as it exits. The archives are
made by `python tests/support/class_archives.py VERSION...` (make_missing), a process of its own: what the test
modules set in the environment as they are imported (support/spark.py's failpoint directory, one per test process)
must not reach the test processes pytest-xdist starts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyspark

from sparkeos import apache_kafka, class_archives

DRIVER_OPTIONS_VARIABLE = "SPARK_SUBMIT_OPTS"
MAKE_TIMEOUT_S = 600


def spark_driver_archive() -> Path:
    """The archive for drivers of the installed pyspark, on the JDK spark-submit runs (JAVA_HOME's, or `java`)."""
    home = Path(pyspark.__file__).parent
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    return class_archives.archive_path("spark-driver", java, sorted((home / "jars").glob("*.jar")))


def make_spark_driver_archive() -> None:
    """Make the drivers' archive unless it exists; raises what kept it from being made."""
    from sparkeos.broker import EmbeddedBroker
    from support.crash import STARTUP_TIMEOUT_S, Driver, pipeline_job_args, wait_until_no_tagged_processes
    from support.pipeline_job import BATCH_PREFIX
    from support.spark import create_topic, produce, unique, wait_for

    archive = spark_driver_archive()
    if archive.is_file():
        return
    options, written = class_archives.dump_options(archive)
    directory = Path(tempfile.mkdtemp(prefix="sparkeos-class-archive-"))
    try:
        with EmbeddedBroker(directory / "broker") as broker:
            source, sink = create_topic(broker.bootstrap_servers, "in", 2), create_topic(broker.bootstrap_servers,
                                                                                         "out", 2)
            produce(broker.bootstrap_servers, source, [str(n) for n in range(1, 101)], spread_over=2)
            tag = unique("class-archive")
            driver = Driver(directory, tag, pipeline_job_args(broker.bootstrap_servers, source, sink,
                                                              directory / "checkpoint"),
                            environment={DRIVER_OPTIONS_VARIABLE: " ".join(options)}).start(0)
            try:
                wait_for(lambda: f"{BATCH_PREFIX} " in driver.output() or not driver.alive(),
                         timeout_s=STARTUP_TIMEOUT_S, what="the first batch of the class archive's driver")
                driver.process.send_signal(signal.SIGTERM)
                driver.process.wait(STARTUP_TIMEOUT_S)
                # The JVM outlives the Python driver by the time it takes to write the archive.
                wait_until_no_tagged_processes(tag, timeout_s=STARTUP_TIMEOUT_S)
            finally:
                if driver.alive():
                    driver.kill()
        if not class_archives.publish(written, archive):
            raise RuntimeError(f"the driver's JVM wrote no archive:\n{driver.error_tail()}")
    finally:
        written.unlink(missing_ok=True)
        shutil.rmtree(directory, ignore_errors=True)


def make_kafka_archive(version: str) -> None:
    """Make the archive of Apache Kafka ``version``'s nodes unless it exists; raises what kept it from being made."""
    directory = Path(tempfile.mkdtemp(prefix="sparkeos-class-archive-"))
    try:
        if not apache_kafka.make_class_archive(version, directory):
            raise RuntimeError(f"Apache Kafka {version}'s node wrote no archive")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def make_missing(versions: list[str]) -> str | None:
    """Make the drivers' archive and those of Apache Kafka ``versions`` (whose jars are cached) that are missing, in
    a process of its own; what kept any from being made, or None."""
    try:
        done = subprocess.run([sys.executable, __file__, *versions], capture_output=True, text=True,
                              timeout=MAKE_TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    except subprocess.TimeoutExpired:
        return f"making them took over {MAKE_TIMEOUT_S} s"
    return None if done.returncode == 0 else (done.stdout + done.stderr)[-3000:]


def main(versions: list[str]) -> int:
    makers = {"Spark's drivers": make_spark_driver_archive}
    for version in filter(apache_kafka.kafka_jars_cached, versions):
        makers[f"Apache Kafka {version}'s nodes"] = lambda version=version: make_kafka_archive(version)
    with ThreadPoolExecutor(len(makers)) as pool:
        outcomes = {what: pool.submit(make) for what, make in makers.items()}
    failed = {what: outcome.exception() for what, outcome in outcomes.items() if outcome.exception() is not None}
    for what, error in failed.items():
        print(f"no class archive for {what}: {error}", file=sys.stderr)
    return 1 if failed else 0


def driver_options() -> str:
    """What SPARK_SUBMIT_OPTS should hold for the drivers to map their archive: the variable's own value too."""
    return " ".join([os.environ.get(DRIVER_OPTIONS_VARIABLE, ""),
                     *class_archives.use_options(spark_driver_archive())]).strip()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
