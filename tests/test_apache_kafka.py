"""The Apache Kafka harness the connectors are proven on (sparkeos/apache_kafka.py, sparkeos/maven.py): jars from
Maven Central, single nodes of each version, a three-node cluster whose nodes are killed -9 and restarted."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sparkeos import apache_kafka
from sparkeos.maven import MavenUnavailable, cached_jars
from sparkeos.verify import read_values
from support.crash import wait_until_stable
from support.spark import create_topic, wait_for


def test_transaction_coordinators_are_placed_as_kafka_places_them() -> None:
    # Java's String.hashCode of each, as printed by a JVM; "polygenelubricants" hashes to Integer.MIN_VALUE, which
    # Kafka's Utils.abs maps to 0.
    assert apache_kafka._java_string_hash_abs("") == 0
    assert apache_kafka._java_string_hash_abs("abc") == 96354
    assert apache_kafka._java_string_hash_abs("sparkeos-0") == 1109442479
    assert apache_kafka._java_string_hash_abs("polygenelubricants") == 0
    assert apache_kafka._java_string_hash_abs("\U0001f600") == 1772899  # a surrogate pair counts as two units


def test_jars_missing_from_the_cache_without_maven_name_what_to_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    with pytest.raises(MavenUnavailable, match="install Maven"):
        cached_jars("kafka-clients", ["org.apache.kafka:kafka-clients:3.9.1"], tmp_path / "cache")
    with pytest.raises(ValueError, match="group:artifact:version"):
        cached_jars("bad", ["org.apache.kafka:kafka-clients"], tmp_path / "cache")


def test_jars_are_fetched_once_into_a_complete_entry(tmp_path, monkeypatch) -> None:
    jars = cached_jars("kafka-clients", ["org.apache.kafka:kafka-clients:3.9.1"], tmp_path)
    names = sorted(jar.name for jar in jars)
    assert "kafka-clients-3.9.1.jar" in names and any(name.startswith("zstd-jni") for name in names)
    entry = jars[0].parent
    assert sorted((entry / ".complete").read_text().split()) == names
    # A second call takes the entry as it is, without Maven.
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    assert cached_jars("kafka-clients", ["org.apache.kafka:kafka-clients:3.9.1"], tmp_path) == jars


def test_fetch_jars_runs_on_the_standard_library_alone() -> None:
    # .ci/run calls it with the system Python before any virtualenv exists: nothing installed may be imported on its
    # way (sparkeos' own modules it takes from src/). -S leaves out every site-packages directory; the jars are in
    # the cache by now (.ci/run and the Apache Kafka tests fill it), so this mostly reads the cache.
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys._base_executable, "-S", str(root / "scripts" / "fetch_jars.py")],
                            capture_output=True, text=True, timeout=300, cwd="/")
    assert result.returncode == 0, result.stderr
    assert "Apache Kafka 4.4.0:" in result.stdout and "spark-sql-kafka" in result.stdout


def _commit_numbers(bootstrap: str, topic: str, numbers: range, transactional_id: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(60)
    producer.begin_transaction()
    for number in numbers:
        producer.produce(topic, str(number).encode(), partition=number % 3)
    producer.commit_transaction(60)


def _read_committed(bootstrap: str, topic: str) -> list[int]:
    wait_until_stable(bootstrap, topic)  # Kafka writes the commit markers after it answers EndTxn
    return [int(value) for value in read_values(bootstrap, topic)]


@pytest.mark.parametrize("version", apache_kafka.VERSIONS)
def test_a_node_of_each_version_serves_transactions_across_a_kill_9(tmp_path, version) -> None:
    with apache_kafka.ApacheKafkaCluster(tmp_path, version) as cluster:
        assert f"Kafka version: {version}" in cluster.nodes[1].log.read_text()
        create_topic(cluster.bootstrap_servers, "numbers", 3)
        _commit_numbers(cluster.bootstrap_servers, "numbers", range(0, 100), "writer")
        cluster.kill(1)
        assert not cluster.nodes[1].alive()
        cluster.restart(1)
        _commit_numbers(cluster.bootstrap_servers, "numbers", range(100, 200), "writer")
        assert sorted(_read_committed(cluster.bootstrap_servers, "numbers")) == list(range(200))


def test_a_three_node_cluster_elects_another_leader_and_takes_its_node_back(tmp_path) -> None:
    with apache_kafka.ApacheKafkaCluster(tmp_path, nodes=3) as cluster:
        settings = cluster.broker_settings(cluster.nodes[1])
        assert (settings["default.replication.factor"], settings["min.insync.replicas"]) == (3, 2)
        create_topic(cluster.bootstrap_servers, "numbers", 3)
        _commit_numbers(cluster.bootstrap_servers, "numbers", range(0, 100), "writer")
        coordinator = cluster.transaction_coordinator("writer")
        leader = cluster.leader_of("numbers", 0)
        cluster.kill(leader)
        wait_for(lambda: cluster.leader_of("numbers", 0) not in (leader, -1), timeout_s=60,
                 what="a new leader of numbers-0")
        if coordinator != leader:
            cluster.kill(coordinator)
        # Two of three nodes hold every partition's in-sync replicas, or one: writes go on once both are back.
        cluster.restart(leader)
        if coordinator != leader:
            cluster.restart(coordinator)
        _commit_numbers(cluster.bootstrap_servers, "numbers", range(100, 200), "writer")
        assert sorted(_read_committed(cluster.bootstrap_servers, "numbers")) == list(range(200))


def test_a_port_taken_between_choosing_and_binding_is_chosen_anew(tmp_path) -> None:
    """The cluster picks its ports when it is made and Kafka binds them seconds later; another process (an outgoing
    connection's ephemeral port, another test's server) may take one in between. The first start picks new ones."""
    cluster = apache_kafka.ApacheKafkaCluster(tmp_path / "kafka", apache_kafka.VERSIONS[0])
    node = cluster.nodes[1]
    taken = node.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with cluster:
            assert node.port != taken
            assert "Address already in use" in node.log.read_text(errors="replace")
            topic = create_topic(cluster.bootstrap_servers, "after-a-taken-port")
            producer = Producer({"bootstrap.servers": cluster.bootstrap_servers})
            producer.produce(topic, b"served")
            assert producer.flush(30) == 0
            assert read_values(cluster.bootstrap_servers, topic) == [b"served"]


def test_a_secured_node_authenticates_its_users_and_lets_them_do_only_what_acls_allow(tmp_path) -> None:
    """SASL_SSL with SCRAM users made at format time and the StandardAuthorizer: the harness of the secured-cluster
    tests, which must refuse what a production cluster refuses."""
    from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType

    from support.secured import allow, secured_broker

    with secured_broker(tmp_path, f"kafka-{apache_kafka.VERSIONS[0]}") as secured:
        cluster = secured.broker
        topic = "secured"
        admin = AdminClient(cluster.client_config("admin"))
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)

        def produce_as(config: dict[str, str]) -> list:
            """The errors of one record's produce: its delivery report's, or the client's own until the first."""
            errors: list = []
            delivered: list = []
            producer = Producer({**config, "error_cb": errors.append})
            producer.produce(topic, b"v", on_delivery=lambda error, _: delivered.append(error))

            def settled() -> bool:
                producer.poll(0.2)
                return bool(delivered or errors)

            wait_for(settled, timeout_s=60, interval_s=0, what="the record's delivery or an error")
            producer.purge()
            return [error for error in errors + delivered if error is not None]

        assert produce_as(cluster.client_config("admin")) == []
        refused = produce_as(cluster.client_config("etl"))
        assert refused and all("TOPIC_AUTHORIZATION_FAILED" in error.name() for error in refused), refused
        secured.create_acls(allow("User:etl", ResourceType.TOPIC, topic, [AclOperation.WRITE]))
        assert produce_as(cluster.client_config("etl")) == []
        wrong = produce_as({**cluster.client_config("etl"), "sasl.password": "not-the-password"})
        assert any(error.name() == "_AUTHENTICATION" for error in wrong), wrong
        plaintext = produce_as({"bootstrap.servers": cluster.bootstrap_servers})
        assert plaintext, "a PLAINTEXT client wrote to the SASL_SSL listener"
        assert read_values(cluster.bootstrap_servers, topic, config=cluster.client_config("admin")) == [b"v", b"v"]
        with pytest.raises(ValueError, match="is secured: name one of its users"):
            cluster.client_config()


def test_a_secured_cluster_is_refused_where_kafka_cannot_make_its_users(tmp_path) -> None:
    security = apache_kafka.SaslSsl(tmp_path / "keystore.pem", tmp_path / "ca.pem", {"admin": "secret"})
    with pytest.raises(ValueError, match="3.4.1 makes no SCRAM users at format time"):
        apache_kafka.ApacheKafkaCluster(tmp_path, "3.4.1", sasl_ssl=security)
    with pytest.raises(ValueError, match="is not secured: it has no user 'admin'"):
        apache_kafka.ApacheKafkaCluster(tmp_path, apache_kafka.VERSIONS[0]).client_config("admin")
