"""Registry errors in the Confluent Schema Registry's JSON form: HTTP status plus `error_code`."""

from __future__ import annotations


class RegistryError(Exception):
    """Rendered by the HTTP layer as `{"error_code": code, "message": message}` with `status`."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, object]:
        return {"error_code": self.code, "message": self.message}


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: object) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found for subject '{subject}'.")


def schema_not_found(detail: str = "Schema not found") -> RegistryError:
    return RegistryError(404, 40403, detail)


def subject_compatibility_not_configured(subject: str) -> RegistryError:
    return RegistryError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")


def incompatible_schema(subject: str, problems: list[str]) -> RegistryError:
    details = "; ".join(problems)
    return RegistryError(
        409,
        409,
        f"Schema being registered is incompatible with an earlier schema for subject '{subject}', details: [{details}]",
    )


def invalid_schema(detail: str) -> RegistryError:
    return RegistryError(422, 42201, f"Invalid schema: {detail}")


def invalid_version(version: object) -> RegistryError:
    return RegistryError(
        422,
        42202,
        f"The specified version '{version}' is not a valid version id. Allowed values "
        'are between [1, 2^31-1] and the string "latest"',
    )


def invalid_compatibility_level(level: object) -> RegistryError:
    return RegistryError(
        422,
        42203,
        f"Invalid compatibility level. Valid values are none, backward, forward, full, "
        f"backward_transitive, forward_transitive, and full_transitive; got {level!r}",
    )


def store_error(detail: str) -> RegistryError:
    return RegistryError(500, 50001, f"Error in the backend data store: {detail}")


def not_found(path: str) -> RegistryError:
    return RegistryError(404, 404, f"HTTP 404 Not Found: {path}")
