"""The broker's error table matches Kafka's, and stays the only one in the broker."""

from __future__ import annotations

import ast
from pathlib import Path

import kafka.errors

import sparkeos.broker
from sparkeos.broker import errors

# kafka-python spells these few names differently from Kafka's Errors enum; the codes are the same.
KAFKA_PYTHON_NAMES = {
    "UNKNOWN_SERVER_ERROR": "UNKNOWN",
    "NONE": "NO_ERROR",
    "MESSAGE_TOO_LARGE": "MESSAGE_SIZE_TOO_LARGE",
    "INVALID_TOPIC_EXCEPTION": "INVALID_TOPIC",
    "INVALID_REPLICA_ASSIGNMENT": "INVALID_REPLICATION_ASSIGNMENT",
}


def error_table() -> dict[str, int]:
    return {name: value for name, value in vars(errors).items() if name.isupper() and isinstance(value, int)}


def test_every_code_is_kafkas_code_for_its_name() -> None:
    table = error_table()
    assert len(table) > 40
    wrong = {}
    for name, code in table.items():
        known = kafka.errors.kafka_errors.get(code)
        expected_name = KAFKA_PYTHON_NAMES.get(name, name)
        if known is None or known.message != expected_name:
            wrong[name] = (code, known.message if known else None)
    assert not wrong, f"(our code, kafka-python's name for that code): {wrong}"


def test_codes_are_distinct() -> None:
    table = error_table()
    assert len(set(table.values())) == len(table)


def test_no_broker_module_defines_an_error_code_of_its_own() -> None:
    """A module that needs a code imports it from sparkeos.broker.errors instead of copying it."""
    names = set(error_table())
    package = Path(sparkeos.broker.__file__).parent
    copies = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "errors.py":
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            copies += [f"{path.relative_to(package)}: {t.id}" for t in targets
                       if isinstance(t, ast.Name) and t.id in names]
    assert not copies
