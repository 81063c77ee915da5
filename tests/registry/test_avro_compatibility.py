"""The registry's Avro compatibility rules (Avro schema resolution), checked on parsed schemas."""

from __future__ import annotations

import fastavro
import pytest

from sparkeos.registry.compatibility import check_compatibility, reader_problems


def record(*fields: dict, name: str = "Person") -> dict:
    return fastavro.parse_schema({"type": "record", "name": name, "namespace": "demo", "fields": list(fields)})


def field(name: str, type_: object, **extra: object) -> dict:
    return {"name": name, "type": type_, **extra}


def can_read(reader: dict, writer: dict) -> bool:
    return not reader_problems(reader, writer)


def test_added_field_needs_a_default() -> None:
    old = record(field("id", "int"))
    without_default = record(field("id", "int"), field("name", "string"))
    with_default = record(field("id", "int"), field("name", ["null", "string"], default=None))
    problems = reader_problems(without_default, old)
    assert problems == ["field 'name' is missing from the writer's demo.Person and has no default"]
    assert can_read(with_default, old)


def test_removed_field_is_fine_for_the_reader() -> None:
    assert can_read(record(field("id", "int")), record(field("id", "int"), field("name", "string")))


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    ],
)
def test_promotions(writer: str, reader: str) -> None:
    assert can_read(record(field("x", reader)), record(field("x", writer)))


@pytest.mark.parametrize(
    ("writer", "reader"),
    [("long", "int"), ("double", "float"), ("float", "long"), ("string", "int"), ("boolean", "int"), ("int", "string")],
)
def test_narrowing_or_unrelated_types_are_rejected(writer: str, reader: str) -> None:
    problems = reader_problems(record(field("x", reader)), record(field("x", writer)))
    assert problems == [f"at 'x': reader type {reader} cannot read writer type {writer}"]


def test_unions() -> None:
    nullable = record(field("x", ["null", "string"]))
    plain = record(field("x", "string"))
    assert can_read(nullable, plain)  # the reader's union has a branch for what was written
    assert not can_read(plain, nullable)  # a written null has nowhere to go
    assert can_read(record(field("x", ["null", "long"])), record(field("x", ["null", "int"])))  # branch promotion
    assert not can_read(record(field("x", ["null", "int"])), record(field("x", ["null", "int", "string"])))


def test_enum_symbols() -> None:
    def suit(*symbols: str, **extra: object) -> dict:
        return record(field("s", {"type": "enum", "name": "Suit", "symbols": list(symbols), **extra}))

    assert can_read(suit("A", "B", "C"), suit("A", "B"))  # a symbol added
    assert reader_problems(suit("A"), suit("A", "B")) == ["at 's': enum demo.Suit lacks writer symbols ['B']"]
    assert can_read(suit("A", "Z", default="Z"), suit("A", "B"))  # unknown symbols map to the reader's default


def test_named_types_must_match_by_name_or_alias() -> None:
    assert not can_read(record(field("id", "int"), name="Other"), record(field("id", "int")))
    assert can_read(
        fastavro.parse_schema(
            {"type": "record", "name": "New", "aliases": ["Person"], "fields": [{"name": "id", "type": "int"}]}
        ),
        record(field("id", "int")),
    )
    fixed4 = record(field("f", {"type": "fixed", "name": "F", "size": 4}))
    fixed8 = record(field("f", {"type": "fixed", "name": "F", "size": 8}))
    assert not can_read(fixed8, fixed4)


def test_field_alias_matches_the_writers_old_name() -> None:
    assert can_read(record(field("full_name", "string", aliases=["name"])), record(field("name", "string")))


def test_arrays_maps_and_nested_records() -> None:
    assert can_read(
        record(field("xs", {"type": "array", "items": "long"})), record(field("xs", {"type": "array", "items": "int"}))
    )
    assert not can_read(
        record(field("m", {"type": "map", "values": "int"})), record(field("m", {"type": "map", "values": "long"}))
    )
    inner_old = {"type": "record", "name": "Address", "fields": [field("city", "string")]}
    inner_new = {"type": "record", "name": "Address", "fields": [field("city", "string"), field("zip", "string")]}
    problems = reader_problems(record(field("home", inner_new)), record(field("home", inner_old)))
    assert problems == ["field 'home.zip' is missing from the writer's demo.Address and has no default"]


def test_named_type_references_and_recursion() -> None:
    node = {"type": "record", "name": "Node", "fields": [field("value", "int"), field("next", ["null", "Node"])]}
    wider = {"type": "record", "name": "Node", "fields": [field("value", "long"), field("next", ["null", "Node"])]}
    assert can_read(fastavro.parse_schema(wider), fastavro.parse_schema(node))
    assert not can_read(fastavro.parse_schema(node), fastavro.parse_schema(wider))


def test_logical_types_do_not_change_the_encoding() -> None:
    millis = record(field("t", {"type": "long", "logicalType": "timestamp-millis"}))
    assert can_read(millis, record(field("t", "long")))
    assert can_read(record(field("t", "long")), millis)


def test_levels() -> None:
    v1 = record(field("id", "int"))
    v2 = record(field("id", "int"), field("a", "string", default=""))
    v3 = record(field("id", "int"), field("a", "string", default=""), field("b", "string"))  # b has no default
    assert check_compatibility("BACKWARD", v2, [v1]) == []
    assert check_compatibility("BACKWARD", v3, [v1, v2]) != []
    assert check_compatibility("NONE", v3, [v1, v2]) == []
    # FORWARD: old readers must read new data, so removing a field without default breaks it.
    assert check_compatibility("FORWARD", v1, [v2]) == []
    assert check_compatibility("FORWARD", v2, [v3]) != []
    assert check_compatibility("FULL", v2, [v1]) == []
    # Transitive levels check every earlier version: s3 reads s4's data, but s1 (int id) cannot read its long id.
    s1 = record(field("id", "int"))
    s2 = record(field("id", "int"), field("x", "string", default=""))
    s3 = record(field("id", "long"), field("x", "string", default=""))
    s4 = record(field("id", "long"))
    assert check_compatibility("FORWARD", s4, [s1, s2, s3]) == []
    assert check_compatibility("FORWARD_TRANSITIVE", s4, [s1, s2, s3]) != []
