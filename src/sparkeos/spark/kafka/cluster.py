"""Driver-side questions to Kafka: which partitions exist, their offsets, group offsets, broker configs.

Only standard Kafka admin requests are used (Metadata, ListOffsets, OffsetFetch, DescribeConfigs,
CreateTopics), so the same code runs against Apache Kafka 2.5+ and the embedded broker. Every call is
bounded: an unreachable cluster is an error naming the bootstrap servers, never a hang.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
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
# How a broker restart (or a leader moving) makes a request fail: tried again until the call's deadline. A
# running query died when its metadata request failed during a short outage of its one broker (the error then
# said, wrongly, that no answer came in time), and ListOffsets fails at once with _NOENT ("No leaders found")
# while the broker is down.
TRANSIENT_ERRORS = frozenset({
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._NOENT,
    KafkaError._WAIT_COORD, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION,
})
RETRY_BACKOFF_S = 0.2
# librdkafka (2.16) answers a ListOffsets whose connection closed before the broker's answer came with offset
# OFFSET_INVALID (-1001) and no error; no broker ever answers it. Taken for an answer, a latest offset of -1001
# read as the broker was killed failed a running query: the end of its input "went back" below its start.
LOST_LIST_OFFSETS = "the connection closed with a ListOffsets request in flight (offset -1001 and no error)"
KAFKA_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})

TopicPartitions = dict[str, dict[int, int]]


class KafkaUnavailable(RuntimeError):
    """The cluster could not be reached or did not answer in time."""


class KafkaNotAuthorized(RuntimeError):
    """The cluster's authorizer refused a request of the client's principal."""


AUTHORIZATION_ERRORS = frozenset({
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
})


def is_authorization_failure(error: object) -> bool:
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    return isinstance(error, KafkaError) and error.code() in AUTHORIZATION_ERRORS


class _Transient(Exception):
    """A request failed the way a broker restart makes requests fail; worth trying again."""

    def __init__(self, error: object):
        super().__init__(str(error))
        self.error = error


def is_transient(error: object) -> bool:
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in TRANSIENT_ERRORS)


Answer = TypeVar("Answer")


def until_deadline(attempt: Callable[[float], Answer], timeout_s: float,
                   transient_error: Callable[[Exception], object | None],
                   retrying: Callable[[object], None]) -> Answer:
    """`attempt(seconds left)`, made again while it fails with an exception that `transient_error` finds a transient
    error in (`retrying(error)` is told of each), until `timeout_s` runs out; then that exception is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return attempt(max(deadline - time.monotonic(), 0.001))
        except Exception as exc:
            error = transient_error(exc)
            if error is None or time.monotonic() + RETRY_BACKOFF_S >= deadline:
                raise
            retrying(error)
            time.sleep(RETRY_BACKOFF_S)


def _partition_counts(metadata) -> dict[str, int]:
    """Topic name -> partition count, for topics without errors."""
    return {
        name: len(topic.partitions)
        for name, topic in metadata.topics.items()
        if topic.error is None and topic.partitions
    }


def learn_topic(consumer: Consumer, topic: str, timeout_s: float) -> None:
    """Fetch a topic's metadata before a consumer assigns it: librdkafka looks up a topic it has not seen
    only on its periodic topic scan, so the first read of a new topic started late.
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
    # Every security setting, even those not named ssl./sasl. (a driver-side client without the user's
    # enable.ssl.certificate.verification=false would only retry until its timeout ran out).
    allowed_prefixes = ("bootstrap.servers", "security.", "ssl.", "sasl.", "enable.ssl.", "enable.sasl.",
                        "https.", "oauth_cb", "client.", "socket.", "broker.", "metadata.", "topic.metadata.",
                        "connections.max.idle.ms", "reconnect.", "retry.", "api.version", "debug", "log_level",
                        "log.")
    return {key: value for key, value in config.items() if key.startswith(allowed_prefixes)}


def options_connection_config(options: dict[str, str]) -> dict[str, str]:
    """The connection and security settings among a source's or sink's kafka.* options, by librdkafka's names."""
    return connection_config({key[len("kafka."):].lower(): value for key, value in options.items()
                              if key.lower().startswith("kafka.")})


