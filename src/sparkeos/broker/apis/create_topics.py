"""CreateTopics (19): Kafka's validation order and error codes, on a single broker.

Everything a request asks for is checked before anything is created, so `validate_only`
answers exactly what a real creation would.

Leaves out:
- `timeout_ms`: the topic exists before the answer is sent;
- topic configs other than the ten the broker knows (docs/broker.md), refused with INVALID_CONFIG.
"""

from __future__ import annotations

import logging
import uuid

from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse

from ..acls import CLUSTER, CLUSTER_NAME, CREATE, TOPIC
from ..admin import AdminError, topic_config_entries, validate_assignment
from ..dispatch import api
from ..errors import (
    INVALID_CONFIG,
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    INVALID_REQUEST,
    TOPIC_ALREADY_EXISTS,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_SERVER_ERROR,
)
from ..storage.topics import InvalidConfig, InvalidTopic, validate_configs, validate_topic_name

log = logging.getLogger("sparkeos.broker.admin")

ZERO_UUID = uuid.UUID(int=0)
BROKER_COUNT = 1

Result = CreateTopicsResponse.CreatableTopicResult
ResultConfig = Result.CreatableTopicConfigs


def check_replication_factor(replication_factor: int) -> None:
    if replication_factor <= 0:
        raise AdminError(INVALID_REPLICATION_FACTOR,
                         "Replication factor must be larger than 0, or -1 to use the default value.")
    if replication_factor > BROKER_COUNT:
        raise AdminError(INVALID_REPLICATION_FACTOR,
                         f"Unable to replicate the partition {replication_factor} time(s): The target replication "
                         f"factor of {replication_factor} cannot be reached because only {BROKER_COUNT} broker(s) "
                         f"are registered.")


def _collides(a: str, b: str) -> bool:
    # Kafka's metric names turn '.' into '_', so such names would share metrics.
    return a != b and a.replace(".", "_") == b.replace(".", "_")


def plan_topic(broker, wanted) -> tuple[int, int, dict[str, str]]:
    """(partitions, replication factor, configs) for one topic, or AdminError."""
    name = wanted.name
    try:
        validate_topic_name(name)
    except InvalidTopic as exc:
        raise AdminError(InvalidTopic.error_code, str(exc)) from None
    if broker.store.get(name) is not None:
        raise AdminError(TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
    for existing in broker.store.topics:
        if _collides(name, existing):
            raise AdminError(InvalidTopic.error_code, f"Topic '{name}' collides with existing topic: {existing}")
    if wanted.assignments:
        if wanted.replication_factor != -1:
            raise AdminError(INVALID_REQUEST, "A manual partition assignment was specified, but replication factor "
                                              "was not set to -1.")
        if wanted.num_partitions != -1:
            raise AdminError(INVALID_REQUEST, "A manual partition assignment was specified, but numPartitions was "
                                              "not set to -1.")
        replication_factor = None
        for index, assignment in enumerate(wanted.assignments):
            if assignment.partition_index != index:
                raise AdminError(INVALID_REPLICA_ASSIGNMENT,
                                 "partitions should be a consecutive 0-based integer sequence")
            replication_factor = validate_assignment(list(assignment.broker_ids), replication_factor)
        partitions = len(wanted.assignments)
        assert replication_factor is not None
    else:
        partitions = broker.config.num_partitions if wanted.num_partitions == -1 else wanted.num_partitions
        replication_factor = 1 if wanted.replication_factor == -1 else wanted.replication_factor
        if partitions <= 0:
            raise AdminError(INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")
        check_replication_factor(replication_factor)
    configs: dict[str, str] = {}
    for config in wanted.configs:
        if config.value is None:
            raise AdminError(INVALID_CONFIG, f"Null value not supported for topic configs: {config.name}")
        configs[config.name] = config.value
    try:
        validate_configs(configs)
    except InvalidConfig as exc:
        raise AdminError(INVALID_CONFIG, str(exc)) from None
    return partitions, replication_factor, configs


def _error(name: str, code: int, message: str | None) -> Result:
    return Result(name=name, topic_id=ZERO_UUID, error_code=code, error_message=message, topic_config_error_code=0,
                  num_partitions=-1, replication_factor=-1, configs=[])


@api(CreateTopicsRequest, CreateTopicsResponse, 0, 7)
async def handle_create_topics(broker, context, request):
    validate_only = context.version >= 1 and request.validate_only
    counts: dict[str, int] = {}
    for wanted in request.topics:
        counts[wanted.name] = counts.get(wanted.name, 0) + 1
    results = []
    for wanted in request.topics:
        name = wanted.name
        if counts[name] > 1:
            results.append(_error(name, INVALID_REQUEST, "Duplicate topic name."))
            continue
        if not (broker.allowed(context, CREATE, CLUSTER, CLUSTER_NAME) or broker.allowed(context, CREATE, TOPIC, name)):
            results.append(_error(name, TOPIC_AUTHORIZATION_FAILED, "Authorization failed."))
            continue
        try:
            partitions, replication_factor, configs = plan_topic(broker, wanted)
        except AdminError as exc:
            results.append(_error(name, exc.error_code, str(exc)))
            continue
        topic_id = ZERO_UUID
        if not validate_only:
            try:
                topic_id = broker.store.create(name, partitions, configs).topic_id
            except OSError as exc:
                log.error("creating topic %s failed: %s", name, exc)
                results.append(_error(name, UNKNOWN_SERVER_ERROR, f"creating the topic failed: {exc}"))
                continue
            log.info("created topic %s with %d partitions", name, partitions)
        results.append(Result(
            name=name,
            topic_id=topic_id,
            error_code=0,
            error_message=None,
            topic_config_error_code=0,
            num_partitions=partitions,
            replication_factor=replication_factor,
            configs=[
                ResultConfig(name=e.name, value=e.value, read_only=e.read_only, config_source=e.source,
                             is_sensitive=e.sensitive)
                for e in topic_config_entries(broker, configs)
            ],
        ))
    return CreateTopicsResponse(throttle_time_ms=0, topics=results)
