"""AlterConfigs (33): replace a topic's whole set of configs (what is left out returns to default).

The broker's own configs are fixed at startup, so changing them is refused.
"""

from __future__ import annotations

import logging

from kafka.protocol.admin import AlterConfigsRequest, AlterConfigsResponse

from ..storage.topics import InvalidConfig, validate_configs
from .describe_configs import BROKER_RESOURCE, INVALID_REQUEST, TOPIC_RESOURCE, ConfigError, resource_config_entries
from .registry import api

log = logging.getLogger("sparkeos.broker.admin")

INVALID_CONFIG = 40

Response = AlterConfigsResponse.AlterConfigsResourceResponse


def check_alterable(broker, resource) -> None:
    """ConfigError unless `resource` exists and may be altered."""
    resource_config_entries(broker, resource.resource_type, resource.resource_name)
    if resource.resource_type == BROKER_RESOURCE and resource.configs:
        names = ", ".join(sorted(c.name for c in resource.configs))
        raise ConfigError(INVALID_REQUEST, f"Cannot update these configs dynamically: {names}")


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
        raise ConfigError(INVALID_CONFIG, str(exc)) from None
    if not validate_only:
        broker.store.alter_configs(name, configs)
        log.info("topic %s configs are now %s", name, configs)


def _alter(broker, resource, validate_only: bool) -> None:
    check_alterable(broker, resource)
    if resource.resource_type != TOPIC_RESOURCE:
        return
    configs: dict[str, str] = {}
    for config in resource.configs:
        if config.value is None:
            raise ConfigError(INVALID_REQUEST, f"Null value not supported for : {config.name}")
        if config.name in configs:
            raise ConfigError(INVALID_REQUEST, f"Error due to duplicate config keys: {config.name}")
        configs[config.name] = config.value
    apply_topic_configs(broker, resource.resource_name, configs, validate_only)


@api(AlterConfigsRequest, AlterConfigsResponse, 0, 2)
async def handle(broker, context, request):
    duplicates = duplicate_resources(request.resources)
    responses = []
    for resource in request.resources:
        error, message = 0, None
        try:
            if (resource.resource_type, resource.resource_name) in duplicates:
                raise ConfigError(INVALID_REQUEST, "Each resource must appear at most once.")
            _alter(broker, resource, request.validate_only)
        except ConfigError as exc:
            error, message = exc.error_code, str(exc)
        responses.append(Response(error_code=error, error_message=message, resource_type=resource.resource_type,
                                  resource_name=resource.resource_name))
    return AlterConfigsResponse(throttle_time_ms=0, responses=responses)
