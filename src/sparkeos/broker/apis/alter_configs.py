"""AlterConfigs (33): replace a topic's whole set of configs (what is left out returns to default).

Leaves out:
- changing broker configs: they are fixed at startup, so any is refused with INVALID_REQUEST;
- topic configs other than the ten the broker knows (docs/broker.md), refused with INVALID_CONFIG.
"""

from __future__ import annotations

from kafka.protocol.admin import AlterConfigsRequest, AlterConfigsResponse

from ..acls import ALTER_CONFIGS
from ..admin import (
    TOPIC_RESOURCE,
    AdminError,
    apply_topic_configs,
    check_alterable,
    check_config_access,
    duplicate_resources,
)
from ..dispatch import api
from ..errors import INVALID_REQUEST

Response = AlterConfigsResponse.AlterConfigsResourceResponse


def _alter(broker, resource, validate_only: bool) -> None:
    check_alterable(broker, resource)
    if resource.resource_type != TOPIC_RESOURCE:
        return
    configs: dict[str, str] = {}
    for config in resource.configs:
        if config.value is None:
            raise AdminError(INVALID_REQUEST, f"Null value not supported for : {config.name}")
        if config.name in configs:
            raise AdminError(INVALID_REQUEST, f"Error due to duplicate config keys: {config.name}")
        configs[config.name] = config.value
    apply_topic_configs(broker, resource.resource_name, configs, validate_only)


@api(AlterConfigsRequest, AlterConfigsResponse, 0, 2)
async def handle_alter_configs(broker, context, request):
    duplicates = duplicate_resources(request.resources)
    responses = []
    for resource in request.resources:
        error, message = 0, None
        try:
            if (resource.resource_type, resource.resource_name) in duplicates:
                raise AdminError(INVALID_REQUEST, "Each resource must appear at most once.")
            check_config_access(broker, context, ALTER_CONFIGS, resource.resource_type, resource.resource_name)
            _alter(broker, resource, request.validate_only)
        except AdminError as exc:
            error, message = exc.error_code, str(exc)
        responses.append(Response(error_code=error, error_message=message, resource_type=resource.resource_type,
                                  resource_name=resource.resource_name))
    return AlterConfigsResponse(throttle_time_ms=0, responses=responses)
