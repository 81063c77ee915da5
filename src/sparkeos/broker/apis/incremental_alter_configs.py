"""IncrementalAlterConfigs (44): set, delete, append to or subtract from single topic configs.

Leaves out:
- changing broker configs: they are fixed at startup, so any is refused with INVALID_REQUEST;
- topic configs other than the ten the broker knows (docs/broker.md), refused with INVALID_CONFIG.
"""

from __future__ import annotations

from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse

from ..acls import ALTER_CONFIGS
from ..admin import (
    LIST,
    TOPIC_CONFIG_TYPES,
    TOPIC_RESOURCE,
    AdminError,
    apply_topic_configs,
    check_alterable,
    check_config_access,
    duplicate_resources,
)
from ..dispatch import api
from ..errors import INVALID_CONFIG, INVALID_REQUEST
from ..storage.topics import TOPIC_CONFIG_DEFAULTS

SET = 0
DELETE = 1
APPEND = 2
SUBTRACT = 3

Response = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse


def _list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def changed_configs(current: dict[str, str], changes) -> dict[str, str]:
    """The topic's configs after `changes`, or AdminError."""
    configs = dict(current)
    seen: set[str] = set()
    for change in changes:
        name, operation, value = change.name, change.config_operation, change.value
        if name in seen:
            raise AdminError(INVALID_REQUEST, f"Error due to duplicate config keys: {name}")
        seen.add(name)
        if name not in TOPIC_CONFIG_DEFAULTS:
            raise AdminError(INVALID_CONFIG, f"Unknown topic config name: {name}")
        if operation not in (SET, DELETE, APPEND, SUBTRACT):
            raise AdminError(INVALID_REQUEST, f"Unknown config operation {operation} for {name}")
        if operation != DELETE and value is None:
            raise AdminError(INVALID_REQUEST, f"Null value not supported for : {name}")
        if operation == SET:
            configs[name] = value
        elif operation == DELETE:
            configs.pop(name, None)
        else:
            if TOPIC_CONFIG_TYPES[name] != LIST:
                verb = "append" if operation == APPEND else "subtract"
                raise AdminError(INVALID_CONFIG, f"Config value {verb} is not allowed for config key: {name}")
            items = _list(configs.get(name, TOPIC_CONFIG_DEFAULTS[name]))
            if operation == APPEND:
                items += [item for item in _list(value) if item not in items]
            else:
                removed = set(_list(value))
                items = [item for item in items if item not in removed]
            configs[name] = ",".join(items)
    return configs


@api(IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, 0, 1)
async def handle_incremental_alter_configs(broker, context, request):
    duplicates = duplicate_resources(request.resources)
    responses = []
    for resource in request.resources:
        error, message = 0, None
        try:
            if (resource.resource_type, resource.resource_name) in duplicates:
                raise AdminError(INVALID_REQUEST, "Each resource must appear at most once.")
            check_config_access(broker, context, ALTER_CONFIGS, resource.resource_type, resource.resource_name)
            check_alterable(broker, resource)
            if resource.resource_type == TOPIC_RESOURCE:
                topic = broker.store.get(resource.resource_name)
                configs = changed_configs(topic.configs, resource.configs)
                apply_topic_configs(broker, resource.resource_name, configs, request.validate_only)
        except AdminError as exc:
            error, message = exc.error_code, str(exc)
        responses.append(Response(error_code=error, error_message=message, resource_type=resource.resource_type,
                                  resource_name=resource.resource_name))
    return IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=responses)
