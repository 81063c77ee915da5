"""Helpers for the Spark connector tests: a real local Spark session, topics, producers and failpoints.

Output is read back and checked with sparkeos.verify, independently of the connector under test.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sparkeos import failpoints
from sparkeos.verify import end_offsets

FAILPOINT_DIR = Path(os.environ.setdefault("SPARKEOS_FAILPOINT_DIR", f"/tmp/sparkeos-failpoints-{os.getpid()}"))


CLIENT_CACHE_TIMEOUT_S = 20


def spark_session(master: str = "local[2]"):
    """One SparkSession per test process (starting a JVM costs ~10 s); sparkeos.kafka registered."""
    import sparkeos.spark

    FAILPOINT_DIR.mkdir(parents=True, exist_ok=True)
    return sparkeos.spark.session(
        "sparkeos-tests",
        master=master,
        config={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.stopTimeout": "30s",
            "spark.driver.memory": "1g",
            "spark.python.worker.reuse": "true",
            # How long the JVM waits for this process to connect to the socket a collect() answers on: on a loaded
            # machine the default 15 s ran out, and the connection was reset (CANNOT_OPEN_SOCKET).
            "spark.python.authenticate.socketTimeout": "120s",
            # Every test stops its broker, and a client of a stopped broker retries its connection every
            # ~50 ms: the long-lived Python workers must not keep hundreds of them (Spark's default 5m/10m).
            "spark.kafka.consumer.cache.timeout": f"{CLIENT_CACHE_TIMEOUT_S}s",
            "spark.kafka.producer.cache.timeout": f"{CLIENT_CACHE_TIMEOUT_S}s",
        },
    )


def arm_failpoint(name: str) -> Path:
    FAILPOINT_DIR.mkdir(parents=True, exist_ok=True)
    path = FAILPOINT_DIR / name
    path.touch()
    return path


def arm_hold(name: str) -> set[Path]:
    """Make the next process that reaches failpoint `name` stop there (sparkeos.failpoints); returns the
    holds taken so far, for `wait_held`."""
    return failpoints.arm_hold(FAILPOINT_DIR, name)


def wait_held(name: str, known: set[Path], timeout_s: float) -> Path:
    """The hold a process took at failpoint `name` since `arm_hold` returned `known`; removing it releases the
    process."""
    found = wait_for(lambda: failpoints.holds(FAILPOINT_DIR, name) - known, timeout_s, 0.05,
                     f"a process to stop at failpoint {name}")
    return found.pop()


def wait_tasks_ended(spark, timeout_s: float = 120.0) -> None:
    """Until no task of the session's jobs runs: a failed job's stage ends with it, while the tasks Spark cancelled
    may run on (Spark kills their Python workers only after spark.python.task.killTimeout); they still count as
    its active tasks."""
    tracker = spark.sparkContext.statusTracker()
    stages = [stage for job in tracker.getJobIdsForGroup() for stage in tracker.getJobInfo(job).stageIds]
    wait_for(lambda: not sum(info.numActiveTasks for info in map(tracker.getStageInfo, stages) if info is not None),
             timeout_s, 0.1, "the cancelled tasks to end")


def fired(name: str) -> bool:
    return (FAILPOINT_DIR / f"{name}.fired").exists()


def clear_failpoints() -> None:
    for path in FAILPOINT_DIR.glob("*"):
        path.unlink()


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> str:
    """Create a topic and wait until the broker's metadata serves it with a leader for every partition: Apache
    Kafka answers CreateTopics before its brokers' metadata has the topic, and a DescribeConfigs or a Produce in
    between gets UNKNOWN_TOPIC_OR_PARTITION."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, config=config or {})])
    futures[name].result(30)

    def served() -> bool:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        return (topic is not None and topic.error is None and len(topic.partitions) == partitions
                and all(partition.leader >= 0 for partition in topic.partitions.values()))

    wait_for(served, timeout_s=30, interval_s=0.05, what=f"topic {name} in the broker's metadata")
    return name


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, values: Iterable[bytes | str], keys: Iterable | None = None,
            partition: int | None = None, headers=None, spread_over: int | None = None) -> int:
    """Produce `values`; with `spread_over=n`, dealt round-robin over partitions 0..n-1, for tests that need every
    partition to hold records (the sticky partitioner may put a whole burst in one partition)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    count = 0
    keys_list = list(keys) if keys is not None else None
    for i, value in enumerate(values):
        args = {"value": value.encode() if isinstance(value, str) else value}
        if keys_list is not None:
            key = keys_list[i]
            args["key"] = key.encode() if isinstance(key, str) else key
        if partition is not None:
            args["partition"] = partition
        elif spread_over is not None:
            args["partition"] = i % spread_over
        if headers is not None:
            args["headers"] = headers
        producer.produce(topic, **args)
        count += 1
    assert producer.flush(30) == 0
    return count


def produce_transaction(bootstrap: str, topic: str, values: Iterable[bytes | str], commit: bool,
                        partition: int = 0, transactional_id: str | None = None) -> None:
    """One transaction's records, committed or aborted; returns once read_committed readers are past them. Apache
    Kafka answers EndTxn when the outcome is decided and writes the partition's marker after it."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id or unique("txn")})
    producer.init_transactions(30)
    producer.begin_transaction()
    offsets: list[int] = []
    for value in values:
        producer.produce(topic, value=value.encode() if isinstance(value, str) else value, partition=partition,
                         on_delivery=lambda error, message: offsets.append(message.offset()) if error is None else None)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)
    if offsets:
        # end_offsets reads as read_committed: the last stable offset.
        wait_for(lambda: end_offsets(bootstrap, topic).get(partition, 0) > max(offsets), timeout_s=30,
                 what=f"the transaction's marker in {topic}-{partition}")


def commit_sink_batch(writer, batch: int, query_id: str = "query") -> None:
    """One exactly-once sink transaction of a single record for `batch`, through the sink's own writer."""
    import pyarrow as pa

    writer.begin(batch, query_id)
    records = pa.RecordBatch.from_pydict({"value": [b"v%d" % batch]})
    writer.write_and_commit(batch, query_id, iter([records]))


def wait_for(predicate, timeout_s: float = 60.0, interval_s: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")

