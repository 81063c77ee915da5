"""Avro schema compatibility by the Avro specification's schema resolution rules.

`reader_problems(reader, writer)` answers "can data written with `writer` be read with `reader`?" and
lists why not. The registry's compatibility levels are built from it: BACKWARD means the new schema
reads data written with the latest one, FORWARD the reverse, FULL both; the *_TRANSITIVE variants
check against every earlier version instead of only the latest. Logical types are ignored, as
Avro's own SchemaCompatibility does: they do not change the encoding.

Schemas are given as parsed by `fastavro.parse_schema` (named types by full name, references to them
as plain strings, everything reachable through `__named_schemas`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})

# Writer type -> reader types it may be promoted to (Avro spec, "Schema Resolution").
PROMOTIONS: dict[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}

LEVELS = frozenset(
    {
        "NONE",
        "BACKWARD",
        "BACKWARD_TRANSITIVE",
        "FORWARD",
        "FORWARD_TRANSITIVE",
        "FULL",
        "FULL_TRANSITIVE",
    }
)


def check_compatibility(level: str, new: dict | list | str, existing: list[dict | list | str]) -> list[str]:
    """Problems that stop `new` from being added after `existing` (oldest first) under `level`; [] if none."""
    if level == "NONE" or not existing:
        return []
    against = existing if level.endswith("_TRANSITIVE") else existing[-1:]
    problems: list[str] = []
    for old in reversed(against):
        if level.startswith(("BACKWARD", "FULL")):
            problems += [
                f"new schema cannot read data written with an earlier one: {p}" for p in reader_problems(new, old)
            ]
        if level.startswith(("FORWARD", "FULL")):
            problems += [
                f"an earlier schema cannot read data written with the new one: {p}" for p in reader_problems(old, new)
            ]
    return problems


def reader_problems(reader: dict | list | str, writer: dict | list | str) -> list[str]:
    """Why data written with `writer` cannot be resolved against `reader` (empty when it can)."""
    resolver = _Resolver(_named_types(reader), _named_types(writer))
    resolver.check(reader, writer, "")
    return resolver.problems


def _named_types(schema: Any) -> dict[str, dict]:
    if isinstance(schema, dict) and "__named_schemas" in schema:
        return dict(schema["__named_schemas"])
    found: dict[str, dict] = {}
    _collect_named(schema, found)
    return found


def _collect_named(schema: Any, found: dict[str, dict]) -> None:
    if isinstance(schema, list):
        for branch in schema:
            _collect_named(branch, found)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in NAMED:
            found[schema["name"]] = schema
        for field in schema.get("fields", []):
            _collect_named(field["type"], found)
        for key in ("items", "values"):
            if key in schema:
                _collect_named(schema[key], found)
        if isinstance(kind, dict | list):
            _collect_named(kind, found)


@dataclass
class _Resolver:
    reader_names: dict[str, dict]
    writer_names: dict[str, dict]

    def __post_init__(self) -> None:
        self.problems: list[str] = []
        # Recursive types: a pair already under comparison is assumed compatible, which the
        # rest of the comparison then confirms or refutes.
        self._in_progress: set[tuple[int, int]] = set()

    def check(self, reader: Any, writer: Any, path: str) -> None:
        reader = self._deref(reader, self.reader_names)
        writer = self._deref(writer, self.writer_names)
        if isinstance(writer, list):
            # Every branch the writer may have chosen must be readable.
            for branch in writer:
                self.check(reader, branch, path)
            return
        if isinstance(reader, list):
            if not any(self._readable(branch, writer) for branch in reader):
                self.problems.append(
                    f"{_where(path)}reader union {_describe(reader)} has no branch for writer type {_describe(writer)}"
                )
            return
        self._check_single(reader, writer, path)

    def _readable(self, reader: Any, writer: Any) -> bool:
        nested = _Resolver(self.reader_names, self.writer_names)
        nested._in_progress = set(self._in_progress)
        nested.check(reader, writer, "")
        return not nested.problems

    def _check_single(self, reader: Any, writer: Any, path: str) -> None:
        reader_kind, writer_kind = _kind(reader), _kind(writer)
        if reader_kind != writer_kind:
            if reader_kind not in PROMOTIONS.get(writer_kind, ()):
                self.problems.append(f"{_where(path)}reader type {reader_kind} cannot read writer type {writer_kind}")
            return
        if reader_kind in PRIMITIVES:
            return
        if reader_kind == "array":
            self.check(reader["items"], writer["items"], f"{path}[]")
        elif reader_kind == "map":
            self.check(reader["values"], writer["values"], f"{path}{{}}")
        elif not self._names_match(reader, writer, path):
            return
        elif reader_kind == "fixed":
            if reader["size"] != writer["size"]:
                self.problems.append(
                    f"{_where(path)}fixed {reader['name']} has size {reader['size']}, "
                    f"writer's has size {writer['size']}"
                )
        elif reader_kind == "enum":
            self._check_enum(reader, writer, path)
        else:
            self._check_record(reader, writer, path)

    def _names_match(self, reader: dict, writer: dict, path: str) -> bool:
        accepted = {_unqualified(reader["name"])} | {_unqualified(a) for a in reader.get("aliases", [])}
        if _unqualified(writer["name"]) in accepted:
            return True
        self.problems.append(
            f"{_where(path)}reader {reader['type']} {reader['name']} does not match "
            f"writer {writer['type']} {writer['name']}"
        )
        return False

    def _check_enum(self, reader: dict, writer: dict, path: str) -> None:
        if "default" in reader:
            return  # unknown writer symbols resolve to the reader's default
        missing = [symbol for symbol in writer["symbols"] if symbol not in reader["symbols"]]
        if missing:
            self.problems.append(f"{_where(path)}enum {reader['name']} lacks writer symbols {missing}")

    def _check_record(self, reader: dict, writer: dict, path: str) -> None:
        pair = (id(reader), id(writer))
        if pair in self._in_progress:
            return
        self._in_progress.add(pair)
        writer_fields = {field["name"]: field for field in writer["fields"]}
        for field in reader["fields"]:
            field_path = f"{path}.{field['name']}" if path else field["name"]
            match = next(
                (writer_fields[name] for name in [field["name"], *field.get("aliases", [])] if name in writer_fields),
                None,
            )
            if match is not None:
                self.check(field["type"], match["type"], field_path)
            elif "default" not in field:
                self.problems.append(
                    f"field {field_path!r} is missing from the writer's {writer['name']} and has no default"
                )
        # Fields only the writer has are skipped by the reader: always fine.

    @staticmethod
    def _deref(schema: Any, names: dict[str, dict]) -> Any:
        if isinstance(schema, str) and schema not in PRIMITIVES:
            if schema not in names:
                raise ValueError(f"unknown named type {schema!r}")
            return names[schema]
        if isinstance(schema, dict) and isinstance(schema.get("type"), str) and schema["type"] in PRIMITIVES:
            return schema["type"]  # {"type": "long", "logicalType": ...} encodes as a plain long
        if isinstance(schema, dict) and isinstance(schema.get("type"), dict | list):
            return _Resolver._deref(schema["type"], names)
        return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    kind = schema["type"]
    return "record" if kind == "error" else kind


def _unqualified(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _describe(schema: Any) -> str:
    if isinstance(schema, list):
        return "[" + ", ".join(_describe(branch) for branch in schema) + "]"
    if isinstance(schema, dict):
        return schema.get("name", schema["type"])
    return str(schema)


def _where(path: str) -> str:
    return f"at {path!r}: " if path else ""
