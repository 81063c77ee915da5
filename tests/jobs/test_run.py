"""`sparkeos run` as a user runs it: Spark settings from the job file and --conf, any Spark master (a local
standalone cluster here), spark-submit, a real restart, and nothing on the terminal but the job's own lines."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sparkeos.jobs.runner import check_master
from sparkeos.verify import assert_exactly_once, read_values
from support.spark import create_topic, produce, unique, wait_for
from support.standalone_cluster import StandaloneCluster

SCHEMA = "id INT, name STRING, identifyNumber STRING"
PROBE_KEYS = ("spark.sql.shuffle.partitions", "spark.sparkeos.test.file", "spark.sparkeos.test.both",
              "spark.sparkeos.test.cli", "spark.ui.enabled", "spark.log.level", "spark.app.name")
# A job's Python transform that records the Spark settings of the session it runs in. It imports confluent-kafka's
# schema registry client, as a transform might, which has authlib warn of a deprecation; its first
# SPARKEOS_TEST_PROBE_FAILURES imports fail, which fails the driver before Spark starts.
PROBE = f'''
import json
import os
import pathlib

from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: F401

DIRECTORY = pathlib.Path(os.environ["SPARKEOS_TEST_PROBE_DIR"])
IMPORTS = DIRECTORY / "imports"
count = int(IMPORTS.read_text()) if IMPORTS.exists() else 0
IMPORTS.write_text(str(count + 1))
if count < int(os.environ.get("SPARKEOS_TEST_PROBE_FAILURES", "0")):
    raise ImportError(f"import {{count + 1}} of the probe fails on purpose")


def record(frame):
    spark = frame.sparkSession
    settings = {{key: spark.conf.get(key, None) for key in {PROBE_KEYS!r}}}
    settings["master"] = spark.sparkContext.master
    (DIRECTORY / "settings.json").write_text(json.dumps(settings))
    return frame
'''
# What no run may print: librdkafka's own log lines, third-party deprecation warnings, Spark's and Java's start-up.
NOISE = re.compile(r"^%\d\||DeprecationWarning|FutureWarning|INFO py4j|Using Spark's default log4j profile|"
                   r"Setting default log level|WARNING: Using incubator modules", re.MULTILINE)


def people(count: int) -> list[str]:
    return [json.dumps({"id": i, "name": f"n{i}", "identifyNumber": f"{i:018d}" if i % 4 else f"{i:017d}"})
            for i in range(count)]


def expected_numbers(count: int) -> Counter:
    return Counter(f"{i:018d}".encode() for i in range(count) if i % 4)


def probe_job(tmp_path: Path, bootstrap: str, source: str, sink: str, **changes) -> Path:
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sparkeos_conf_probe.py").write_text(PROBE)
    document = {
        "name": "conf-probe",
        "source": {"kafka.bootstrap.servers": bootstrap, "subscribe": source, "startingOffsets": "earliest"},
        "format": {"type": "json", "schema": SCHEMA},
        "transforms": [{"python": "sparkeos_conf_probe:record"},
                       {"sql": "SELECT * FROM input WHERE length(identifyNumber) = 18"}],
        "output": {"value": "identifyNumber"},
        "sink": {"topic": sink},
        "checkpoint": str(tmp_path / "checkpoint"),
        "spark": {"spark.sql.shuffle.partitions": 7, "spark.sparkeos.test.file": "from the file",
                  "spark.sparkeos.test.both": "from the file"},
        **changes,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def probe_env(tmp_path: Path, failures: int = 0) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "probe"), os.environ.get("PYTHONPATH", "")]),
            "SPARKEOS_TEST_PROBE_DIR": str(tmp_path / "probe"), "SPARKEOS_TEST_PROBE_FAILURES": str(failures)}


def recorded_settings(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "probe" / "settings.json").read_text())


def test_run_restarts_a_failed_driver_applies_the_spark_settings_stops_on_sigterm_and_prints_no_noise(broker,
                                                                                                      tmp_path):
    """The first driver fails (its transform does not import), the restart strategy starts a second, which reads
    the input under the job file's and --conf's settings (--conf wins) until `sparkeos run` gets SIGTERM and stops
    the query. At --log-level ERROR nothing but errors reaches the terminal: not the restart's warning, not the
    sink's batch reports, not librdkafka's warnings (each of the source's consumers warns of the producer setting
    linger.ms), and no traceback of a driver whose JVM went before its query."""
    bootstrap = broker.bootstrap_servers
    source, sink = create_topic(bootstrap, unique("in"), 2), create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, people(200))
    job = probe_job(tmp_path, bootstrap, source, sink, restart={
        "strategy": "exponential-delay", "initial-backoff": "300 ms", "jitter-factor": 0})
    document = yaml.safe_load(job.read_text())
    document["source"]["kafka.linger.ms"] = 5
    job.write_text(yaml.safe_dump(document))
    status = tmp_path / "status.json"
    started = time.monotonic()
    run = subprocess.Popen(
        [sys.executable, "-m", "sparkeos", "run", str(job), "--master", "local[2]",
         "--conf", "spark.sql.shuffle.partitions=3", "--conf", "spark.sparkeos.test.both=from --conf",
         "--conf", "spark.sparkeos.test.cli=a=b", "--status-file", str(status), "--log-level", "ERROR"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=probe_env(tmp_path, failures=1))
    try:
        wait_for(lambda: len(read_values(bootstrap, sink)) >= 150 or run.poll() is not None, timeout_s=240,
                 interval_s=1, what="the job's output")
        run.send_signal(signal.SIGTERM)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    output = stdout + stderr
    assert run.returncode == 0, output[-5000:]
    assert json.loads(status.read_text())["state"] == "stopped"
    assert json.loads(status.read_text())["restarts"] == 1
    assert (tmp_path / "probe" / "imports").read_text() == "2"
    assert "import 1 of the probe fails on purpose" in stderr
    assert_exactly_once(expected_numbers(200), read_values(bootstrap, sink))
    assert recorded_settings(tmp_path) == {
        "spark.sql.shuffle.partitions": "3", "spark.sparkeos.test.file": "from the file",
        "spark.sparkeos.test.both": "from --conf", "spark.sparkeos.test.cli": "a=b",
        "spark.ui.enabled": None, "spark.log.level": "ERROR", "spark.app.name": "conf-probe",
        "master": "local[2]"}
    noise = NOISE.findall(output) + re.findall(r"(?:INFO|WARNING) sparkeos\.\w+|Traceback", output)
    assert not noise, f"noise on the terminal: {noise}\n{output[-5000:]}"
    print(f"run with one restart: {time.monotonic() - started:.1f} s")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--master", "local[x]"], "is not one of local, local[N]"),
        (["--master", "mesos://host:5050"], "is not one Spark accepts"),
        (["--master", "spark://host"], "is not of the form spark://HOST:PORT"),
        (["--conf", "spark.sql.shuffle.partitions"], "--conf 'spark.sql.shuffle.partitions': expected KEY=VALUE"),
        (["--conf", "sql.shuffle.partitions=2"], "'sql.shuffle.partitions' is not a Spark setting"),
        (["--log-level", "loud"], "log level must be one of DEBUG, INFO, WARNING, ERROR"),
    ],
)
def test_run_refuses_a_bad_master_setting_or_level_before_starting(tmp_path, arguments, message):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"source": {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"},
                                   "sink": {"topic": "o"}, "checkpoint": str(tmp_path / "ck")}))
    result = subprocess.run([sys.executable, "-m", "sparkeos", "run", str(job), *arguments], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "ck").exists()


def test_a_master_from_the_environment_or_the_job_file_is_checked_too(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"source": {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"},
                                   "sink": {"topic": "o"}, "checkpoint": str(tmp_path / "ck"),
                                   "spark": {"spark.master": "yarn-client"}}))
    result = subprocess.run([sys.executable, "-m", "sparkeos", "run", str(job)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "Spark master 'yarn-client' is not one Spark accepts" in result.stderr
    job.write_text(yaml.safe_dump({"source": {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"},
                                   "sink": {"topic": "o"}, "checkpoint": str(tmp_path / "ck")}))
    result = subprocess.run([sys.executable, "-m", "sparkeos", "run", str(job)], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "SPARKEOS_MASTER": "local[0]"})
    assert result.returncode == 2 and "Spark master 'local[0]'" in result.stderr


@pytest.mark.parametrize("master", ["local", "local[4]", "local[*]", "local[2,3]", "local[*, 4]",
                                    "local-cluster[2, 1, 1024]", "spark://host:7077", "spark://h1:7077,h2:7077",
                                    "spark://[::1]:7077", "yarn", "k8s://https://host:6443", "k8s://host:443"])
def test_masters_spark_accepts(master):
    assert check_master(master) == master


@pytest.mark.parametrize("master", ["local[0]", "local[x]", "local[ 2 ]", "locale", "local-cluster[2]",
                                    "spark://host", "spark://host:7077/path", "yarn-client", "mesos://h:5050",
                                    "k8s:/host", "k8s://", ""])
def test_masters_spark_refuses(master):
    with pytest.raises(ValueError, match="Spark master"):
        check_master(master)


@pytest.mark.timeout(600)
def test_on_a_standalone_cluster_with_sparkeos_run_and_with_spark_submit(broker, tmp_path):
    """One standalone master and worker; the job runs there through `sparkeos run --master spark://...`, then through
    spark-submit with the job's submit script. Each time the settings reach the session, with the command line's
    winning over the job file's, and the output is exact."""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), 2)
    produce(bootstrap, source, people(120))
    cluster = StandaloneCluster(tmp_path, unique("cluster"))
    timings = {}
    try:
        started = time.monotonic()
        cluster.start(workers=1)
        timings["cluster start"] = time.monotonic() - started

        run_dir, sink = tmp_path / "run", create_topic(bootstrap, unique("out"))
        run_dir.mkdir()
        job = probe_job(run_dir, bootstrap, source, sink)
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "sparkeos", "run", str(job), "--master", cluster.url, "--available-now",
             "--conf", "spark.sql.shuffle.partitions=3", "--conf", "spark.sparkeos.test.both=from --conf",
             "--conf", "spark.executor.memory=512m"],
            capture_output=True, text=True, timeout=280, env=probe_env(run_dir))
        timings["sparkeos run"] = time.monotonic() - started
        assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
        assert_exactly_once(expected_numbers(120), read_values(bootstrap, sink))
        settings = recorded_settings(run_dir)
        assert settings["master"] == cluster.url
        assert (settings["spark.sql.shuffle.partitions"], settings["spark.sparkeos.test.file"],
                settings["spark.sparkeos.test.both"]) == ("3", "from the file", "from --conf")
        assert settings["spark.ui.enabled"] is None, "a cluster keeps Spark's web UI"
        applications = (cluster.state() or {}).get("completedapps", [])
        assert [app["name"] for app in applications] == ["conf-probe"]

        submit_dir, sink = tmp_path / "submit", create_topic(bootstrap, unique("out"))
        submit_dir.mkdir()
        job = probe_job(submit_dir, bootstrap, source, sink)
        import sparkeos.jobs.submit

        spark_submit = Path(sys.executable).parent / "spark-submit"
        started = time.monotonic()
        result = subprocess.run(
            [str(spark_submit), "--master", cluster.url, "--conf", "spark.sql.shuffle.partitions=5",
             "--conf", "spark.executor.memory=512m", sparkeos.jobs.submit.__file__, str(job), "--available-now"],
            capture_output=True, text=True, timeout=280,
            env={**probe_env(submit_dir), "PYSPARK_PYTHON": sys.executable})
        timings["spark-submit"] = time.monotonic() - started
        assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
        assert_exactly_once(expected_numbers(120), read_values(bootstrap, sink))
        settings = recorded_settings(submit_dir)
        assert settings["master"] == cluster.url
        assert (settings["spark.sql.shuffle.partitions"], settings["spark.sparkeos.test.file"],
                settings["spark.log.level"]) == ("5", "from the file", "ERROR")
        assert len((cluster.state() or {}).get("completedapps", [])) == 2
    finally:
        cluster.stop()
    print("timings:", {name: round(seconds, 1) for name, seconds in timings.items()})
