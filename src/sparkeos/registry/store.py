"""Registry state: subjects, versions, global schema ids and compatibility levels.

Every change is first appended to the log (the `_schemas` topic) and applied to memory only once
the broker acknowledged it; at start the state is rebuilt by replaying the log. Records follow
the Confluent registry's layout: key `{"keytype": "SCHEMA", "subject", "version"}` with the
schema as value, key `{"keytype": "CONFIG", "subject"}` with `{"compatibilityLevel"}` (subject
null for the global level). One registry process writes a given topic at a time; before each
write it reads anything new in the topic so ids stay global and monotonic.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from . import errors
from .avro_schema import AvroSchema, parse_avro_schema
from .compatibility import LEVELS, check_compatibility

DEFAULT_COMPATIBILITY = "BACKWARD"
LATEST = -1


class SchemaLog(Protocol):
    def open(self) -> None: ...
    def close(self) -> None: ...
    def append(self, key: dict[str, Any], value: dict[str, Any] | None) -> None: ...
    def read_new(self) -> Any: ...


@dataclass(frozen=True)
class RegisteredVersion:
    subject: str
    version: int
    schema_id: int
    schema: AvroSchema

    def to_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "version": self.version, "id": self.schema_id, "schema": self.schema.text}


class SchemaStore:
    """Thread-safe registry state backed by a `SchemaLog`."""

    def __init__(self, log: SchemaLog) -> None:
        self._log = log
        self._lock = threading.RLock()
        self._subjects: dict[str, list[RegisteredVersion]] = {}
        self._by_id: dict[int, AvroSchema] = {}
        self._id_by_identity: dict[str, int] = {}
        self._levels: dict[str | None, str] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        self._log.open()
        self._catch_up()

    def close(self) -> None:
        self._log.close()

    # -- reads -------------------------------------------------------------------------------

    def subjects(self) -> list[str]:
        with self._lock:
            return sorted(subject for subject, versions in self._subjects.items() if versions)

    def versions(self, subject: str) -> list[int]:
        return [entry.version for entry in self._versions_of(subject)]

    def version(self, subject: str, version: int) -> RegisteredVersion:
        versions = self._versions_of(subject)
        if version == LATEST:
            return versions[-1]
        for entry in versions:
            if entry.version == version:
                return entry
        raise errors.version_not_found(subject, version)

    def schema_by_id(self, schema_id: int) -> AvroSchema:
        with self._lock:
            if schema_id not in self._by_id:
                raise errors.schema_not_found(f"Schema {schema_id} not found")
            return self._by_id[schema_id]

    def usages_of_id(self, schema_id: int) -> list[tuple[str, int]]:
        self.schema_by_id(schema_id)
        with self._lock:
            return sorted(
                (entry.subject, entry.version)
                for versions in self._subjects.values()
                for entry in versions
                if entry.schema_id == schema_id
            )

    def lookup(self, subject: str, schema_text: Any) -> RegisteredVersion:
        schema = parse_avro_schema(schema_text)
        for entry in self._versions_of(subject):
            if entry.schema.identity == schema.identity:
                return entry
        raise errors.schema_not_found()

    def level(self, subject: str | None, default_to_global: bool) -> str:
        with self._lock:
            if subject is not None and subject in self._levels:
                return self._levels[subject]
            if subject is not None and not default_to_global:
                raise errors.subject_compatibility_not_configured(subject)
            return self._levels.get(None, DEFAULT_COMPATIBILITY)

    def compatibility_problems(self, subject: str, schema_text: Any, version: int | None) -> list[str]:
        """Problems of `schema_text` against `version` (None: every version the level covers)."""
        schema = parse_avro_schema(schema_text)
        with self._lock:
            existing = self._subjects.get(subject, [])
            if version is not None and not (version == LATEST and not existing):
                existing = [self.version(subject, version)]
            level = self.level(subject, default_to_global=True)
            return check_compatibility(level, schema.parsed, [entry.schema.parsed for entry in existing])

    # -- writes ------------------------------------------------------------------------------

    def register(self, subject: str, schema_text: Any) -> RegisteredVersion:
        """Add `schema_text` as the subject's next version, or return the version it already is."""
        schema = parse_avro_schema(schema_text)
        with self._lock:
            self._catch_up()
            versions = self._subjects.get(subject, [])
            for entry in versions:
                if entry.schema.identity == schema.identity:
                    return entry
            level = self.level(subject, default_to_global=True)
            problems = check_compatibility(level, schema.parsed, [entry.schema.parsed for entry in versions])
            if problems:
                raise errors.incompatible_schema(subject, problems)
            schema_id = self._id_by_identity.get(schema.identity) or max(self._by_id, default=0) + 1
            version = versions[-1].version + 1 if versions else 1
            key = {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1}
            value = {"subject": subject, "version": version, "id": schema_id, "schema": schema.text, "deleted": False}
            self._log.append(key, value)
            self._apply(key, value)
            return self.version(subject, version)

    def set_level(self, subject: str | None, level: Any) -> str:
        if not isinstance(level, str) or level.upper() not in LEVELS:
            raise errors.invalid_compatibility_level(level)
        level = level.upper()
        key = {"keytype": "CONFIG", "subject": subject, "magic": 0}
        with self._lock:
            self._catch_up()
            self._log.append(key, {"compatibilityLevel": level})
            self._apply(key, {"compatibilityLevel": level})
        return level

    def delete_level(self, subject: str | None) -> str:
        """Drop a subject's own level (it falls back to the global one); the global one goes back to BACKWARD."""
        with self._lock:
            previous = self.level(subject, default_to_global=subject is None)
            key = {"keytype": "CONFIG", "subject": subject, "magic": 0}
            self._catch_up()
            self._log.append(key, None)
            self._apply(key, None)
            return previous

    # -- replay ------------------------------------------------------------------------------

    def _catch_up(self) -> None:
        with self._lock:
            for _offset, (key, value) in self._log.read_new():
                self._apply(key, value)

    def _apply(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        keytype = key.get("keytype")
        if keytype == "CONFIG":
            subject = key.get("subject")
            if value is None:
                self._levels.pop(subject, None)
            else:
                self._levels[subject] = value["compatibilityLevel"]
        elif keytype == "SCHEMA" and value is not None and not value.get("deleted"):
            self._apply_schema(value)

    def _apply_schema(self, value: dict[str, Any]) -> None:
        schema = parse_avro_schema(value["schema"])
        entry = RegisteredVersion(value["subject"], int(value["version"]), int(value["id"]), schema)
        versions = self._subjects.setdefault(entry.subject, [])
        if any(existing.version == entry.version for existing in versions):
            return  # a replayed duplicate (the producer retried); the first one counts
        versions.append(entry)
        versions.sort(key=lambda item: item.version)
        self._by_id[entry.schema_id] = schema
        self._id_by_identity.setdefault(schema.identity, entry.schema_id)

    def _versions_of(self, subject: str) -> list[RegisteredVersion]:
        with self._lock:
            versions = self._subjects.get(subject)
            if not versions:
                raise errors.subject_not_found(subject)
            return list(versions)
