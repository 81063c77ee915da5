"""Apache Kafka's own Java client (kafka-clients and its runtime jars), the reference implementation the broker is
checked against, from Maven Central through the shared jar cache (sparkeos/maven.py)."""

from __future__ import annotations

from pathlib import Path

from sparkeos.maven import cached_jars

KAFKA_CLIENTS_VERSION = "3.9.1"


def kafka_client_jars(cache_dir: Path | None = None) -> list[Path]:
    """Paths of kafka-clients and its runtime jars, fetched on first use."""
    return cached_jars("kafka-clients", [f"org.apache.kafka:kafka-clients:{KAFKA_CLIENTS_VERSION}"], cache_dir)
