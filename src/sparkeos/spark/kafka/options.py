"""Options of the `sparkeos.kafka` source and sink, parsed and validated once, up front.

Names and meanings follow Spark's own Kafka connector (`startingOffsets`, `maxOffsetsPerTrigger`,
`kafka.*` passed to the client, ...); they are read case-insensitively (`sparkeos.spark.options`), and every
error names the option as the user spells it in Spark's documentation.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..options import CaseInsensitiveOptions, OptionError

log = logging.getLogger("sparkeos.options")

EARLIEST = -2
LATEST = -1

DEFAULT_MARKER_TOPIC = "_sparkeos_sink_commits"
DEFAULT_GROUP_ID_PREFIX = "sparkeos"

# Kafka clients are cached per Python worker (`sparkeos.spark.client_cache`) and closed once idle for Spark's
# spark.kafka.consumer.cache.timeout or spark.kafka.producer.cache.timeout. Python workers cannot read SparkConf,
# so the timeouts reach them as these environment variables of the executors (spark.executorEnv.*), which
# `sparkeos.spark.session` sets from Spark's names.
CONSUMER_TIMEOUT_ENV = "SPARKEOS_CONSUMER_CACHE_TIMEOUT"
PRODUCER_TIMEOUT_ENV = "SPARKEOS_PRODUCER_CACHE_TIMEOUT"
SPARK_CONF_FOR_ENV = {
    "spark.kafka.consumer.cache.timeout": CONSUMER_TIMEOUT_ENV,
    "spark.kafka.producer.cache.timeout": PRODUCER_TIMEOUT_ENV,
}
# Spark's defaults for those two.
CONSUMER_CACHE_TIMEOUT = "5m"
PRODUCER_CACHE_TIMEOUT = "10m"

# A new librdkafka client connects to a broker it learned from metadata only after half of reconnect.backoff.ms,
# so every new consumer, producer and admin client waits that long once: the Java client's default, which Spark's
# own Kafka connector runs with, halves librdkafka's. librdkafka's backoff also grows ten times as far as the Java
# client's: a broker back after a short outage then stayed unreached for long enough to outlast a short
# transaction timeout, and sink tasks failed.
CONNECTION_DEFAULTS = {"reconnect.backoff.ms": "50", "reconnect.backoff.max.ms": "1000"}

# Kafka Streams' linger.ms for its producers. A sink task writes its whole input, then flushes (commit_transaction
# flushes too), and a flush sends at once whatever linger.ms: a longer wait costs a batch nothing and makes fuller
# Produce requests. With librdkafka's short default, each producer's broker thread spent several times the CPU on
# many small requests.
SINK_LINGER_MS = 100


@dataclass(frozen=True)
class StartSpec:
    """Where reading starts (or, for batch queries, ends) when no checkpoint says otherwise.

    `kind` is "earliest", "latest", "group", "offsets" (per-partition offsets, -2 earliest, -1 latest),
    "timestamp" (one timestamp for every partition) or "timestamps" (per-partition timestamps).
    """

    kind: str
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    timestamp: int | None = None
    option: str = "startingOffsets"


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting: StartSpec = StartSpec("latest")
    ending: StartSpec = StartSpec("latest", option="endingOffsets")
    timestamp_strategy: str = "error"
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 10
    # Bound on every driver-side metadata/offset request (the Java consumer's default.api.timeout.ms).
    api_timeout_ms: int = 30_000
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    group_id: str | None = None
    group_id_prefix: str = DEFAULT_GROUP_ID_PREFIX
    commit_offsets_to_group: bool = False
    kafka: dict[str, str] = field(default_factory=dict)

    def describe_subscription(self) -> str:
        if self.subscribe:
            return f"subscribe={','.join(self.subscribe)}"
        if self.subscribe_pattern is not None:
            return f"subscribePattern={self.subscribe_pattern}"
        return f"assign={json.dumps({t: list(p) for t, p in (self.assign or {}).items()})}"

    def consumer_config(self) -> dict[str, str]:
        """librdkafka settings for reading: the user's `kafka.*` over read_committed defaults."""
        config = {
            "bootstrap.servers": self.bootstrap_servers,
            "isolation.level": "read_committed",
            # Readers assign partitions and never join the group or commit to it: the id only has to be one the
            # cluster's ACLs allow.
            "group.id": self.group_id or f"{self.group_id_prefix}-reader",
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
            "enable.partition.eof": "true",
            # Once queued.min.messages records wait in librdkafka's queue it stops fetching for this long, a whole
            # second by default: a task reading a large range then sat idle for most of its time.
            "fetch.queue.backoff.ms": "10",
            # A range is read only once it exists, so a long poll at its end can only delay the next task: the
            # consumer sends one Fetch at a time, and a newly assigned partition waited out the previous range's
            # long poll, which made a small task many times slower.
            "fetch.wait.max.ms": "10",
            **CONNECTION_DEFAULTS,
        }
        config.update(self.kafka)
        config["bootstrap.servers"] = self.bootstrap_servers
        # A reader consumes exactly [start, end) and never commits: Spark's checkpoint owns positions.
        config["enable.auto.commit"] = "false"
        config["enable.partition.eof"] = "true"
        # Offsets gone from Kafka are reported to the reader, which fails or (failOnDataLoss=false) moves on
        # within its range; a silent reset to earliest would read records below the range.
        config["auto.offset.reset"] = "error"
        return config

    @property
    def read_committed(self) -> bool:
        return self.kafka.get("isolation.level", "read_committed") == "read_committed"


