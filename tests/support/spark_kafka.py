"""Spark's own Kafka connector (`spark-sql-kafka-0-10`) from Maven Central: the benchmarks' peer of sparkeos.kafka.

Maven Central serves the connector up to 4.2.0 here, not at the installed PySpark's 4.3.0; 4.2.0's classes run on
Spark 4.3 (the benchmarks check every output they produce). Only the connector's own jars go to Spark: the rest of
what Maven resolves (Scala, Hadoop's client, lz4, snappy, slf4j) is in PySpark already, in its own versions.
"""

from __future__ import annotations

from pathlib import Path

from sparkeos.maven import cached_jars

CONNECTOR_VERSION = "4.2.0"
CONNECTOR_JARS = ("spark-sql-kafka-0-10_", "spark-token-provider-kafka-0-10_", "kafka-clients-", "commons-pool2-")


def connector_jars(version: str = CONNECTOR_VERSION) -> list[Path]:
    """The jars to give Spark (`spark.jars`) for `format("kafka")`, fetched into the cache on first use."""
    jars = cached_jars(f"spark-sql-kafka-{version}", [f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"])
    chosen = [jar for jar in jars if jar.name.startswith(CONNECTOR_JARS)]
    if len(chosen) != len(CONNECTOR_JARS):
        raise RuntimeError(f"spark-sql-kafka {version}: expected jars starting with {CONNECTOR_JARS}, got "
                           f"{[jar.name for jar in jars]}")
    return chosen
