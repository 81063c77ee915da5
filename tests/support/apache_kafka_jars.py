"""Apache Kafka's broker jars, by version, from Maven Central through the shared cache (support/maven.py).

Only the standard library is used, as in support/maven.py: scripts/fetch_jars.py imports this with the system Python,
before any virtualenv (and so before sparkeos) is installed.
"""

from __future__ import annotations

from pathlib import Path

from support.maven import cached_jars

# The newest release of each line Maven Central serves here: 4.x, and 3.9.x for the many users still on 3.
VERSIONS = ("4.4.0", "3.9.2")
# Kafka's distribution ships a logging binding the Maven artifact leaves out: log4j 2 from 4.0 on, reload4j before.
_LOGGING = {
    4: ["org.apache.logging.log4j:log4j-slf4j-impl:2.25.5"],
    3: ["org.slf4j:slf4j-reload4j:1.7.36"],
}


def major(version: str) -> int:
    return int(version.split(".")[0])


def kafka_jars(version: str) -> list[Path]:
    """The broker's classpath for one Kafka version, fetched on first use."""
    if major(version) not in _LOGGING:
        raise ValueError(f"Apache Kafka {version}: only 3.x and 4.x are supported here")
    return cached_jars(f"kafka-{version}", [f"org.apache.kafka:kafka_2.13:{version}", *_LOGGING[major(version)]])
