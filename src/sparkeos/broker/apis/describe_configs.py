"""DescribeConfigs (32): every topic config with its source, and the broker configs clients read.

Topic configs not set on the topic inherit the broker's value, as in Kafka: that value is a
static broker config when `BrokerConfig.topic_defaults` sets it, Kafka's default otherwise.
The broker's own configs cannot be changed at runtime, so they are reported read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse

from ..core import NODE_ID
from ..storage.topics import TOPIC_CONFIG_DEFAULTS, InvalidTopic, validate_topic_name
from .registry import api

INVALID_REQUEST = 42
UNKNOWN_TOPIC_OR_PARTITION = 3

# ConfigResource types
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4

# ConfigSource
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# ConfigType (DescribeConfigs v3+)
BOOLEAN = 1
STRING = 2
INT = 3
SHORT = 4
LONG = 5
LIST = 7

TOPIC_CONFIG_TYPES: dict[str, int] = {
    "cleanup.policy": LIST,
    "compression.type": STRING,
    "max.message.bytes": INT,
    "message.timestamp.type": STRING,
    "min.insync.replicas": INT,
    "retention.bytes": LONG,
    "retention.ms": LONG,
    "segment.bytes": INT,
    "segment.ms": LONG,
    "unclean.leader.election.enable": BOOLEAN,
}

# The broker config that supplies each topic config's default (Kafka's config synonyms).
TOPIC_BROKER_SYNONYMS: dict[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "min.insync.replicas": "min.insync.replicas",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

Result = DescribeConfigsResponse.DescribeConfigsResult
ResourceResult = Result.DescribeConfigsResourceResult
Synonym = ResourceResult.DescribeConfigsSynonym


@dataclass(slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int
    config_type: int
    read_only: bool = False
    sensitive: bool = False
    synonyms: list[tuple[str, str | None, int]] = field(default_factory=list)


class ConfigError(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


def topic_config_entries(broker, topic_configs: dict[str, str]) -> list[ConfigEntry]:
    """Every topic config Kafka-style: set on the topic, inherited from the broker, or default."""
    broker_overrides = broker.config.topic_defaults
    entries = []
    for name, kafka_default in TOPIC_CONFIG_DEFAULTS.items():
        broker_name = TOPIC_BROKER_SYNONYMS[name]
        synonyms: list[tuple[str, str | None, int]] = []
        if name in topic_configs:
            synonyms.append((name, topic_configs[name], DYNAMIC_TOPIC_CONFIG))
        if name in broker_overrides:
            synonyms.append((broker_name, broker_overrides[name], STATIC_BROKER_CONFIG))
        synonyms.append((broker_name, kafka_default, DEFAULT_CONFIG))
        _, value, source = synonyms[0]
        entries.append(ConfigEntry(name, value, source, TOPIC_CONFIG_TYPES[name], synonyms=synonyms))
    return entries


def _bool(value: bool) -> str:
    return "true" if value else "false"


def broker_config_entries(broker) -> list[ConfigEntry]:
    """The broker configs clients and admin tools ask for, as this broker really applies them."""
    config = broker.config
    topic = {**TOPIC_CONFIG_DEFAULTS, **config.topic_defaults}
    rows: list[tuple[str, str | None, str | None, int]] = [
        # (name, value, Kafka's default, type)
        ("broker.id", str(NODE_ID), "-1", INT),
        ("node.id", str(NODE_ID), "-1", INT),
        ("listeners", f"PLAINTEXT://{config.host}:{config.port}", "PLAINTEXT://:9092", STRING),
        ("advertised.listeners", f"PLAINTEXT://{broker.advertised_host}:{broker.advertised_port}", None, STRING),
        ("log.dirs", str(config.data_dir), None, STRING),
        ("auto.create.topics.enable", _bool(config.auto_create_topics), "true", BOOLEAN),
        ("delete.topic.enable", "true", "true", BOOLEAN),
        ("num.partitions", str(config.num_partitions), "1", INT),
        ("default.replication.factor", "1", "1", INT),
        ("min.insync.replicas", topic["min.insync.replicas"], "1", INT),
        ("offsets.topic.replication.factor", "1", "3", SHORT),
        ("transaction.state.log.replication.factor", "1", "3", SHORT),
        ("transaction.state.log.min.isr", "1", "2", INT),
        ("socket.request.max.bytes", str(config.max_request_bytes), "104857600", INT),
        ("message.max.bytes", topic["max.message.bytes"], "1048588", INT),
        ("compression.type", topic["compression.type"], "producer", STRING),
        ("log.cleanup.policy", topic["cleanup.policy"], "delete", LIST),
        ("log.message.timestamp.type", topic["message.timestamp.type"], "CreateTime", STRING),
        ("log.retention.ms", topic["retention.ms"], "604800000", LONG),
        ("log.retention.bytes", topic["retention.bytes"], "-1", LONG),
        ("log.segment.bytes", topic["segment.bytes"], "1073741824", INT),
        ("log.roll.ms", topic["segment.ms"], "604800000", LONG),
        # Retention is applied by the broker's housekeeping pass, once a second.
        ("log.retention.check.interval.ms", "1000", "300000", LONG),
        ("unclean.leader.election.enable", topic["unclean.leader.election.enable"], "false", BOOLEAN),
        ("offsets.retention.minutes", str(config.offsets_retention_minutes), "10080", INT),
        ("offsets.retention.check.interval.ms", str(getattr(config, "offsets_retention_check_interval_ms", 600000)),
         "600000", LONG),
        ("group.initial.rebalance.delay.ms", str(config.group_initial_rebalance_delay_ms), "3000", INT),
        ("group.min.session.timeout.ms", str(config.group_min_session_timeout_ms), "6000", INT),
        ("group.max.session.timeout.ms", str(config.group_max_session_timeout_ms), "1800000", INT),
        ("transaction.max.timeout.ms", str(getattr(config, "transaction_max_timeout_ms", 900000)), "900000", INT),
        ("transactional.id.expiration.ms", str(getattr(config, "transactional_id_expiration_ms", 604800000)),
         "604800000", INT),
    ]
    entries = []
    for name, value, kafka_default, config_type in rows:
        source = DEFAULT_CONFIG if value == kafka_default else STATIC_BROKER_CONFIG
        synonyms = [(name, value, source)]
        if source != DEFAULT_CONFIG and kafka_default is not None:
            synonyms.append((name, kafka_default, DEFAULT_CONFIG))
        entries.append(ConfigEntry(name, value, source, config_type, read_only=True, synonyms=synonyms))
    return entries


def resource_config_entries(broker, resource_type: int, resource_name: str) -> list[ConfigEntry]:
    """The configs of one resource, or ConfigError with Kafka's error for it."""
    if resource_type == TOPIC_RESOURCE:
        try:
            validate_topic_name(resource_name)
        except InvalidTopic as exc:
            raise ConfigError(InvalidTopic.error_code, str(exc)) from None
        topic = broker.store.get(resource_name)
        if topic is None:
            raise ConfigError(UNKNOWN_TOPIC_OR_PARTITION, f"topic '{resource_name}' does not exist")
        return topic_config_entries(broker, topic.configs)
    if resource_type == BROKER_RESOURCE:
        if not resource_name:
            return []  # the cluster-wide dynamic defaults: this broker has none
        check_broker_name(resource_name)
        return broker_config_entries(broker)
    raise ConfigError(INVALID_REQUEST, f"unsupported config resource type {resource_type}")


