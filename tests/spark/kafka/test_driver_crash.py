"""Crash proof of the exactly-once Kafka sink on Apache Kafka: the drill of support/sink_drill.py, its driver killed
with SIGKILL at random moments. The broker runs in a process of its own and survives. An independent read_committed
consumer checks the output against the expected multiset: nothing lost, nothing twice, no aborted record.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from sparkeos.spark.kafka.sink.markers import MARKER_PARTITIONS, marker_key
from sparkeos.verify import READ_UNCOMMITTED, end_offsets, read_values
from support.crash import wait_until_stable
from support.sink_drill import DRILL_TIMEOUT_S, SOURCE_PARTITIONS, DrillTarget, Snapshot, run_drill
from support.spark import create_topic, unique

SINK_PARTITIONS = 2


def marker_batches(bootstrap: str, prefix: str, partitions: int, checkpoint: Path, sink: str) -> dict[str, int]:
    """The last batch each transactional id of the sink committed for the checkpoint's query writing to topic
    `sink` (its marker group offset minus one)."""
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    found = {}
    for partition in range(partitions):
        transactional_id = f"{prefix}-{partition}"
        marker = TopicPartition(DEFAULT_MARKER_TOPIC, zlib.crc32(transactional_id.encode()) % MARKER_PARTITIONS)
        # read_uncommitted: no require_stable, so an open transaction of the killed driver does not block us
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": marker_key(transactional_id, query_id, sink),
                "isolation.level": "read_uncommitted",
                "enable.auto.commit": False,
            }
        )
        try:
            offset = consumer.committed([marker], timeout=30)[0].offset
        finally:
            consumer.close()
        if offset >= 0:
            found[transactional_id] = offset - 1
    return found


class KafkaTarget(DrillTarget):
    """The Kafka sink commits each task's transaction itself, with its marker: "decided" here means a task of the
    in-flight batch had committed it, so the replay must skip that task's records."""

    name = "sparkeos.kafka"

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self.topic = create_topic(bootstrap, unique("out"), partitions=SINK_PARTITIONS)
        self.prefix = unique("crash")
        self.checkpoint: Path | None = None

    def job_args(self, bootstrap: str, source: str, checkpoint: Path) -> list[str]:
        self.checkpoint = checkpoint
        return ["--sink", self.topic, "--transactional-id-prefix", self.prefix]

    def snapshot(self, in_flight: int | None) -> Snapshot:
        committed_tasks = 0
        if in_flight is not None and (self.checkpoint / "metadata").exists():
            markers = marker_batches(self.bootstrap, self.prefix, SOURCE_PARTITIONS, self.checkpoint, self.topic)
            committed_tasks = sum(1 for batch in markers.values() if batch == in_flight)
        output = sum(end_offsets(self.bootstrap, self.topic, isolation_level=READ_UNCOMMITTED).values())
        return Snapshot(committed_tasks > 0, 0, 0, output)

    def output_values(self) -> dict[str, list[bytes]]:
        # A killed driver's last transactions are aborted by the broker after kafka.transaction.timeout.ms.
        wait_until_stable(self.bootstrap, self.topic)
        return {"read_committed consumer": read_values(self.bootstrap, self.topic)}


# On Apache Kafka, the oracle: the embedded broker's Kafka sinks are killed at random and mid-commit in sparkeos
# chaos's example runs (tests/test_chaos.py).
@pytest.mark.apache_kafka(newest_only=True, embedded=False)
@pytest.mark.timeout(DRILL_TIMEOUT_S)
def test_driver_killed_at_random_moments_output_stays_exact(broker_process, tmp_path):
    bootstrap = broker_process.bootstrap_servers
    run_drill(KafkaTarget(bootstrap), bootstrap, tmp_path)
