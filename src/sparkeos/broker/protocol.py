"""Kafka wire framing and request headers; most message bodies use kafka-python's schema codecs (Produce
requests and Fetch responses have dedicated ones: `produce_decoding.py` and `fetch_encoding.py`)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

_HEADER_PREFIX = struct.Struct(">hhi")


class MalformedRequest(Exception):
    """The frame cannot be understood; Kafka closes the connection on these."""


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int


def read_unsigned_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    value = 0
    while True:
        if pos >= len(buf):
            raise MalformedRequest("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise MalformedRequest("varint too long")


def parse_request_header(frame: bytes | memoryview, flexible_for) -> RequestHeader:
    """Parse header v1 (or v2 when `flexible_for(api_key, version)` says the body is flexible)."""
    if len(frame) < 10:
        raise MalformedRequest("request shorter than its header")
    api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(frame, 0)
    (client_id_length,) = struct.unpack_from(">h", frame, 8)
    pos = 10
    client_id = None
    if client_id_length >= 0:
        if pos + client_id_length > len(frame):
            raise MalformedRequest("client id runs past the frame")
        client_id = bytes(frame[pos : pos + client_id_length]).decode("utf-8", "replace")
        pos += client_id_length
    elif client_id_length != -1:
        raise MalformedRequest("negative client id length")
    if flexible_for(api_key, api_version):
        count, pos = read_unsigned_varint(frame, pos)
        for _ in range(count):
            _, pos = read_unsigned_varint(frame, pos)
            size, pos = read_unsigned_varint(frame, pos)
            pos += size
        if pos > len(frame):
            raise MalformedRequest("tagged fields run past the frame")
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


_NULLABLE_KINDS = ("string", "bytes")


def unexpected_null(message, fields, version: int) -> str | None:
    """The path of a null in a field that is not nullable at `version`, if any.

    kafka-python's decoder reads length -1 as None for every string, bytes and array field;
    Kafka refuses the request instead ("non-nullable field ... was serialized as null"), and
    handlers rely on that. `fields` is a schema struct's name -> field mapping.
    """
    for field in fields.values():
        if not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        value = getattr(message, field.name, None)
        if value is None:
            if (field.is_array() or field.type_str in _NULLABLE_KINDS) and not field.nullable_for_version_q(version):
                return field.name
            continue
        if field.is_struct_array():
            for item in value:
                found = unexpected_null(item, field.fields, version)
                if found is not None:
                    return f"{field.name}.{found}"
        elif field.is_struct():
            found = unexpected_null(value, field.fields, version)
            if found is not None:
                return f"{field.name}.{found}"
    return None


def response_header(correlation_id: int, flexible: bool) -> bytes:
    if flexible:
        return struct.pack(">ib", correlation_id, 0)
    return struct.pack(">i", correlation_id)


def decode_generic(request_type, body: memoryview, version: int, api_key: int):
    """A request body decoded by kafka-python's schema codec, refused as Kafka would refuse it."""
    try:
        request = request_type.decode(body, version=version)
    except Exception as exc:
        raise MalformedRequest(f"cannot decode API {api_key} v{version}: {exc}") from None
    null_field = unexpected_null(request, request_type._struct.fields, version)
    if null_field is not None:
        raise MalformedRequest(f"API {api_key} v{version}: non-nullable {null_field} is null")
    return request
