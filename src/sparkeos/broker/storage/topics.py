"""The broker's topics: names, ids, partition counts, configs, and their partition logs.

Topic metadata lives in one JSON file replaced atomically; each partition is a directory
`<topic>-<partition>` like Kafka's log dirs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import INVALID_CONFIG, INVALID_TOPIC_EXCEPTION
from .cleaner import CompactionConfig
from .files import fsync_directory
from .log import LogConfig, PartitionLog

METADATA_FILE = "topics.json"
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")

# Topic configs the broker understands, with Kafka's defaults.
TOPIC_CONFIG_DEFAULTS: dict[str, str] = {
    "cleanup.policy": "delete",
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.type": "producer",
    "compression.zstd.level": "3",
    "delete.retention.ms": "86400000",
    "file.delete.delay.ms": "60000",
    "max.compaction.lag.ms": "9223372036854775807",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "min.insync.replicas": "1",
    "retention.bytes": "-1",
    "retention.ms": "604800000",
    "segment.bytes": "1073741824",
    "segment.ms": "604800000",
    "unclean.leader.election.enable": "false",
}


# Kafka's values of compression.type, in the order its error message lists them.
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
# Each codec's level config: the range Kafka accepts and its default (KIP-390).
COMPRESSION_LEVELS = {
    "compression.gzip.level": (1, 9, -1),
    "compression.lz4.level": (1, 17, 9),
    "compression.zstd.level": (-131072, 22, 3),
}


class InvalidTopic(Exception):
    error_code = INVALID_TOPIC_EXCEPTION


class InvalidConfig(Exception):
    error_code = INVALID_CONFIG


def validate_topic_name(name: str | None) -> None:
    """Kafka's Topic.validate rules."""
    if not name:
        raise InvalidTopic("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopic(f"topic name cannot be '{name}'")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopic(f"topic name is longer than {MAX_TOPIC_NAME_LENGTH} characters")
    if not _LEGAL_TOPIC_NAME.match(name):
        raise InvalidTopic(f"topic name '{name}' has characters other than ASCII alphanumerics, '.', '_', '-'")


def validate_configs(configs: dict[str, str]) -> None:
    for key, value in configs.items():
        if key not in TOPIC_CONFIG_DEFAULTS:
            raise InvalidConfig(f"unknown topic config '{key}'")
        if key in ("max.message.bytes", "retention.bytes", "retention.ms", "segment.bytes", "segment.ms",
                   "min.insync.replicas", "delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms",
                   "file.delete.delay.ms",
                   *COMPRESSION_LEVELS):
            try:
                int(value)
            except (TypeError, ValueError):
                raise InvalidConfig(f"topic config '{key}' must be an integer, got {value!r}") from None
        if key in ("delete.retention.ms", "min.compaction.lag.ms") and int(value) < 0:
            raise InvalidConfig(f"Invalid value {value} for configuration {key}: Value must be at least 0")
        if key == "max.compaction.lag.ms" and int(value) < 1:
            raise InvalidConfig(f"Invalid value {value} for configuration {key}: Value must be at least 1")
        if key == "min.cleanable.dirty.ratio":
            try:
                ratio = float(value)
            except (TypeError, ValueError):
                raise InvalidConfig(f"topic config '{key}' must be a number, got {value!r}") from None
            if not 0 <= ratio <= 1:
                raise InvalidConfig(f"Invalid value {value} for configuration {key}: Value must be between 0 and 1")
        if key == "segment.bytes" and int(value) < 14:
            raise InvalidConfig("topic config 'segment.bytes' must be at least 14")
        if key == "message.timestamp.type" and value not in ("CreateTime", "LogAppendTime"):
            raise InvalidConfig("topic config 'message.timestamp.type' must be CreateTime or LogAppendTime")
        if key == "compression.type" and value not in COMPRESSION_TYPES:
            raise InvalidConfig(f"Invalid value {value} for configuration compression.type: String must be one of: "
                                f"{', '.join(COMPRESSION_TYPES)}")
        if key in COMPRESSION_LEVELS:
            low, high, default = COMPRESSION_LEVELS[key]
            if not (low <= int(value) <= high or int(value) == default):
                also = f" or equal to {default}" if not low <= default <= high else ""
                raise InvalidConfig(f"Invalid value {value} for configuration {key}: Value must be between {low} "
                                    f"and {high}{also}")
        if key == "cleanup.policy" and value not in ("", "delete", "compact", "compact,delete", "delete,compact"):
            raise InvalidConfig(f"topic config 'cleanup.policy' has an invalid value {value!r}")
        if key == "min.insync.replicas" and int(value) != 1:
            raise InvalidConfig("topic config 'min.insync.replicas' must be 1 on a single-node broker")
    merged = {**TOPIC_CONFIG_DEFAULTS, **configs}
    if int(merged["max.compaction.lag.ms"]) < int(merged["min.compaction.lag.ms"]):
        raise InvalidConfig("conflict topic config setting max.compaction.lag.ms "
                            f"({merged['max.compaction.lag.ms']}) < min.compaction.lag.ms "
                            f"({merged['min.compaction.lag.ms']})")


def log_config(configs: dict[str, str]) -> LogConfig:
    def get(key: str) -> str:
        return configs.get(key, TOPIC_CONFIG_DEFAULTS[key])

    # As in Kafka, retention deletes segments only under the delete policy, and the cleaner compacts only under
    # the compact policy; an empty policy (Kafka 4.x) keeps everything.
    policies = get("cleanup.policy").split(",")
    deletes = "delete" in policies
    return LogConfig(
        segment_bytes=int(get("segment.bytes")),
        retention_ms=int(get("retention.ms")) if deletes else -1,
        retention_bytes=int(get("retention.bytes")) if deletes else -1,
        log_append_time=get("message.timestamp.type") == "LogAppendTime",
        max_message_bytes=int(get("max.message.bytes")),
        compacted="compact" in policies,
        segment_ms=int(get("segment.ms")),
        compaction=CompactionConfig(int(get("delete.retention.ms")), float(get("min.cleanable.dirty.ratio")),
                                    int(get("min.compaction.lag.ms")), int(get("max.compaction.lag.ms"))),
        compression=get("compression.type"),
        compression_level={"gzip": int(get("compression.gzip.level")), "lz4": int(get("compression.lz4.level")),
                           "zstd": int(get("compression.zstd.level"))}.get(get("compression.type")),
    )


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    partitions: list[PartitionLog] = field(default_factory=list)
    internal: bool = False

    def config_value(self, key: str) -> str:
        return self.configs.get(key, TOPIC_CONFIG_DEFAULTS[key])


class TopicStore:
    def __init__(self, data_dir: Path, default_configs: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.default_configs = dict(default_configs or {})
        self.topics: dict[str, Topic] = {}
        data_dir.mkdir(parents=True, exist_ok=True)
        self._load()

    def _metadata_path(self) -> Path:
        return self.data_dir / METADATA_FILE

    def _load(self) -> None:
        path = self._metadata_path()
        if not path.exists():
            return
        data = json.loads(path.read_text())
        for name, entry in data["topics"].items():
            topic = Topic(name, uuid.UUID(entry["id"]), entry["configs"], internal=entry.get("internal", False))
            config = log_config({**self.default_configs, **topic.configs})
            topic.partitions = [
                PartitionLog(self._partition_dir(name, p), config) for p in range(entry["partitions"])
            ]
            self.topics[name] = topic
        for leftover in self.data_dir.glob("*.deleted"):
            shutil.rmtree(leftover, ignore_errors=True)

    def _save(self) -> None:
        data = {
            "topics": {
                t.name: {
                    "id": str(t.topic_id),
                    "partitions": len(t.partitions),
                    "configs": t.configs,
                    "internal": t.internal,
                }
                for t in self.topics.values()
            }
        }
        path = self._metadata_path()
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_directory(self.data_dir)

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        for topic in self.topics.values():
            if topic.topic_id == topic_id:
                return topic
        return None

    def partition(self, name: str, index: int) -> PartitionLog | None:
        topic = self.topics.get(name)
        if topic is None or not 0 <= index < len(topic.partitions):
            return None
        return topic.partitions[index]

    def create(
        self, name: str, partitions: int, configs: dict[str, str] | None = None, internal: bool = False
    ) -> Topic:
        validate_topic_name(name)
        configs = dict(configs or {})
        validate_configs(configs)
        config = log_config({**self.default_configs, **configs})
        topic = Topic(name, uuid.uuid4(), configs, internal=internal)
        for p in range(partitions):
            directory = self._partition_dir(name, p)
            if directory.exists():  # stale directory of a topic deleted before a crash
                shutil.rmtree(directory)
            topic.partitions.append(PartitionLog(directory, config))
        self.topics[name] = topic
        self._save()
        return topic

    def add_partitions(self, name: str, total: int) -> None:
        topic = self.topics[name]
        config = log_config({**self.default_configs, **topic.configs})
        for p in range(len(topic.partitions), total):
            directory = self._partition_dir(name, p)
            if directory.exists():
                shutil.rmtree(directory)
            topic.partitions.append(PartitionLog(directory, config))
        self._save()

    def delete(self, name: str) -> None:
        topic = self.topics.pop(name)
        self._save()
        for p, log in enumerate(topic.partitions):
            log.close_without_marker()
            directory = self._partition_dir(name, p)
            # Named by topic id: the topic name plus a suffix can exceed the file name limit.
            doomed = directory.with_name(f"{topic.topic_id.hex}-{p}.deleted")
            os.replace(directory, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def alter_configs(self, name: str, configs: dict[str, str]) -> None:
        validate_configs(configs)
        topic = self.topics[name]
        topic.configs = dict(configs)
        config = log_config({**self.default_configs, **topic.configs})
        for log in topic.partitions:
            log.config = config
        self._save()

    def close(self) -> None:
        for topic in self.topics.values():
            for log in topic.partitions:
                log.close()
