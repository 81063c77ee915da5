"""`sparkeos demo` end to end (small N): the seed's job on the embedded broker, with and without crashes, and on an
existing cluster (`--bootstrap-servers`: the embedded broker and Apache Kafka), run as after the README's demo command:
in a virtualenv of sparkeos's runtime dependencies only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AclOperation, AdminClient, ResourceType

from sparkeos.ports import free_port
from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from support.runtime_only import runtime_environment
from support.secured import allow, secured_broker
from support.spark import create_topic, unique

EXPECTED_KEYS = {"expected", "delivered", "missing", "duplicated", "dead_lettered", "restarts"}


def run_demo(python, tmp_path, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    command = [str(python), "-m", "sparkeos", "demo", "--json", "--data-dir", str(tmp_path / "demo"), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=runtime_environment(python))
    last_line = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "{}"
    return json.loads(last_line), result


@pytest.mark.apache_kafka(newest_only=True, embedded=False)
def test_demo_on_an_existing_cluster_with_event_time_windows_is_exact(runtime_python, broker, tmp_path):
    """`--bootstrap-servers`: the demo's topics, group and schema registry topic are its run's own on the cluster,
    and are deleted once the audit found the output exact. On Apache Kafka (the embedded broker only when no Kafka
    version is tested): the embedded default mode is the README's demo command's, which CI runs, and the crash-drill
    soak's."""
    bootstrap = broker.bootstrap_servers
    # A cluster in use: its first idempotent producer has been served. On a fresh Apache Kafka node the first one
    # waits for the node to load its producer id state, and librdkafka warns about it on the terminal.
    warm_up = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    warm_up.produce(create_topic(bootstrap, unique("warm-up"), 1), b"x")
    assert warm_up.flush(60) == 0
    report, result = run_demo(runtime_python, tmp_path, "--records", "3000", "--event-time",
                              "--bootstrap-servers", bootstrap)
    assert result.returncode == 0, result.stderr[-3000:]
    assert EXPECTED_KEYS <= set(report)
    assert report["missing"] == report["duplicated"] == 0
    assert report["delivered"] == report["expected"] > 2000
    assert report["dead_lettered"] == 5
    assert "[Stage " not in result.stderr, "Spark's progress bars are drawn through the audit table"
    noise = re.findall(r"^%\d\|.*|.*(?:DeprecationWarning|FutureWarning|Using Spark's default log4j profile"
                       r"|Using incubator modules).*", result.stdout + result.stderr, re.MULTILINE)
    assert not noise, f"librdkafka's, third-party warnings' or Spark's start-up lines on the terminal: {noise}"
    prefix = report["prefix"]
    assert re.fullmatch(r"sparkeos-demo-[0-9a-f]{8}", prefix), prefix
    assert not (tmp_path / "demo" / "broker").exists(), "an embedded broker was started beside the cluster"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    left = [topic for topic in admin.list_topics(timeout=30).topics if topic.startswith(prefix)]
    assert left == [], f"the demo left its topics on the cluster: {left}"
    groups = admin.list_consumer_groups().result(30).valid
    assert not [group.group_id for group in groups if group.group_id.startswith(prefix)]


@pytest.mark.soak("tests/jobs/test_secured_job.py kills the demo's job on a secured Apache Kafka, audits it and reads "
                  "its lag; tests/test_chaos.py runs a job under faults on a secured embedded broker")
@pytest.mark.timeout(600)
def test_demo_on_a_secured_cluster_with_its_driver_killed_is_exact(runtime_python, tmp_path):
    """`--bootstrap-servers` with `--command-config`: a cluster that asks for SASL_SSL, its authorizer on, as a
    principal allowed only the demo's names (`sparkeos-demo-` and the sink's marker topic). Every client of the run
    takes the settings: the topics it makes and deletes, its schema registry's, the feeder, the job (whose file
    names the password through an environment variable, never writes it), the audit."""
    with secured_broker(tmp_path / "secured") as cluster:
        principal = "User:etl"
        cluster.create_acls([
            *allow(principal, ResourceType.TOPIC, "sparkeos-demo-", [AclOperation.ALL], prefixed=True),
            *allow(principal, ResourceType.TOPIC, DEFAULT_MARKER_TOPIC, [
                AclOperation.CREATE, AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE_CONFIGS]),
            *allow(principal, ResourceType.GROUP, "sparkeos-demo-", [AclOperation.ALL], prefixed=True),
            *allow(principal, ResourceType.GROUP, "sparkeos-", [AclOperation.READ], prefixed=True),
            *allow(principal, ResourceType.TRANSACTIONAL_ID, "sparkeos-demo-", [AclOperation.WRITE], prefixed=True),
        ])
        properties = tmp_path / "client.properties"
        properties.write_text("".join(f"{key}={value}\n" for key, value in cluster.client_config("etl").items()
                                      if key != "bootstrap.servers"))
        report, result = run_demo(runtime_python, tmp_path, "--records", "3000", "--event-time", "--crash-every",
                                  "6", "--bootstrap-servers", cluster.bootstrap_servers, "--command-config",
                                  str(properties))
        assert result.returncode == 0, result.stderr[-3000:]
        assert report["exact"] and report["missing"] == report["duplicated"] == 0, report
        assert report["delivered"] == report["expected"] > 2000 and report["dead_lettered"] == 5, report
        assert report["restarts"] >= 1, report
        job = (tmp_path / "demo" / "job.yaml").read_text()
        assert cluster.passwords["etl"] not in job and "${SPARKEOS_DEMO_SASL_PASSWORD}" in job, job
        admin = AdminClient(cluster.client_config("admin"))
        left = [topic for topic in admin.list_topics(timeout=30).topics if topic.startswith(report["prefix"])]
        assert left == [], f"the demo left its topics on the cluster: {left}"


def test_demo_names_a_cluster_it_cannot_reach_and_exits_2(runtime_python, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    report, result = run_demo(runtime_python, tmp_path, "--records", "10", "--bootstrap-servers", address)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"cannot reach Kafka at {address}" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 60


@pytest.mark.soak("CI runs the README's `sparkeos demo --crash-every 25`, which exits 0 only if exact; the demo's job "
                  "runs under driver kills in tests/test_chaos.py (people-etl)")
@pytest.mark.timeout(600)
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


@pytest.mark.parametrize(("arguments", "message"), [
    (["--bootstrap-servers", "kafka"], "expected HOST:PORT, got 'kafka'"),
    (["--bootstrap-servers", "a:9092,,b:9092"], "expected HOST:PORT, got ''"),
    (["--bootstrap-servers", "kafka:0"], "port in 'kafka:0' must be above 0"),
    (["--keep-topics"], "--keep-topics applies to --bootstrap-servers only"),
    (["-X", "security.protocol=SASL_SSL"], "-X applies to --bootstrap-servers only"),
    (["--bootstrap-servers", "kafka:9093", "-X", "security.protocol"], "-X expects KEY=VALUE, got 'security.protocol'"),
    (["--bootstrap-servers", "kafka:9093", "-X", "sasl.mechanizm=PLAIN"], "bad Kafka client property"),
    (["--bootstrap-servers", "kafka:9093", "--command-config", "/nonexistent/client.properties"],
     "cannot read --command-config /nonexistent/client.properties"),
])
def test_bad_cluster_arguments_are_refused_before_anything_starts(tmp_path, arguments, message):
    result = subprocess.run([sys.executable, "-m", "sparkeos", "demo", "--data-dir", str(tmp_path / "demo"),
                             *arguments], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "demo").exists()
