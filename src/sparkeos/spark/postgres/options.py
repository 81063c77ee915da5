"""Options of the `sparkeos.postgres` sink, named after Spark's JDBC data source options where one exists."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..options import CaseInsensitiveOptions, OptionError

OPTIONS = ("url", "dbtable", "deliveryGuarantee", "upsertKeys", "createTable", "batchSize", "writeId", "lockTimeout")
# PostgreSQL's lock_timeout for a task's statements, unless the session has one of its own: a task can wait on a row
# lock of a prepared transaction that only the driver resolves, after the task's own batch, so waiting for ever
# would wedge the query.
DEFAULT_LOCK_TIMEOUT = "60s"
GUARANTEES = ("exactly_once", "at_least_once")
DEFAULT_BATCH_SIZE = 1000


class PostgresSinkOptionError(OptionError):
    """A bad option of the sparkeos.postgres sink; the message names it."""


@dataclass(frozen=True)
class TableName:
    """A table as PostgreSQL resolves it: ``schema`` None means the first schema of the search path."""

    schema: str | None
    name: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


@dataclass(frozen=True)
class PostgresSinkOptions:
    url: str
    table: TableName
    exactly_once: bool
    upsert_keys: tuple[str, ...]
    create_table: bool
    batch_size: int
    lock_timeout_ms: int | None = None  # None: the session's own lock_timeout, or DEFAULT_LOCK_TIMEOUT if it has none


def parse_postgres_sink_options(raw: Mapping[str, str]) -> PostgresSinkOptions:
    """Every unknown option is an error naming it; ``path`` is refused too (Spark's JDBC sink has none)."""
    try:
        options = CaseInsensitiveOptions(raw, OPTIONS, "sparkeos.postgres sink")
        if options.get("path"):
            raise PostgresSinkOptionError("the sparkeos.postgres sink takes no path: name the table with option "
                                          "'dbtable' and call save() or start() without one")
        url = options.require("url")
        if url.startswith("jdbc:postgresql:"):
            url = url[len("jdbc:"):]  # Spark's JDBC URL, as users copy it, is a libpq URI once without the prefix
        table = parse_table_name(options.require("dbtable"))
        guarantee = (options.get("deliveryGuarantee") or "exactly_once").strip().lower()
        if guarantee not in GUARANTEES:
            raise PostgresSinkOptionError(f"option 'deliveryGuarantee' must be one of {', '.join(GUARANTEES)}, "
                                          f"not {options.get('deliveryGuarantee')!r}")
        keys = _keys(options.get("upsertKeys"))
        create = options.boolean("createTable", False)
        batch_size = options.integer("batchSize", DEFAULT_BATCH_SIZE, minimum=1)
        lock_timeout_ms = options.duration_ms("lockTimeout", DEFAULT_LOCK_TIMEOUT) if options.has("lockTimeout") \
            else None
    except PostgresSinkOptionError:
        raise
    except OptionError as error:
        raise PostgresSinkOptionError(str(error)) from None
    return PostgresSinkOptions(url, table, guarantee == "exactly_once", keys, create, batch_size or DEFAULT_BATCH_SIZE,
                               lock_timeout_ms)


def _keys(text: str | None) -> tuple[str, ...]:
    if text is None or not text.strip():
        return ()
    keys = tuple(key.strip() for key in text.split(","))
    if any(not key for key in keys):
        raise PostgresSinkOptionError(f"option 'upsertKeys' has an empty column name: {text!r}")
    if len(set(keys)) != len(keys):
        raise PostgresSinkOptionError(f"option 'upsertKeys' names a column twice: {text!r}")
    return keys


_PART = re.compile(r'\s*(?:"((?:[^"]|"")+)"|([^".\s]+))\s*')


def parse_table_name(text: str) -> TableName:
    """``table``, ``schema.table``, with double-quoted parts kept as written and unquoted ones lower-cased, as
    PostgreSQL reads an identifier."""
    parts: list[str] = []
    position = 0
    while True:
        match = _PART.match(text, position)
        if not match:
            break
        parts.append(match.group(1).replace('""', '"') if match.group(1) is not None else match.group(2).lower())
        position = match.end()
        if position < len(text) and text[position] == ".":
            position += 1
            continue
        break
    if position != len(text) or not 1 <= len(parts) <= 2:
        raise PostgresSinkOptionError(f"option 'dbtable' must be a table or schema.table, not {text!r}")
    return TableName(parts[0], parts[1]) if len(parts) == 2 else TableName(None, parts[0])
