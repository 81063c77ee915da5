"""What the admin APIs share: their error, manual replica assignments, and configs as Kafka reports them.

Topic configs not set on the topic inherit the broker's value, as in Kafka: that value is a
static broker config when `BrokerConfig.topic_defaults` sets it, Kafka's default otherwise.
The broker's own configs are fixed at startup, so they are reported read-only and changing
them is refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from . import acls
from .core import NODE_ID
from .errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    INVALID_CONFIG,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REQUEST,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from .storage.topics import TOPIC_CONFIG_DEFAULTS, InvalidConfig, InvalidTopic, validate_configs, validate_topic_name

log = logging.getLogger("sparkeos.broker.admin")

# ConfigResource types
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4

# ConfigSource
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# ConfigType (DescribeConfigs v3+)
BOOLEAN = 1
STRING = 2
INT = 3
SHORT = 4
LONG = 5
DOUBLE = 6
LIST = 7

TOPIC_CONFIG_TYPES: dict[str, int] = {
    "cleanup.policy": LIST,
    "compression.gzip.level": INT,
    "compression.lz4.level": INT,
    "compression.type": STRING,
    "compression.zstd.level": INT,
    "delete.retention.ms": LONG,
    "file.delete.delay.ms": LONG,
    "max.compaction.lag.ms": LONG,
    "max.message.bytes": INT,
    "message.timestamp.type": STRING,
    "min.cleanable.dirty.ratio": DOUBLE,
    "min.compaction.lag.ms": LONG,
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
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.type": "compression.type",
    "compression.zstd.level": "compression.zstd.level",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "min.insync.replicas": "min.insync.replicas",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}


class AdminError(Exception):
    """A request an admin API refuses: Kafka's error code and the message it answers with."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


# -- manual replica assignments (CreateTopics, CreatePartitions) --------------------------------


