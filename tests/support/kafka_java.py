"""Apache Kafka's own Java client (kafka-clients and its runtime jars), the reference implementation the broker is
checked against, from Maven Central through the shared jar cache (sparkeos/maven.py), and KafkaCheck
(tests/support/java), the program that drives it through one scenario at a time."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sparkeos.maven import cached_jars

KAFKA_CLIENTS_VERSION = "3.9.1"


def kafka_client_jars(cache_dir: Path | None = None) -> list[Path]:
    """Paths of kafka-clients and its runtime jars, fetched on first use."""
    return cached_jars("kafka-clients", [f"org.apache.kafka:kafka-clients:{KAFKA_CLIENTS_VERSION}"], cache_dir)


JAVA_SOURCES = Path(__file__).parents[1] / "support" / "java"
# KafkaCheck's own watchdog ends a hung scenario first and dumps its threads; the subprocess timeout is the backstop.
SCENARIO_TIMEOUT_S = 75
JVM_FLAGS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", f"-Dkafkacheck.timeout.s={SCENARIO_TIMEOUT_S}"]


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"`{name}` not found: the Java client tests need a JDK 17 (apt-get install openjdk-17-jdk-headless)"
    return path


def compile_kafka_check(classes: Path) -> list[str]:
    """Compile KafkaCheck into `classes`; the command line that runs it, less its two arguments (bootstrap,
    scenario)."""
    classpath = [str(jar) for jar in kafka_client_jars()]
    sources = sorted(str(path) for path in JAVA_SOURCES.rglob("*.java"))
    compiled = subprocess.run(
        [_tool("javac"), "-Xlint:all", "-Werror", "-d", str(classes), "-cp", os.pathsep.join(classpath), *sources],
        capture_output=True, text=True, timeout=300,
    )
    assert compiled.returncode == 0, f"javac failed:\n{compiled.stdout}\n{compiled.stderr}"
    return [_tool("java"), *JVM_FLAGS, "-cp", os.pathsep.join([str(classes), *classpath]), "KafkaCheck"]


def run_kafka_check(kafka_check: list[str], bootstrap: str, scenario: str,
                    client_properties: Path | None = None) -> None:
    """Run one KafkaCheck scenario; it must print `OK <scenario>`."""
    flags = [f"-Dkafkacheck.client.properties={client_properties}"] if client_properties else []
    process = subprocess.Popen([kafka_check[0], *flags, *kafka_check[1:], bootstrap, scenario],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=SCENARIO_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    assert process.returncode == 0 and f"OK {scenario}" in stdout, (
        f"KafkaCheck {scenario} exited {process.returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    )