@dataclass(frozen=True)
class SinkOptions:
    bootstrap_servers: str
    topic: str | None = None
    delivery_guarantee: str = "exactly_once"
    transactional_id_prefix: str | None = None
    marker_topic: str = DEFAULT_MARKER_TOPIC
    transaction_timeout_ms: int = 60_000
    api_timeout_ms: int = 30_000
    kafka: dict[str, str] = field(default_factory=dict)

    def producer_config(self) -> dict[str, str]:
        config = {"bootstrap.servers": self.bootstrap_servers, "linger.ms": self._default_linger_ms(),
                  **CONNECTION_DEFAULTS,
                  # The Java client's partitioning, as Spark's own Kafka sink does it: a key goes to murmur2(key).
                  # librdkafka's default (CRC32) would send the same key elsewhere, splitting a key's records
                  # over two partitions once a topic written by Spark's sink or a Java producer is written by us.
                  "partitioner": "murmur2_random"}
        if self.delivery_guarantee == "exactly_once":
            config["enable.idempotence"] = "true"
            config["transaction.timeout.ms"] = str(self.transaction_timeout_ms)
        elif self.delivery_guarantee == "at_least_once":
            config["enable.idempotence"] = "true"
        config.update(self.kafka)
        config["bootstrap.servers"] = self.bootstrap_servers
        return config

    def _default_linger_ms(self) -> str:
        # librdkafka refuses a linger.ms that is not below message.timeout.ms (alias delivery.timeout.ms): a
        # user's short message timeout must not turn the sink's own default into an error.
        timeouts = [int(value) for key, value in self.kafka.items()
                    if key in ("message.timeout.ms", "delivery.timeout.ms") and str(value).strip().isdigit()]
        return str(min([SINK_LINGER_MS, *(timeout - 1 for timeout in timeouts if timeout > 0)]))


SOURCE_OPTIONS = {
    "kafka.bootstrap.servers", "subscribe", "subscribePattern", "assign", "startingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "endingOffsets", "endingTimestamp",
    "endingOffsetsByTimestamp", "failOnDataLoss", "kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "minPartitions", "maxRecordsPerPartition", "groupIdPrefix", "includeHeaders", "commitOffsetsToGroup",
}
# Where reading starts, and where a batch read ends: one of each at most.
STARTING_OPTIONS = ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp")
ENDING_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
BATCH_ONLY_SOURCE_OPTIONS = set(ENDING_OPTIONS)
# The trigger's limits, the one list of source options only a streaming query uses.
STREAM_ONLY_SOURCE_OPTIONS = {"maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"}
SINK_OPTIONS = {
    "kafka.bootstrap.servers", "topic", "deliveryGuarantee", "transactionalIdPrefix", "commitMarkerTopic",
    "writeId",
}
DELIVERY_GUARANTEES = ("exactly_once", "at_least_once", "none")

