"""The seed's job on a secured cluster, end to end: Avro People records whose schemas live in a schema registry over
HTTPS with basic authentication, event-time windows, dead letters and the exactly-once Kafka sink, on Kafka with
SASL_SSL, SCRAM-SHA-512 and the authorizer on, the job's principal allowed exactly what docs/security.md lists. Its
passwords are in environment variables that the job file names. `sparkeos run` and its driver are killed with
SIGKILL after two committed batches, with the windows' state in the checkpoint, and started again; an independent
reader then sees every 18-character ID number once, `sparkeos audit` finds the output exact and `sparkeos lag` reads
the query's lag through the same principal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType

from sparkeos import demo
from sparkeos.processes import kill_tree, live_processes
from sparkeos.registry import SchemaRegistryServer
from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from sparkeos.verify import read_values
from support.crash import committed_batches
from support.secured import allow, secured_broker
from support.spark import wait_for

PRINCIPAL = "User:etl"
KAFKA_PASSWORD, REGISTRY_PASSWORD = "SPARKEOS_TEST_KAFKA_PASSWORD", "SPARKEOS_TEST_REGISTRY_PASSWORD"
RECORDS = 400


def job_file(tmp_path: Path, cluster, registry: SchemaRegistryServer, names: demo.DemoTopics) -> Path:
    """The demo's job (the seed's), with the secured cluster's settings and small batches, so that the kill comes
    with most of the input still to read."""
    document = demo.job_document(cluster.bootstrap_servers, registry.url, tmp_path / "checkpoint", event_time=True,
                                 names=names)
    document["kafka"] = {key: value for key, value in cluster.client_config("etl").items()
                         if key != "sasl.password"} | {"sasl.password": "${" + KAFKA_PASSWORD + "}"}
    document["format"]["registry"] = {"url": registry.url, "basic.auth.user.info": "etl:${" + REGISTRY_PASSWORD + "}",
                                      "ssl.ca.location": str(cluster.ca)}
    document["source"] |= {"maxOffsetsPerTrigger": 40, "groupIdPrefix": names.prefix}
    path = tmp_path / "people-etl.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def job_acls(names: demo.DemoTopics) -> list:
    return [
        *allow(PRINCIPAL, ResourceType.TOPIC, names.input, [AclOperation.READ]),
        *allow(PRINCIPAL, ResourceType.TOPIC, names.output, [AclOperation.WRITE]),
        *allow(PRINCIPAL, ResourceType.TOPIC, names.dead_letter, [AclOperation.WRITE]),
        *allow(PRINCIPAL, ResourceType.TOPIC, DEFAULT_MARKER_TOPIC, [
            AclOperation.CREATE, AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE_CONFIGS]),
        # One prefix for the transactional ids, the source's groups and the group its progress is committed to.
        *allow(PRINCIPAL, ResourceType.TRANSACTIONAL_ID, names.prefix, [AclOperation.WRITE], prefixed=True),
        *allow(PRINCIPAL, ResourceType.GROUP, names.prefix, [AclOperation.READ], prefixed=True),
    ]


def sparkeos(log: Path, *arguments: str, env: dict[str, str], **options) -> subprocess.Popen:
    """The command, its output going to `log` (a pipe nobody reads would fill and stop it)."""
    with open(log, "w") as output:
        return subprocess.Popen([sys.executable, "-m", "sparkeos", *arguments], stdout=output,
                                stderr=subprocess.STDOUT, text=True, env=env, **options)


def finished(run: subprocess.Popen, log: Path, timeout_s: float) -> str:
    run.wait(timeout_s)
    return log.read_text(errors="replace")


# On Apache Kafka (the embedded broker only when no Kafka version is tested): on the embedded broker the seed's job
# meets a secured cluster and a driver kill in test_demo.py's secured test.
@pytest.mark.apache_kafka(newest_only=True, embedded=False)
def test_the_seed_job_on_a_secured_cluster_is_exact_through_a_kill_and_is_audited_and_its_lag_read(tmp_path,
                                                                                                   broker_kind):
    names = demo.DemoTopics.for_run()
    with secured_broker(tmp_path / "secured", broker_kind) as cluster, SchemaRegistryServer(
            cluster.bootstrap_servers, topic=names.schemas, kafka_config=cluster.client_config("admin"),
            users={"etl": "registry-secret"}, ssl_certfile=cluster.certificates["cert"],
            ssl_keyfile=cluster.certificates["key"]) as registry:
        admin = AdminClient(cluster.client_config("admin"))
        topics = [NewTopic(names.input, 2, 1), NewTopic(names.output, 2, 1), NewTopic(names.dead_letter, 1, 1)]
        for future in admin.create_topics(topics).values():
            future.result(30)
        cluster.create_acls(job_acls(names))
        job = job_file(tmp_path, cluster, registry, names)
        generated = demo.produce_people(cluster.bootstrap_servers, job_registry(job), RECORDS, seed=11,
                                        late_sentinel=True, topic=names.input,
                                        kafka_config=cluster.client_config("admin"))
        env = {**os.environ, KAFKA_PASSWORD: cluster.passwords["etl"], REGISTRY_PASSWORD: "registry-secret"}
        checkpoint = tmp_path / "checkpoint"

        def output(topic: str = names.output) -> list:
            return read_values(cluster.bootstrap_servers, topic, config=cluster.client_config("admin"))

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
        assert len(output()) < generated.valid, "the kill came after the job had written everything"

        run = sparkeos(logs["second-run"], "run", str(job), "--master", "local[2]", env=env)
        try:
            wait_for(lambda: len(output()) >= generated.valid or run.poll() is not None, timeout_s=240,
                     interval_s=1, what="the job's whole output")
            run.send_signal(signal.SIGTERM)
            log = finished(run, logs["second-run"], 120)
        finally:
            if run.poll() is None:
                kill_tree(run.pid)
                run.wait()
        assert run.returncode == 0, log[-5000:]
        numbers = Counter(output())
        assert len(numbers) == sum(numbers.values()) == generated.valid, numbers.most_common(3)
        assert all(len(number) == 18 for number in numbers)
        assert len(output(names.dead_letter)) == generated.corrupt

        # The audit reads the output and the dead letters as well as the input.
        cluster.create_acls([*allow(PRINCIPAL, ResourceType.TOPIC, names.output, [AclOperation.READ]),
                             *allow(PRINCIPAL, ResourceType.TOPIC, names.dead_letter, [AclOperation.READ])])
        audit = sparkeos(logs["audit"], "audit", str(job), "--bootstrap-servers", cluster.bootstrap_servers,
                         "--input", names.input, "--output", names.output, "--master", "local[2]", "--json", env=env)
        log = finished(audit, logs["audit"], 300)
        assert audit.returncode == 0, log[-5000:]
        report = json.loads(log.strip().splitlines()[-1])
        assert report["expected"] == report["delivered"] == generated.valid, report

        properties = tmp_path / "client.properties"
        properties.write_text("".join(f"{key}={value}\n" for key, value in cluster.client_config("etl").items()
                                      if key != "bootstrap.servers"))
        lag = sparkeos(logs["lag"], "lag", "--checkpoint", str(checkpoint), "--bootstrap-servers",
                       cluster.bootstrap_servers, "--command-config", str(properties), "--json", env=env)
        log = finished(lag, logs["lag"], 120)
        assert lag.returncode == 0, log[-5000:]
        answer = json.loads(log.strip().splitlines()[-1])
        assert answer["total_lag"] == 0, answer


def job_registry(job: Path) -> dict[str, str]:
    """The registry settings of the job file, with the password the variable holds."""
    settings = yaml.safe_load(job.read_text())["format"]["registry"]
    return {**settings, "basic.auth.user.info": "etl:registry-secret"}
