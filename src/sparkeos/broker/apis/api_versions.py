"""ApiVersions (18): the broker's exact API ranges, and the UNSUPPORTED_VERSION fallback."""

from __future__ import annotations

import struct

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from .registry import APIS, api

UNSUPPORTED_VERSION = 35


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
async def handle(broker, context, request):
    return ApiVersionsResponse(error_code=0, api_keys=_api_keys(), throttle_time_ms=0)