# Options named kafka.* are librdkafka's settings, handed to the client without the prefix.
KAFKA_PREFIX = "kafka."
KAFKA_PASSTHROUGH = (KAFKA_PREFIX,)

# librdkafka settings the connector owns; a user value would silently break its guarantees.
SOURCE_OWNED_KAFKA = {
    "kafka.enable.auto.commit": "Spark's checkpoint owns the read positions; offsets are never auto-committed",
    "kafka.enable.partition.eof": "the reader needs end-of-partition events to finish ranges that end on markers",
}
SINK_OWNED_KAFKA = {
    "kafka.transactional.id": "set the option transactionalIdPrefix instead; one id is derived per Spark partition",
}


def check_source_options(raw: Mapping[str, str]) -> None:
    """Raise the OptionError of options no read can use, whether it turns out to be streaming or batch."""
    try:
        parse_source_options(raw, streaming=True)
    except OptionError:
        parse_source_options(raw, streaming=False)


def parse_source_options(raw: Mapping[str, str], streaming: bool) -> SourceOptions:
    options = CaseInsensitiveOptions(raw, SOURCE_OPTIONS, "sparkeos.kafka source", KAFKA_PASSTHROUGH)
    for name in sorted(BATCH_ONLY_SOURCE_OPTIONS if streaming else STREAM_ONLY_SOURCE_OPTIONS):
        if not options.has(name):
            continue
        if streaming:
            raise OptionError(f"option '{name}' is not supported in streaming queries")
        # As Spark: a batch read of a stream's options (the same DataFrame code run once) warns, no more.
        log.warning("option '%s' is ignored in batch queries", name)
    for key, reason in SOURCE_OWNED_KAFKA.items():
        if options.has(key):
            raise OptionError(f"option '{key}' cannot be set: {reason}")
    kafka = options.prefixed(KAFKA_PREFIX)
    # A Java-client name Spark users set to bound offset look-ups; librdkafka does not know it, so it is kept here.
    api_timeout_ms = options.integer("kafka.default.api.timeout.ms", 30_000, minimum=1)
    kafka.pop("default.api.timeout.ms", None)
    isolation = kafka.get("isolation.level", "read_committed")
    if isolation not in ("read_committed", "read_uncommitted"):
        raise OptionError(
            f"option 'kafka.isolation.level' must be read_committed or read_uncommitted, got {isolation!r}"
        )
    subscribe, pattern, assign = _parse_subscription(options)
    group_id = kafka.get("group.id")
    group_id_prefix = _parse_group_id_prefix(options, group_id)
    commit_to_group = options.boolean("commitOffsetsToGroup", group_id is not None)
    if commit_to_group and group_id is None:
        raise OptionError("option 'commitOffsetsToGroup' needs 'kafka.group.id' to name the group to commit to")
    starting = _parse_start(options, default="latest" if streaming else "earliest", group_id=group_id)
    if not streaming:
        _refuse_latest_start_in_batch(starting)
    if "auto.offset.reset" in kafka and starting.kind != "group":
        raise OptionError(
            "option 'kafka.auto.offset.reset' is only used with startingOffsets=group; "
            "use 'startingOffsets' to choose where reading starts"
        )
    ending = StartSpec("latest", option="endingOffsets") if streaming else _parse_end(options)
    strategy = (options.get("startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {strategy!r}")
    max_per_trigger = options.integer("maxOffsetsPerTrigger", None, minimum=1)
    min_per_trigger = options.integer("minOffsetsPerTrigger", None, minimum=1)
    if max_per_trigger is not None and min_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise OptionError(
            f"option 'minOffsetsPerTrigger' ({min_per_trigger}) must not exceed 'maxOffsetsPerTrigger' "
            f"({max_per_trigger})"
        )
    return SourceOptions(
        bootstrap_servers=options.require("kafka.bootstrap.servers"),
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        timestamp_strategy=strategy,
        fail_on_data_loss=options.boolean("failOnDataLoss", True),
        poll_timeout_ms=options.integer("kafkaConsumer.pollTimeoutMs", 120_000, minimum=1),
        fetch_offset_retries=options.integer("fetchOffset.numRetries", 3),
        fetch_offset_retry_interval_ms=options.integer("fetchOffset.retryIntervalMs", 10),
        api_timeout_ms=api_timeout_ms,
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=options.duration_ms("maxTriggerDelay", "15m"),
        min_partitions=options.integer("minPartitions", None, minimum=1),
        max_records_per_partition=options.integer("maxRecordsPerPartition", None, minimum=1),
        include_headers=options.boolean("includeHeaders", False),
        group_id=group_id,
        group_id_prefix=group_id_prefix,
        commit_offsets_to_group=commit_to_group,
        kafka=kafka,
    )


def _parse_subscription(
    options: CaseInsensitiveOptions,
) -> tuple[tuple[str, ...], str | None, dict[str, tuple[int, ...]] | None]:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if options.has(name)]
    if len(given) != 1:
        named = ", ".join(f"'{name}'" for name in given) or "none"
        raise OptionError(f"exactly one of 'subscribe', 'subscribePattern' or 'assign' must be set (got {named})")
    if given[0] == "subscribe":
        topics = tuple(topic.strip() for topic in options.require("subscribe").split(",") if topic.strip())
        if not topics:
            raise OptionError("option 'subscribe' names no topic")
        return topics, None, None
    if given[0] == "subscribePattern":
        pattern = options.require("subscribePattern")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option 'subscribePattern' is not a valid regular expression: {exc}") from None
        return (), pattern, None
    parsed = _json_object(options, "assign")
    assign: dict[str, tuple[int, ...]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(isinstance(p, int) and p >= 0 for p in partitions):
            raise OptionError(f"option 'assign': topic {topic!r} must map to a list of partition numbers")
        assign[topic] = tuple(partitions)
    if not assign:
        raise OptionError("option 'assign' names no partition")
    return (), None, assign


def _parse_group_id_prefix(options: CaseInsensitiveOptions, group_id: str | None) -> str:
    prefix = options.get("groupIdPrefix")
    if prefix is None:
        return DEFAULT_GROUP_ID_PREFIX
    if not prefix.strip():
        raise OptionError("option 'groupIdPrefix' is empty")
    if group_id is not None:
        # As in Spark: the readers use the group the user names.
        log.warning("option 'groupIdPrefix' is ignored: 'kafka.group.id' names the group")
    return prefix.strip()


def _parse_start(options: CaseInsensitiveOptions, default: str, group_id: str | None) -> StartSpec:
    given = [name for name in STARTING_OPTIONS if options.has(name)]
    if len(given) > 1:
        raise OptionError(f"options {' and '.join(repr(n) for n in given)} contradict each other; set only one")
    if not given:
        return StartSpec(default)
    name = given[0]
    if name == "startingTimestamp":
        return StartSpec("timestamp", timestamp=options.integer(name, None), option=name)
    if name == "startingOffsetsByTimestamp":
        return StartSpec("timestamps", offsets=_partition_map(options, name, minimum=0), option=name)
    value = options.require(name)
    if value.lower() in ("earliest", "latest"):
        return StartSpec(value.lower(), option=name)
    if value.lower() == "group":
        if group_id is None:
            raise OptionError("option 'startingOffsets' is 'group' but 'kafka.group.id' is not set")
        return StartSpec("group", option=name)
    return StartSpec("offsets", offsets=_partition_map(options, name, minimum=EARLIEST), option=name)


def _refuse_latest_start_in_batch(starting: StartSpec) -> None:
    """As Spark's Kafka source: a batch query starting at latest would read nothing, which is never meant."""
    if starting.kind == "latest":
        raise OptionError("option 'startingOffsets' cannot be 'latest' for batch queries")
    if starting.kind != "offsets":
        return
    for topic, partitions in starting.offsets.items():
        for partition, offset in partitions.items():
            if offset == LATEST:
                raise OptionError(
                    f"option 'startingOffsets': {topic}-{partition} cannot start at latest (-1) in batch queries"
                )


def _parse_end(options: CaseInsensitiveOptions) -> StartSpec:
    given = [name for name in ENDING_OPTIONS if options.has(name)]
    if len(given) > 1:
        raise OptionError(f"options {' and '.join(repr(n) for n in given)} contradict each other; set only one")
    if not given:
        return StartSpec("latest", option="endingOffsets")
    name = given[0]
    if name == "endingTimestamp":
        return StartSpec("timestamp", timestamp=options.integer(name, None), option=name)
    if name == "endingOffsetsByTimestamp":
        return StartSpec("timestamps", offsets=_partition_map(options, name, minimum=0), option=name)
    value = options.require(name)
    if value.lower() == "latest":
        return StartSpec("latest", option=name)
    if value.lower() == "earliest":
        raise OptionError("option 'endingOffsets' cannot be 'earliest'")
    offsets = _partition_map(options, name, minimum=LATEST)
    return StartSpec("offsets", offsets=offsets, option=name)


def _json_object(options: CaseInsensitiveOptions, name: str) -> dict:
    text = options.require(name)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option '{name}' is not valid JSON ({exc.msg} at position {exc.pos}): {text!r}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f"option '{name}' must be a JSON object, got {text!r}")
    return parsed