def check_broker_name(resource_name: str) -> None:
    try:
        broker_id = int(resource_name)
    except ValueError:
        raise ConfigError(INVALID_REQUEST, f"broker id must be an integer, got '{resource_name}'") from None
    if broker_id != NODE_ID:
        raise ConfigError(INVALID_REQUEST,
                          f"unexpected broker id, expected {NODE_ID} or empty string, but received {resource_name}")


def _describe(entry: ConfigEntry, include_synonyms: bool) -> ResourceResult:
    return ResourceResult(
        name=entry.name,
        value=entry.value,
        read_only=entry.read_only,
        config_source=entry.source,
        is_default=entry.source == DEFAULT_CONFIG,
        is_sensitive=entry.sensitive,
        synonyms=[Synonym(name=n, value=v, source=s) for n, v, s in entry.synonyms] if include_synonyms else [],
        config_type=entry.config_type,
        documentation=None,
    )


@api(DescribeConfigsRequest, DescribeConfigsResponse, 0, 4)
async def handle(broker, context, request):
    include_synonyms = context.version >= 1 and request.include_synonyms
    results = []
    for resource in request.resources:
        try:
            entries = resource_config_entries(broker, resource.resource_type, resource.resource_name)
        except ConfigError as exc:
            results.append(Result(error_code=exc.error_code, error_message=str(exc),
                                  resource_type=resource.resource_type, resource_name=resource.resource_name,
                                  configs=[]))
            continue
        keys = resource.configuration_keys
        if keys:  # null or empty: every config
            wanted = set(keys)
            entries = [e for e in entries if e.name in wanted]
        results.append(Result(
            error_code=0,
            error_message=None,
            resource_type=resource.resource_type,
            resource_name=resource.resource_name,
            configs=[_describe(e, include_synonyms) for e in entries],
        ))
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)
