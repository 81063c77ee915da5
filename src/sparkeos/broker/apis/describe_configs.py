"""DescribeConfigs (32): every topic config with its source, and the broker configs clients read.

Leaves out:
- resource types other than topics (2) and brokers (4), such as broker loggers: refused with INVALID_REQUEST;
- broker configs beyond those clients and admin tools read (`broker_config_entries` lists them);
- documentation (`include_documentation`, v3+): it is always null.
"""

from __future__ import annotations

from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse

from ..acls import DESCRIBE_CONFIGS
from ..admin import DEFAULT_CONFIG, AdminError, ConfigEntry, check_config_access, resource_config_entries
from ..dispatch import api

Result = DescribeConfigsResponse.DescribeConfigsResult
ResourceResult = Result.DescribeConfigsResourceResult
Synonym = ResourceResult.DescribeConfigsSynonym


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
async def handle_describe_configs(broker, context, request):
    include_synonyms = context.version >= 1 and request.include_synonyms
    results = []
    for resource in request.resources:
        try:
            check_config_access(broker, context, DESCRIBE_CONFIGS, resource.resource_type, resource.resource_name)
            entries = resource_config_entries(broker, resource.resource_type, resource.resource_name)
        except AdminError as exc:
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