def _partition_map(options: CaseInsensitiveOptions, name: str, minimum: int) -> dict[str, dict[int, int]]:
    """Parse Spark's `{"topic": {"0": 23, "1": -2}}` form."""
    parsed = _json_object(options, name)
    result: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(f"option '{name}': topic {topic!r} must map to an object of partition -> value")
        result[topic] = {}
        for partition, value in partitions.items():
            if not str(partition).isdigit():
                raise OptionError(f"option '{name}': partition {partition!r} of topic {topic!r} is not a number")
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise OptionError(
                    f"option '{name}': value {value!r} for {topic}-{partition} must be an integer >= {minimum}"
                )
            result[topic][int(partition)] = value
    return result


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    options = CaseInsensitiveOptions(raw, SINK_OPTIONS, "sparkeos.kafka sink", KAFKA_PASSTHROUGH)
    for key, reason in SINK_OWNED_KAFKA.items():
        if options.has(key):
            raise OptionError(f"option '{key}' cannot be set: {reason}")
    guarantee = (options.get("deliveryGuarantee") or "exactly_once").strip().lower().replace("-", "_")
    if guarantee not in DELIVERY_GUARANTEES:
        raise OptionError(
            f"option 'deliveryGuarantee' must be one of {', '.join(DELIVERY_GUARANTEES)}, got "
            f"{options.get('deliveryGuarantee')!r}"
        )
    kafka = options.prefixed(KAFKA_PREFIX)
    if guarantee == "exactly_once" and kafka.get("enable.idempotence", "true").lower() == "false":
        raise OptionError("option 'kafka.enable.idempotence=false' contradicts deliveryGuarantee=exactly_once")
    if guarantee != "exactly_once" and options.has("transactionalIdPrefix"):
        raise OptionError(
            f"option 'transactionalIdPrefix' only applies to deliveryGuarantee=exactly_once, not {guarantee}"
        )
    api_timeout_ms = options.integer("kafka.default.api.timeout.ms", 30_000, minimum=1)
    kafka.pop("default.api.timeout.ms", None)
    timeout = kafka.pop("transaction.timeout.ms", "60000")
    try:
        timeout_ms = int(timeout)
    except ValueError:
        raise OptionError(f"option 'kafka.transaction.timeout.ms' must be an integer, got {timeout!r}") from None
    if timeout_ms < 1:
        raise OptionError(f"option 'kafka.transaction.timeout.ms' must be positive, got {timeout_ms}")
    topic = options.get("topic")
    prefix = options.get("transactionalIdPrefix")
    if prefix is not None and not prefix.strip():
        raise OptionError("option 'transactionalIdPrefix' is empty")
    return SinkOptions(
        bootstrap_servers=options.require("kafka.bootstrap.servers"),
        topic=topic.strip() if topic and topic.strip() else None,
        delivery_guarantee=guarantee,
        transactional_id_prefix=prefix.strip() if prefix else None,
        marker_topic=(options.get("commitMarkerTopic") or DEFAULT_MARKER_TOPIC).strip(),
        transaction_timeout_ms=timeout_ms,
        api_timeout_ms=api_timeout_ms,
        kafka=kafka,
    )
