"""Parsing and identifying Avro schemas given to the registry as JSON text."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import fastavro

from .errors import invalid_schema


@dataclass(frozen=True)
class AvroSchema:
    """A validated schema: `text` is what the registry stores and returns, `parsed` feeds the checks."""

    text: str
    parsed: Any

    @property
    def identity(self) -> str:
        # Key order inside a JSON object carries no meaning in Avro, so two texts that differ only
        # by it (or by whitespace) are the same schema and get the same id; defaults and docs count.
        return json.dumps(json.loads(self.text), sort_keys=True, separators=(",", ":"))


def parse_avro_schema(text: Any) -> AvroSchema:
    """Validate `text` with fastavro; raises the registry's 42201 error naming what is wrong."""
    if not isinstance(text, str):
        raise invalid_schema("'schema' must be a string holding the schema's JSON")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        # Confluent also accepts a bare primitive name such as `string` (not valid JSON).
        if text.strip() in ("null", "boolean", "int", "long", "float", "double", "bytes", "string"):
            document = text.strip()
        else:
            raise invalid_schema(f"not JSON: {exc}") from None
    try:
        parsed = fastavro.parse_schema(document, _write_hint=False)
    except Exception as exc:  # fastavro raises several unrelated exception types for bad schemas
        raise invalid_schema(f"{type(exc).__name__}: {exc}") from None
    return AvroSchema(text=json.dumps(document, separators=(",", ":")), parsed=parsed)
