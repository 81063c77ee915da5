"""ApiVersions (18): the broker's exact API ranges, and the UNSUPPORTED_VERSION fallback.

Leaves out:
- `client_software_name` and `client_software_version`, which Kafka keeps for its metrics;
- feature flags: no `supported_features` or `finalized_features` are sent.
"""

from __future__ import annotations

import struct

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from ..dispatch import APIS, api
from ..errors import UNSUPPORTED_VERSION


def _api_keys() -> list:
    return [
        ApiVersionsResponse.ApiVersion(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(APIS.values(), key=lambda a: a.key)
    ]


def unsupported_version_response(correlation_id: int) -> bytes:
    """A v0 body listing our ranges, so the client can retry with a version we speak."""
    body = ApiVersionsResponse(error_code=UNSUPPORTED_VERSION, api_keys=_api_keys()).encode(version=0)
    head = struct.pack(">i", correlation_id)
    return struct.pack(">i", len(head) + len(body)) + head + bytes(body)


@api(ApiVersionsRequest, ApiVersionsResponse, 0, 3)
async def handle_api_versions(broker, context, request):
    return ApiVersionsResponse(error_code=0, api_keys=_api_keys(), throttle_time_ms=0)
