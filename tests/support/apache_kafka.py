"""The Apache Kafka the tests run on: sparkeos.apache_kafka's nodes and clusters, and which versions a run tests."""

from __future__ import annotations

import os

from sparkeos.apache_kafka import (
    VERSIONS,
    ApacheKafkaCluster,
    KafkaNode,
    KafkaStartFailed,
    kafka_jars,
    kafka_jars_cached,
    major,
)

__all__ = ["VERSIONS", "ApacheKafkaCluster", "KafkaNode", "KafkaStartFailed", "kafka_jars", "kafka_jars_cached",
           "major", "tested_versions"]


def tested_versions() -> list[str]:
    """The versions the tests run on: `SPARKEOS_TEST_KAFKA` (comma-separated; `none` for none), else VERSIONS."""
    chosen = os.environ.get("SPARKEOS_TEST_KAFKA")
    if chosen is None:
        return list(VERSIONS)
    return [version.strip() for version in chosen.split(",") if version.strip() and version.strip() != "none"]
