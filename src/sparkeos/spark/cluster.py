"""Driver-side questions to Kafka: which partitions exist, their offsets, group offsets, broker configs.

Only standard Kafka admin requests are used (Metadata, ListOffsets, OffsetFetch, DescribeConfigs,
CreateTopics), so the same code runs against Apache Kafka 2.5+ and the embedded broker. Every call is
bounded: an unreachable cluster is an error naming the bootstrap servers, never a hang.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec, ResourceType

log = logging.getLogger("sparkeos.cluster")

DEFAULT_TIMEOUT_S = 30.0
WARMUP_TIMEOUT_S = 5.0  # a warm-up request only: real calls keep their own timeouts

TopicPartitions = dict[str, dict[int, int]]


class KafkaUnavailable(RuntimeError):
    """The cluster could not be reached or did not answer in time."""


def learn_topic(consumer: Consumer, topic: str, timeout_s: float) -> None:
    """Fetch a topic's metadata before a consumer assigns it: librdkafka looks up a topic it has not seen
    only on its one-second topic scan, so the first read of a new topic started up to a second late.
    One Metadata round trip; consumers never auto-create topics (librdkafka's default for them)."""
    try:
        consumer.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:  # only slower: the assignment finds the leader on librdkafka's own refresh
        log.debug("metadata of %s not fetched before reading: %s", topic, exc)


def connect_to_a_known_broker(client: Consumer | Producer | AdminClient, requests: int, timeout_s: float,
                              what: str) -> None:
    """Metadata requests for no topic in particular before a new client's first real one. librdkafka drops
    its bootstrap connection once metadata names the brokers, and a request made before it has connected
    to one of those waits out a retry timer (measured, not promised by librdkafka). No topic is named, so a
    producer, which librdkafka lets auto-create topics, never creates one here."""
    try:
        for _ in range(requests):
            client.list_topics(timeout=timeout_s)
    except KafkaException as exc:  # only slower: the real request waits for the cluster, or fails naming it
        log.debug("metadata warm-up of %s failed: %s", what, exc)


def connection_config(config: dict[str, str]) -> dict[str, str]:
    """The connection and security settings of a client config, without consumer- or producer-only keys."""
    allowed_prefixes = ("bootstrap.servers", "security.", "ssl.", "sasl.", "client.", "socket.", "broker.",
                        "metadata.", "reconnect.", "retry.", "api.version", "debug", "log_level", "log.")
    return {key: value for key, value in config.items() if key.startswith(allowed_prefixes)}


class KafkaCluster:
    def __init__(self, config: dict[str, str], timeout_s: float = DEFAULT_TIMEOUT_S):
        self.bootstrap_servers = config["bootstrap.servers"]
        self.timeout_s = timeout_s
        self.admin = AdminClient(connection_config(config))
        # Without it, a fresh client's first ListOffsets waited 1 to 3 s for 8 of 40 clients against the
        # embedded broker; after one metadata request, 0 of 40, for about 50 ms (30 ms with the connector's
        # reconnect.backoff.ms, see options.CONNECTION_DEFAULTS).
        connect_to_a_known_broker(self.admin, 1, min(self.timeout_s / 4, WARMUP_TIMEOUT_S), self.bootstrap_servers)

    def _wait(self, futures: dict, what: str) -> dict:
        results = {}
        deadline = time.monotonic() + self.timeout_s
        for key, future in futures.items():
            try:
                results[key] = future.result(timeout=max(deadline - time.monotonic(), 0.001))
            except KafkaException as exc:
                results[key] = exc
            except TimeoutError:
                raise self._unreachable(what) from None
            except Exception as exc:  # concurrent.futures.TimeoutError is TimeoutError on 3.11+
                results[key] = exc
        return results

    def _unreachable(self, what: str) -> KafkaUnavailable:
        return KafkaUnavailable(
            f"Kafka at kafka.bootstrap.servers={self.bootstrap_servers} did not answer {what} "
            f"within {self.timeout_s:.0f} s"
        )

    def topics(self) -> dict[str, int]:
        """Topic name -> partition count, for topics without errors."""
        try:
            metadata = self.admin.list_topics(timeout=self.timeout_s)
        except KafkaException:
            raise self._unreachable("a metadata request") from None
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and topic.partitions
        }

    def partitions_of(self, topics: Iterable[str] = (), pattern: str | None = None,
                      assign: dict[str, tuple[int, ...]] | None = None) -> list[tuple[str, int]]:
        if assign is not None:
            return sorted((topic, partition) for topic, partitions in assign.items() for partition in partitions)
        existing = self.topics()
        if pattern is not None:
            regex = re.compile(pattern)
            names = [name for name in existing if regex.fullmatch(name) and not name.startswith("__")]
        else:
            names = [name for name in topics if name in existing]
        return sorted((name, partition) for name in names for partition in range(existing[name]))

    def list_offsets(self, partitions: Iterable[tuple[str, int]], spec: OffsetSpec,
                     read_committed: bool = True) -> dict[tuple[str, int], int]:
        wanted = {TopicPartition(topic, partition): spec for topic, partition in partitions}
        if not wanted:
            return {}
        isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
        futures = self.admin.list_offsets(wanted, isolation_level=isolation, request_timeout=self.timeout_s)
        results = self._wait(futures, "a ListOffsets request")
        offsets = {}
        for tp, result in results.items():
            if isinstance(result, Exception):
                raise RuntimeError(f"listing offsets of {tp.topic}-{tp.partition} failed: {result}")
            offsets[(tp.topic, tp.partition)] = result.offset
        return offsets

    def earliest(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return self.list_offsets(partitions, OffsetSpec.earliest())

    def latest(self, partitions: Iterable[tuple[str, int]], read_committed: bool) -> dict[tuple[str, int], int]:
        """The last stable offset under read_committed, else the high watermark."""
        return self.list_offsets(partitions, OffsetSpec.latest(), read_committed)

    def for_timestamp(self, partitions: Iterable[tuple[str, int]], timestamp_ms: int) -> dict[tuple[str, int], int]:
        """Earliest offset whose timestamp is >= the given one; -1 where no record is that new."""
        return self.list_offsets(partitions, OffsetSpec.for_timestamp(timestamp_ms))

    def group_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Committed offsets of a group (require_stable); partitions without one are left out."""
        request = ConsumerGroupTopicPartitions(group_id, [TopicPartition(t, p) for t, p in partitions])
        futures = self.admin.list_consumer_group_offsets([request], require_stable=True,
                                                         request_timeout=self.timeout_s)
        result = self._wait(futures, "an OffsetFetch request")[group_id]
        if isinstance(result, Exception):
            raise RuntimeError(f"reading committed offsets of group {group_id!r} failed: {result}")
        return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0}

    def broker_config(self, name: str) -> str | None:
        brokers = self._broker_ids()
        return self._describe(ConfigResource(ResourceType.BROKER, str(brokers[0])), f"broker {brokers[0]}").get(name)

    def topic_configs(self, topic: str) -> dict[str, str]:
        return self._describe(ConfigResource(ResourceType.TOPIC, topic), f"topic {topic!r}")

    def _describe(self, resource: ConfigResource, what: str) -> dict[str, str]:
        futures = self.admin.describe_configs([resource], request_timeout=self.timeout_s)
        result = self._wait(futures, "a DescribeConfigs request")[resource]
        if isinstance(result, Exception):
            raise RuntimeError(f"describing {what} configs failed: {result}")
        return {name: entry.value for name, entry in result.items() if entry.value is not None}

    def _broker_ids(self) -> list[int]:
        try:
            metadata = self.admin.list_topics(timeout=self.timeout_s)
        except KafkaException:
            raise self._unreachable("a metadata request") from None
        return sorted(metadata.brokers)

    def ensure_topic(self, name: str, partitions: int, config: dict[str, str]) -> int:
        """Create the topic if it is missing; return its partition count."""
        existing = self.topics()
        if name in existing:
            return existing[name]
        futures = self.admin.create_topics([NewTopic(name, partitions, config=config)],
                                           request_timeout=self.timeout_s)
        result = self._wait(futures, "a CreateTopics request")[name]
        if isinstance(result, KafkaException) and result.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise RuntimeError(f"creating topic {name!r} failed: {result}")
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            count = self.topics().get(name)
            if count:
                return count
            time.sleep(0.1)
        raise self._unreachable(f"the creation of topic {name!r}")
