"""Spark values as JSON text, for sinks that write JSON (JSON-lines files, jsonb columns).

Python's json module cannot write a decimal as a number with all its digits, nor knows bytes, dates or the
(key, value) pairs pyarrow gives for a map, so values are written here one by one.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
from collections.abc import Callable
from typing import Any


def iso_datetime(value: datetime.date) -> str:
    return value.isoformat()


def json_text(value: Any, datetime_text: Callable[[datetime.date], str] = iso_datetime) -> str:
    """`value` as JSON: maps (pairs from pyarrow) and structs as objects, binary in base64, dates and timestamps
    as `datetime_text` writes them (ISO 8601 by default), decimals as numbers with all their digits, and NaN and
    infinities (which JSON lacks) as strings."""
    if value is None:
        return "null"
    if isinstance(value, bool | int | str):
        return json.dumps(value)
    if isinstance(value, float):
        return json.dumps(value) if math.isfinite(value) else json.dumps(str(value))
    if isinstance(value, decimal.Decimal):
        return str(value) if value.is_finite() else json.dumps(str(value))
    if isinstance(value, bytes):
        return json.dumps(base64.b64encode(value).decode())
    if isinstance(value, datetime.datetime | datetime.date):
        return json.dumps(datetime_text(value))
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{json_text(v, datetime_text)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and value and all(isinstance(item, tuple) and len(item) == 2 for item in value):
        return "{" + ",".join(f"{json.dumps(str(k))}:{json_text(v, datetime_text)}" for k, v in value) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(json_text(v, datetime_text) for v in value) + "]"
    return json.dumps(str(value))
