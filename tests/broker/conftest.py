"""Fixtures of the broker's tests."""

from __future__ import annotations

import pytest

from support.kafka_java import compile_kafka_check


@pytest.fixture(scope="session")
def kafka_check(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The command line that runs KafkaCheck (Apache Kafka's Java client), less its two arguments (bootstrap,
    scenario); compiled once per session."""
    return compile_kafka_check(tmp_path_factory.mktemp("kafkacheck-classes"))
