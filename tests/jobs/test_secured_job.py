"""A job file on a secured cluster, end to end: SASL_SSL, SCRAM-SHA-512 and the authorizer on, the job's principal
allowed exactly what docs/security.md lists, its password in an environment variable that the job file's `kafka:`
section names. `sparkeos run` and its driver are killed with SIGKILL after a committed batch and started
again; an independent reader then sees the job's output exactly once, `sparkeos audit` finds it exact and
`sparkeos lag` reads the query's lag through the same principal. On the embedded broker and on Apache Kafka."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType

from sparkeos.processes import kill_tree, live_processes
from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from sparkeos.verify import assert_exactly_once, read_values
from support.crash import committed_batches
from support.secured import allow, secured_broker
from support.spark import unique, wait_for

PRINCIPAL, PREFIX = "User:etl", "people-json"
PASSWORD_VARIABLE = "SPARKEOS_TEST_KAFKA_PASSWORD"
RECORDS = 300


def people(count: int) -> list[bytes]:
    return [json.dumps({"id": n, "name": f"person {n}", "age": n % 40}).encode() for n in range(count)]


def adults(count: int) -> list[bytes]:
    return [f"PERSON {n}".encode() for n in range(count) if n % 40 >= 18]


def job_file(tmp_path: Path, cluster, source: str, sink: str) -> Path:
    document = {
        "name": "people-json",
        "kafka": {key: value for key, value in cluster.client_config("etl").items() if key != "sasl.password"}
                 | {"sasl.password": "${" + PASSWORD_VARIABLE + "}"},
        "source": {"subscribe": source, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 40,
                   "groupIdPrefix": PREFIX},
        "format": {"type": "json", "schema": "id INT, name STRING, age INT"},
        "transforms": [{"sql": "SELECT id, upper(name) AS name FROM input WHERE age >= 18"}],
        "output": {"value": "name"},
        "sink": {"topic": sink, "options": {"transactionalIdPrefix": PREFIX}},
        "checkpoint": str(tmp_path / "checkpoint"),
        "trigger": "1 second",
    }
    path = tmp_path / "people-json.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def sparkeos(log: Path, *arguments: str, env: dict[str, str], **options) -> subprocess.Popen:
    """The command, its output going to `log` (a pipe nobody reads would fill and stop it)."""
    with open(log, "w") as output:
        return subprocess.Popen([sys.executable, "-m", "sparkeos", *arguments], stdout=output,
                                stderr=subprocess.STDOUT, text=True, env=env, **options)


def finished(run: subprocess.Popen, log: Path, timeout_s: float) -> str:
    run.wait(timeout_s)
    return log.read_text(errors="replace")


@pytest.mark.apache_kafka(newest_only=True)
def test_a_job_on_a_secured_cluster_is_exact_through_a_kill_and_is_audited_and_its_lag_read(tmp_path, broker_kind):
    with secured_broker(tmp_path / "secured", broker_kind) as cluster:
        source, sink = unique("people"), unique("adults")
        admin = AdminClient(cluster.client_config("admin"))
        for future in admin.create_topics([NewTopic(source, 2, 1), NewTopic(sink, 2, 1)]).values():
            future.result(30)
        cluster.create_acls([
            *allow(PRINCIPAL, ResourceType.TOPIC, source, [AclOperation.READ]),
            *allow(PRINCIPAL, ResourceType.TOPIC, sink, [AclOperation.WRITE]),
            *allow(PRINCIPAL, ResourceType.TOPIC, DEFAULT_MARKER_TOPIC, [
                AclOperation.CREATE, AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE_CONFIGS]),
            *allow(PRINCIPAL, ResourceType.TRANSACTIONAL_ID, PREFIX, [AclOperation.WRITE], prefixed=True),
            *allow(PRINCIPAL, ResourceType.GROUP, PREFIX, [AclOperation.READ], prefixed=True),
        ])
        producer = Producer({**cluster.client_config("admin"), "enable.idempotence": True})
        for value in people(RECORDS):
            producer.produce(source, value)
        assert producer.flush(30) == 0
        job = job_file(tmp_path, cluster, source, sink)
        env = {**os.environ, PASSWORD_VARIABLE: cluster.passwords["etl"]}
        checkpoint = tmp_path / "checkpoint"
        expected = adults(RECORDS)

        def output() -> list:
            return read_values(cluster.bootstrap_servers, sink, config=cluster.client_config("admin"))

        logs = {name: tmp_path / f"{name}.log" for name in ("first-run", "second-run", "audit", "lag")}
        run = sparkeos(logs["first-run"], "run", str(job), "--master", "local[2]", env=env)
        try:
            wait_for(lambda: len(committed_batches(checkpoint)) >= 2 or run.poll() is not None, timeout_s=240,
                     interval_s=0.2, what="the job's second committed batch")
            assert run.poll() is None, logs["first-run"].read_text()[-5000:]
        finally:
            # The supervisor and its driver, which runs in a session of its own, with its JVM and workers.
            killed = kill_tree(run.pid)
            run.wait()
        wait_for(lambda: not live_processes(killed), timeout_s=30, what="the killed run's processes to go")
        assert len(output()) < len(expected), "the kill came after the job had written everything"

        run = sparkeos(logs["second-run"], "run", str(job), "--master", "local[2]", env=env)
        try:
            wait_for(lambda: len(output()) >= len(expected) or run.poll() is not None, timeout_s=240,
                     interval_s=1, what="the job's whole output")
            run.send_signal(signal.SIGTERM)
            log = finished(run, logs["second-run"], 120)
        finally:
            if run.poll() is None:
                kill_tree(run.pid)
                run.wait()
        assert run.returncode == 0, log[-5000:]
        assert_exactly_once(expected, output())

        # The audit reads the output as well as the input.
        cluster.create_acls(allow(PRINCIPAL, ResourceType.TOPIC, sink, [AclOperation.READ]))
        audit = sparkeos(logs["audit"], "audit", str(job), "--bootstrap-servers", cluster.bootstrap_servers,
                         "--input", source, "--output", sink, "--master", "local[2]", "--json", env=env)
        log = finished(audit, logs["audit"], 300)
        assert audit.returncode == 0, log[-5000:]
        report = json.loads(log.strip().splitlines()[-1])
        assert report["expected"] == report["delivered"] == len(expected), report

        properties = tmp_path / "client.properties"
        properties.write_text("".join(f"{key}={value}\n" for key, value in cluster.client_config("etl").items()
                                      if key != "bootstrap.servers"))
        lag = sparkeos(logs["lag"], "lag", "--checkpoint", str(checkpoint), "--bootstrap-servers",
                       cluster.bootstrap_servers, "--command-config", str(properties), "--json", env=env)
        log = finished(lag, logs["lag"], 120)
        assert lag.returncode == 0, log[-5000:]
        answer = json.loads(log.strip().splitlines()[-1])
        assert answer["total_lag"] == 0, answer
