"""Fetch the jars the tests and benchmarks run from Maven Central into the shared cache, ahead of time.

    python3 scripts/fetch_jars.py              # every Apache Kafka version the tests run, kafka-clients and
                                               # Spark's own Kafka connector (the benchmarks' peer)
    python3 scripts/fetch_jars.py --kafka 4.4.0

Needs Maven (`mvn`) and nothing beyond the standard library, so it runs before any virtualenv exists. The cache is
`$SPARKEOS_CACHE_DIR`, else `$XDG_CACHE_HOME/sparkeos`, else `~/.cache/sparkeos`; the tests fetch what is missing
themselves, so this only moves the download out of the test run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from sparkeos import apache_kafka  # noqa: E402
from support import kafka_java, spark_kafka  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kafka", action="append", metavar="VERSION",
                        help=f"an Apache Kafka version (default: {', '.join(apache_kafka.VERSIONS)})")
    args = parser.parse_args()
    for version in args.kafka or apache_kafka.VERSIONS:
        jars = apache_kafka.kafka_jars(version)
        print(f"Apache Kafka {version}: {len(jars)} jars in {jars[0].parent}")
    jars = kafka_java.kafka_client_jars()
    print(f"kafka-clients {kafka_java.KAFKA_CLIENTS_VERSION}: {len(jars)} jars in {jars[0].parent}")
    jars = spark_kafka.connector_jars()
    print(f"spark-sql-kafka {spark_kafka.CONNECTOR_VERSION}: {len(jars)} jars in {jars[0].parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
