"""What the pipeline and latency benchmarks run against: a broker (the embedded one, or a one-node Apache Kafka from
Maven Central) and Spark's own Kafka connector, the peer of sparkeos.kafka. Both come from tests/support, which
fetches their jars into the shared cache (scripts/fetch_jars.py fetches them ahead of time).

Imported where the project's environment runs, never at the module level of a benchmark (which must stay
importable in the Quix and Flink environments).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import apache_kafka, spark_kafka  # noqa: E402

BROKERS = ("embedded", *(f"kafka-{version}" for version in apache_kafka.VERSIONS))


@contextmanager
def broker(kind: str, directory: Path) -> Iterator[tuple[str, str]]:
    """(bootstrap servers, what runs) of a broker of `kind` (one of BROKERS) with its data in `directory`.

    Apache Kafka keeps its defaults: it answers acks=all once the replicas have the records, without fsync; the
    embedded broker syncs before it answers. benchmarks/broker.py compares the two brokers with equal policies."""
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "embedded":
        from sparkeos.broker.embedded import BrokerProcess
        from sparkeos.broker.record_validation import COMPILED

        checks = "compiled record checks" if COMPILED else "record checks in plain Python (not compiled at install)"
        with BrokerProcess(directory) as embedded:
            yield (embedded.bootstrap_servers,
                   f"sparkeos in a child process, data on disk, fsync before acks=all, {checks}")
        return
    if kind not in BROKERS:
        raise ValueError(f"unknown broker {kind!r}: one of {', '.join(BROKERS)}")
    version = kind.removeprefix("kafka-")
    with apache_kafka.ApacheKafkaCluster(directory, version) as cluster:
        yield cluster.bootstrap_servers, f"Apache Kafka {version}, one KRaft node, its default flush policy (no fsync)"


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka connector's jars, for `spark.jars`."""
    return [str(jar) for jar in spark_kafka.connector_jars()]


SPARK_KAFKA_VERSION = spark_kafka.CONNECTOR_VERSION