def validate_assignment(broker_ids: list[int], replication_factor: int | None) -> int:
    """One partition's manual replica list; returns its replication factor."""
    if not broker_ids:
        raise AdminError(INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes an empty replica list.")
    if len(set(broker_ids)) != len(broker_ids):
        raise AdminError(INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes duplicate replicas.")
    for broker_id in broker_ids:
        if broker_id != NODE_ID:
            raise AdminError(INVALID_REPLICA_ASSIGNMENT, f"The manual partition assignment includes broker "
                                                         f"{broker_id}, but no such broker is registered.")
    if replication_factor is not None and len(broker_ids) != replication_factor:
        raise AdminError(INVALID_REPLICA_ASSIGNMENT,
                         f"The manual partition assignment includes a partition with {len(broker_ids)} replica(s), "
                         f"but this is inconsistent with previous partitions, which have {replication_factor} "
                         f"replica(s).")
    return len(broker_ids)


# -- configs (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, CreateTopics) -------------


@dataclass(slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int
    config_type: int
    read_only: bool = False
    sensitive: bool = False
    synonyms: list[tuple[str, str | None, int]] = field(default_factory=list)


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
        if name == "min.insync.replicas":
            # As Kafka 4.1+ describes it: its controller writes a cluster-wide value (eligible leader replicas,
            # KIP-966), which admin tools then list among the configs that are not defaults.
            synonyms.append((broker_name, kafka_default, DYNAMIC_DEFAULT_BROKER_CONFIG))
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
        ("listeners", ",".join(str(listener) for listener in broker.listeners), "PLAINTEXT://:9092", STRING),
        ("advertised.listeners", ",".join(f"{listener.name}://{listener.address[0]}:{listener.address[1]}"
                                          for listener in broker.listeners), None, STRING),
        ("sasl.enabled.mechanisms", ",".join(config.sasl_enabled_mechanisms), "GSSAPI", LIST),
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
        ("queued.max.request.bytes", str(config.queued_max_request_bytes), "-1", LONG),
        ("message.max.bytes", topic["max.message.bytes"], "1048588", INT),
        ("compression.type", topic["compression.type"], "producer", STRING),
        ("compression.gzip.level", topic["compression.gzip.level"], "-1", INT),
        ("compression.lz4.level", topic["compression.lz4.level"], "9", INT),
        ("compression.zstd.level", topic["compression.zstd.level"], "3", INT),
        ("log.cleanup.policy", topic["cleanup.policy"], "delete", LIST),
        ("log.cleaner.delete.retention.ms", topic["delete.retention.ms"], "86400000", LONG),
        ("log.segment.delete.delay.ms", topic["file.delete.delay.ms"], "60000", LONG),
        ("log.cleaner.max.compaction.lag.ms", topic["max.compaction.lag.ms"], "9223372036854775807", LONG),
        ("log.cleaner.min.cleanable.ratio", topic["min.cleanable.dirty.ratio"], "0.5", DOUBLE),
        ("log.cleaner.min.compaction.lag.ms", topic["min.compaction.lag.ms"], "0", LONG),
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
    """The configs of one resource, or AdminError with Kafka's error for it."""
    if resource_type == TOPIC_RESOURCE:
        try:
            validate_topic_name(resource_name)
        except InvalidTopic as exc:
            raise AdminError(InvalidTopic.error_code, str(exc)) from None
        topic = broker.store.get(resource_name)
        if topic is None:
            raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, f"topic '{resource_name}' does not exist")
        return topic_config_entries(broker, topic.configs)
    if resource_type == BROKER_RESOURCE:
        if not resource_name:
            return []  # the cluster-wide dynamic defaults: this broker has none
        check_broker_name(resource_name)
        return broker_config_entries(broker)
    raise AdminError(INVALID_REQUEST, f"unsupported config resource type {resource_type}")


def check_config_access(broker, context, operation: int, resource_type: int, resource_name: str) -> None:
    """AdminError unless the principal may do `operation` (DESCRIBE_CONFIGS, ALTER_CONFIGS) to the configs of the
    resource: a topic's, or the broker's (on the cluster), as Kafka authorizes them."""
    if resource_type == TOPIC_RESOURCE and not broker.allowed(context, operation, acls.TOPIC, resource_name):
        raise AdminError(TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed.")
    if resource_type == BROKER_RESOURCE and not broker.allowed(context, operation, acls.CLUSTER, acls.CLUSTER_NAME):
        raise AdminError(CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")


def check_broker_name(resource_name: str) -> None:
    try:
        broker_id = int(resource_name)
    except ValueError:
        raise AdminError(INVALID_REQUEST, f"broker id must be an integer, got '{resource_name}'") from None
    if broker_id != NODE_ID:
        raise AdminError(INVALID_REQUEST,
                         f"unexpected broker id, expected {NODE_ID} or empty string, but received {resource_name}")


def check_alterable(broker, resource) -> None:
    """AdminError unless `resource` exists and may be altered."""
    resource_config_entries(broker, resource.resource_type, resource.resource_name)
    if resource.resource_type == BROKER_RESOURCE and resource.configs:
        names = ", ".join(sorted(c.name for c in resource.configs))
        raise AdminError(INVALID_REQUEST, f"Cannot update these configs dynamically: {names}")


def duplicate_resources(resources) -> set[tuple[int, str]]:
    seen: set[tuple[int, str]] = set()
    duplicates = set()
    for resource in resources:
        key = (resource.resource_type, resource.resource_name)
        if key in seen:
            duplicates.add(key)
        seen.add(key)
    return duplicates


def apply_topic_configs(broker, name: str, configs: dict[str, str], validate_only: bool) -> None:
    try:
        validate_configs(configs)
    except InvalidConfig as exc:
        raise AdminError(INVALID_CONFIG, str(exc)) from None
    if not validate_only:
        broker.store.alter_configs(name, configs)
        log.info("topic %s configs are now %s", name, configs)
