"""The broker against Apache Kafka's own Java client (kafka-clients 3.9.1), the reference implementation.

tests/support/java/KafkaCheck.java is compiled once per session; each scenario runs it as a child JVM against a
fresh broker and must print `OK <scenario>`. Each scenario runs on Apache Kafka too, which shows that what it
expects of a broker is what Kafka does. Java 17 comes from .ci/run (openjdk-17-jdk-headless).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkeos.broker import EmbeddedBroker
from support.kafka_java import kafka_client_jars

JAVA_SOURCES = Path(__file__).parents[1] / "support" / "java"
SCENARIOS = ["produce-consume", "compression", "transactions", "fencing", "groups", "send-offsets"]
# KafkaCheck's own watchdog ends a hung scenario first and dumps its threads; the subprocess timeout is the backstop.
SCENARIO_TIMEOUT_S = 75
JVM_FLAGS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", f"-Dkafkacheck.timeout.s={SCENARIO_TIMEOUT_S}"]


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"`{name}` not found: the Java client tests need a JDK 17 (apt-get install openjdk-17-jdk-headless)"
    return path


@pytest.fixture(scope="session")
def kafka_check(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The command line that runs KafkaCheck, less its two arguments (bootstrap, scenario)."""
    classpath = [str(jar) for jar in kafka_client_jars()]
    classes = tmp_path_factory.mktemp("kafkacheck-classes")
    sources = sorted(str(path) for path in JAVA_SOURCES.rglob("*.java"))
    compiled = subprocess.run(
        [_tool("javac"), "-Xlint:all", "-Werror", "-d", str(classes), "-cp", os.pathsep.join(classpath), *sources],
        capture_output=True, text=True, timeout=300,
    )
    assert compiled.returncode == 0, f"javac failed:\n{compiled.stdout}\n{compiled.stderr}"
    return [_tool("java"), *JVM_FLAGS, "-cp", os.pathsep.join([str(classes), *classpath]), "KafkaCheck"]


@pytest.mark.apache_kafka
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_java_client(kafka_check: list[str], broker: EmbeddedBroker, scenario: str) -> None:
    process = subprocess.Popen(
        [*kafka_check, broker.bootstrap_servers, scenario], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = process.communicate(timeout=SCENARIO_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    assert process.returncode == 0 and f"OK {scenario}" in stdout, (
        f"KafkaCheck {scenario} exited {process.returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    )
