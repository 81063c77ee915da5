"""The broker against Apache Kafka's own Java client (kafka-clients 3.9.1), the reference implementation.

tests/support/java/KafkaCheck.java is compiled once per session; each scenario runs it as a child JVM against a
fresh broker and must print `OK <scenario>`. Each scenario runs on Apache Kafka too, which shows that what it
expects of a broker is what Kafka does. Java 17 comes from .ci/run (openjdk-17-jdk-headless).
"""

from __future__ import annotations

import pytest

from sparkeos.broker import EmbeddedBroker
from support.kafka_java import run_kafka_check

SCENARIOS = ["produce-consume", "compression", "transactions", "fencing", "groups", "send-offsets"]


@pytest.mark.apache_kafka
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_java_client(kafka_check: list[str], broker: EmbeddedBroker, scenario: str) -> None:
    run_kafka_check(kafka_check, broker.bootstrap_servers, scenario)
