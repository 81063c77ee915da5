"""The registry's durable log: JSON key/value records in a compacted one-partition Kafka topic.

The registry is an ordinary client of the broker: it writes with an idempotent acks=all producer
and rebuilds its state by reading the topic from the beginning, so it survives a broker crash
exactly as well as any other acknowledged record does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .errors import store_error

T = TypeVar("T")

DEFAULT_TOPIC = "_schemas"

Record = tuple[dict[str, Any], dict[str, Any] | None]
# The registry's own clients log librdkafka's warnings and errors (syslog level 4) only: its informational lines
# ("Purging 1 unserved events from background queue" when a client closes) describe its internals, and would
# reach the terminal of every command that runs the registry.
QUIET = {"log_level": 4}
# What librdkafka answers a request whose connection was lost in flight, and, while it has not yet fetched the
# metadata again, one about a partition it does not know yet: each is asked again until the log's timeout.
TRANSIENT = {KafkaError._TRANSPORT, KafkaError._DESTROY_BROKER, KafkaError._TIMED_OUT_QUEUE,
             KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC}


class KafkaSchemaLog:
    """Append JSON records to `topic` and read them back in order."""

    def __init__(self, bootstrap_servers: str, topic: str = DEFAULT_TOPIC, timeout: float = 30.0,
                 kafka_config: Mapping[str, str] | None = None) -> None:
        """`kafka_config`: librdkafka settings its clients take besides the bootstrap servers (a secured cluster's)."""
        self.bootstrap_servers = bootstrap_servers
        self.kafka_config = dict(kafka_config or {})
        self.topic = topic
        self.timeout = timeout
        self._partition = TopicPartition(topic, 0)
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None

    def open(self) -> None:
        self._ensure_topic()
        self._producer = Producer(
            {
                **self.kafka_config,
                "bootstrap.servers": self.bootstrap_servers,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
                "message.timeout.ms": int(self.timeout * 1000),
                **QUIET,
            }
        )
        self._consumer = Consumer(
            {
                **self.kafka_config,
                "bootstrap.servers": self.bootstrap_servers,
                # librdkafka wants a group id even for assign(); nothing is ever committed to it.
                "group.id": "sparkeos-schema-registry",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                **QUIET,
            }
        )
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.timeout)
            self._producer = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def append(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        """Write one record and wait until the broker has acknowledged it (acks=all)."""
        assert self._producer is not None, "open() first"
        outcome: list[KafkaError | None] = []
        self._producer.produce(
            self.topic,
            key=_encode(key),
            value=None if value is None else _encode(value),
            partition=0,
            on_delivery=lambda error, _message: outcome.append(error),
        )
        deadline = time.monotonic() + self.timeout
        while not outcome and time.monotonic() < deadline:
            self._producer.poll(0.1)
        if not outcome:
            raise store_error(f"no acknowledgement from the broker within {self.timeout:.0f} s")
        if outcome[0] is not None:
            raise store_error(str(outcome[0]))

    def read_new(self) -> Iterator[tuple[int, Record]]:
        """(offset, record) for every record after the last one read, up to the current end of the topic."""
        assert self._consumer is not None, "open() first"
        deadline = time.monotonic() + self.timeout
        high = self._high_watermark(deadline)
        position = self._position()
        while position < high:
            if time.monotonic() > deadline:
                raise store_error(f"could not read {self.topic} up to offset {high} within {self.timeout:.0f} s")
            message = self._consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    position = max(position, message.offset())
                    continue
                raise store_error(f"reading {self.topic}: {message.error()}")
            position = message.offset() + 1
            key = _decode(message.key())
            if key is None:
                continue  # not a registry record; ignore rather than refuse to start
            yield message.offset(), (key, _decode(message.value()))

    def _high_watermark(self, deadline: float) -> int:
        """The topic's end, asked again after a connection lost with the request in flight (a broker coming back
        from a crash, the network between): librdkafka reconnects, but answers that one request with an error, and
        the next ones with an unknown partition until it has the metadata again."""
        try:
            _, high = _asked_again(lambda left: self._consumer.get_watermark_offsets(
                self._partition, timeout=left, cached=False), deadline)
        except KafkaException as exc:
            raise store_error(f"could not find the end of {self.topic}: {exc.args[0].str()}") from None
        return high

    def _position(self) -> int:
        assert self._consumer is not None
        [partition] = self._consumer.position([self._partition])
        return max(partition.offset, 0)

    def _ensure_topic(self) -> None:
        admin = AdminClient({**self.kafka_config, "bootstrap.servers": self.bootstrap_servers, **QUIET})
        # Compacted, never deleted by age or size: the topic *is* the registry. Replicated as the cluster's
        # default says (KIP-464): one replica would refuse acks=all writes under min.insync.replicas of 2.
        topic = NewTopic(
            self.topic,
            num_partitions=1,
            replication_factor=-1,
            config={"cleanup.policy": "compact", "retention.ms": "-1", "retention.bytes": "-1"},
        )

        def create(left: float) -> None:
            future = admin.create_topics([topic], operation_timeout=left, request_timeout=left)[self.topic]
            try:
                future.result(timeout=left)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

        _asked_again(create, time.monotonic() + self.timeout)


def _asked_again(ask: Callable[[float], T], deadline: float) -> T:
    """``ask(seconds left)``, again after each TRANSIENT error until ``deadline``; then its error is raised."""
    while True:
        try:
            return ask(max(deadline - time.monotonic(), 0.1))
        except KafkaException as exc:
            if exc.args[0].code() not in TRANSIENT or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def _decode(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return document if isinstance(document, dict) else None