class KafkaCluster:
    def __init__(self, config: dict[str, str], timeout_s: float = DEFAULT_TIMEOUT_S):
        self.bootstrap_servers = config["bootstrap.servers"]
        self.timeout_s = timeout_s
        self.connection = connection_config(config)
        # A topic named in a metadata request must never be created by it: a subscribed topic that does not exist
        # yet is waited for, as Spark's Kafka source does.
        self.admin = AdminClient({**self.connection, "allow.auto.create.topics": "false"})
        # Without it, a fresh client's first ListOffsets often waited out a retry timer (see
        # connect_to_a_known_broker); after one metadata request, none did (see also
        # options.CONNECTION_DEFAULTS).
        connect_to_a_known_broker(self.admin, 1, min(self.timeout_s / 4, WARMUP_TIMEOUT_S), self.bootstrap_servers)

    def _until_deadline(self, attempt: Callable[[float], Answer], what: str) -> Answer:
        """`attempt(seconds left)`, made again while it fails with a transient error, until the deadline."""
        try:
            return until_deadline(
                attempt, self.timeout_s, lambda exc: exc.error if isinstance(exc, _Transient) else None,
                lambda error: log.info("%s to %s failed (%s); trying again", what, self.bootstrap_servers, error))
        except _Transient as exc:
            raise self._unreachable(what, exc.error) from None

    def _wait(self, futures: dict, what: str, timeout_s: float) -> dict:
        """Each future's result or exception; a transient exception among them raises _Transient."""
        results = {}
        deadline = time.monotonic() + timeout_s
        for key, future in futures.items():
            try:
                results[key] = future.result(timeout=max(deadline - time.monotonic(), 0.001))
            except KafkaException as exc:
                if is_transient(exc):
                    raise _Transient(exc.args[0]) from None
                results[key] = exc
            except TimeoutError:
                raise self._unreachable(what) from None
            except Exception as exc:  # concurrent.futures.TimeoutError is TimeoutError on 3.11+
                results[key] = exc
        return results

    def _unreachable(self, what: str, last_error: object = None) -> KafkaUnavailable:
        reason = f" (last error: {last_error})" if last_error is not None else ""
        return KafkaUnavailable(
            f"Kafka at kafka.bootstrap.servers={self.bootstrap_servers} did not answer {what} "
            f"within {self.timeout_s:.0f} s{reason}"
        )

    def _metadata_once(self, timeout_s: float, topic: str | None = None):
        try:
            return self.admin.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            raise _Transient(exc.args[0] if exc.args else exc) from None

    def _metadata(self):
        return self._until_deadline(self._metadata_once, "a metadata request")

    def topics(self) -> dict[str, int]:
        """Topic name -> partition count, for topics without errors."""
        return _partition_counts(self._metadata())

    def partitions_of(self, topics: Iterable[str] = (), pattern: str | None = None,
                      assign: dict[str, tuple[int, ...]] | None = None) -> list[tuple[str, int]]:
        if assign is not None:
            return sorted((topic, partition) for topic, partitions in assign.items() for partition in partitions)
        existing = self.topics()
        if pattern is not None:
            # As Spark's Kafka source: a topic matches if the pattern is found anywhere in its name (Java's
            # find()), and Kafka's internal topics are never read.
            regex = re.compile(pattern)
            names = [name for name in existing if regex.search(name) and name not in KAFKA_INTERNAL_TOPICS]
        else:
            names = [name for name in topics if name in existing]
            for name in topics:
                if name not in existing:
                    self._check_described(name)
        return sorted((name, partition) for name in names for partition in range(existing[name]))

    def _check_described(self, topic: str) -> None:
        """Metadata of every topic leaves out those the principal may not describe: asked by name, Kafka says
        whether the topic is missing (waited for) or refused (an error, as the Java consumer raises)."""
        metadata = self._until_deadline(
            lambda timeout_s: self._metadata_once(timeout_s, topic), "a metadata request")
        error = metadata.topics[topic].error if topic in metadata.topics else None
        if is_authorization_failure(error):
            raise KafkaNotAuthorized(f"Kafka refused to describe topic {topic!r} to this client's principal "
                                     f"({error.name()}): reading it needs READ on the topic")

    def list_offsets(self, partitions: Iterable[tuple[str, int]], spec: OffsetSpec,
                     read_committed: bool = True) -> dict[tuple[str, int], int]:
        wanted = {TopicPartition(topic, partition): spec for topic, partition in partitions}
        if not wanted:
            return {}
        isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED

        def attempt(timeout_s: float) -> dict:
            futures = self.admin.list_offsets(wanted, isolation_level=isolation, request_timeout=timeout_s)
            try:
                results = self._wait(futures, "a ListOffsets request", timeout_s)
            except _Transient as exc:
                if isinstance(exc.error, KafkaError) and exc.error.code() == KafkaError._NOENT:
                    # "No leaders found" is final for a partition that is not there.
                    self._check_partitions_exist(wanted, timeout_s)
                raise exc
            if any(getattr(result, "offset", None) == OFFSET_INVALID for result in results.values()):
                raise _Transient(LOST_LIST_OFFSETS)
            return results

        results = self._until_deadline(attempt, "a ListOffsets request")
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

    def group_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]],
                      require_stable: bool = True) -> dict[tuple[str, int], int]:
        """Committed offsets of a group; partitions without one are left out. With ``require_stable`` an offset that
        an open transaction is committing is waited for; without it, the last committed one is read at once.

        Asked by a consumer of the group that never joins it, not by the admin client: librdkafka's admin
        ListConsumerGroupOffsets crashes the process (SIGSEGV) on a NOT_COORDINATOR answer, which a Kafka node gives
        while it loads the group's coordinator, fresh or just restarted (confluentinc/librdkafka#5040); a consumer
        looks the coordinator up again. Its isolation level is what asks for stable offsets (KIP-447)."""
        wanted = [TopicPartition(topic, partition) for topic, partition in partitions]
        if not wanted:
            return {}
        consumer = Consumer({**self.connection, "group.id": group_id, "enable.auto.commit": "false",
                             "isolation.level": "read_committed" if require_stable else "read_uncommitted"})

        def attempt(timeout_s: float) -> list[TopicPartition]:
            try:
                return consumer.committed(wanted, timeout=timeout_s)
            except KafkaException as exc:
                if is_transient(exc):
                    raise _Transient(exc.args[0]) from None
                raise

        try:
            result = self._until_deadline(attempt, "an OffsetFetch request")
        except KafkaException as exc:
            raise RuntimeError(f"reading committed offsets of group {group_id!r} failed: {exc.args[0]}") from None
        finally:
            consumer.close()
        return {(tp.topic, tp.partition): tp.offset for tp in result if tp.error is None and tp.offset >= 0}

    def group_ids(self) -> list[str]:
        """Every consumer group the cluster knows."""
        def attempt(timeout_s: float):
            future = self.admin.list_consumer_groups(request_timeout=timeout_s)
            return self._wait({"groups": future}, "a ListGroups request", timeout_s)["groups"]

        result = self._until_deadline(attempt, "a ListGroups request")
        if isinstance(result, Exception):
            raise RuntimeError(f"listing consumer groups failed: {result}")
        return sorted(group.group_id for group in result.valid)

    def broker_config(self, name: str) -> str | None:
        brokers = self._broker_ids()
        return self._describe(ConfigResource(ResourceType.BROKER, str(brokers[0])), f"broker {brokers[0]}").get(name)

    def topic_configs(self, topic: str) -> dict[str, str]:
        return self._describe(ConfigResource(ResourceType.TOPIC, topic), f"topic {topic!r}")

    def _describe(self, resource: ConfigResource, what: str) -> dict[str, str]:
        def attempt(timeout_s: float):
            futures = self.admin.describe_configs([resource], request_timeout=timeout_s)
            return self._wait(futures, "a DescribeConfigs request", timeout_s)[resource]

        result = self._until_deadline(attempt, "a DescribeConfigs request")
        if is_authorization_failure(result):
            raise KafkaNotAuthorized(f"describing {what} configs failed: {result}")
        if isinstance(result, Exception):
            raise RuntimeError(f"describing {what} configs failed: {result}")
        return {name: entry.value for name, entry in result.items() if entry.value is not None}

    def _broker_ids(self) -> list[int]:
        return sorted(self._metadata().brokers)

    def _check_partitions_exist(self, partitions: Iterable[TopicPartition], timeout_s: float) -> None:
        """One metadata request within the caller's deadline; an error naming partitions that do not exist."""
        existing = _partition_counts(self._metadata_once(timeout_s))
        missing = sorted(f"{tp.topic}-{tp.partition}" for tp in partitions
                         if not 0 <= tp.partition < existing.get(tp.topic, 0))
        if missing:
            raise RuntimeError(f"partitions {', '.join(missing)} do not exist")

    def ensure_topic(self, name: str, partitions: int, config: dict[str, str]) -> int:
        """Create the topic if it is missing; return its partition count."""
        existing = self.topics()
        if name in existing:
            return existing[name]
        futures = self.admin.create_topics([NewTopic(name, partitions, config=config)],
                                           request_timeout=self.timeout_s)
        try:
            result = self._wait(futures, "a CreateTopics request", self.timeout_s)[name]
        except _Transient as exc:
            raise self._unreachable("a CreateTopics request", exc.error) from None
        if isinstance(result, KafkaException) and result.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise RuntimeError(f"creating topic {name!r} failed: {result}")
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            count = self.topics().get(name)
            if count:
                return count
            time.sleep(0.1)
        raise self._unreachable(f"the creation of topic {name!r}")
