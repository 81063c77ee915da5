"""The embedded schema registry with Confluent's own Python client, serializers and raw HTTP."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from sparkeos.stack import LocalStack, StackProcess

PERSON_V1 = {
    "type": "record",
    "name": "People",
    "namespace": "demo",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "identifyNumber", "type": ["null", "string"], "default": None},
    ],
}
PERSON_V2_WITH_DEFAULT = {
    **PERSON_V1,
    "fields": [*PERSON_V1["fields"], {"name": "city", "type": "string", "default": "unknown"}],
}
PERSON_V2_WITHOUT_DEFAULT = {**PERSON_V1, "fields": [*PERSON_V1["fields"], {"name": "city", "type": "string"}]}
PERSON_ID_STRING = {**PERSON_V1, "fields": [{"name": "id", "type": "string"}, *PERSON_V1["fields"][1:]]}
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def avro(document: dict) -> Schema:
    return Schema(json.dumps(document), "AVRO")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    with LocalStack(tmp_path / "broker", schema_registry=True) as running:
        yield running


@pytest.fixture
def client(stack: LocalStack) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": stack.schema_registry_url})


def http(stack: LocalStack) -> httpx.Client:
    return httpx.Client(base_url=stack.schema_registry_url, headers={"Accept": CONTENT_TYPE}, timeout=30)


def error_of(response: httpx.Response) -> tuple[int, int]:
    assert response.headers["content-type"] == CONTENT_TYPE
    return response.status_code, response.json()["error_code"]


def test_avro_serializer_round_trip_through_the_broker(
    stack: LocalStack, client: SchemaRegistryClient, topic_name: str
) -> None:
    serializer = AvroSerializer(client, json.dumps(PERSON_V1))
    deserializer = AvroDeserializer(client)
    people = [{"id": i, "name": f"p{i}" if i % 3 else None, "identifyNumber": f"{i:018d}"} for i in range(20)]
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "enable.idempotence": True})
    for person in people:
        producer.produce(topic_name, value=serializer(person, SerializationContext(topic_name, MessageField.VALUE)))
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": stack.bootstrap_servers,
            "group.id": topic_name,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic_name])
    raw: list[bytes] = []
    try:
        while len(raw) < len(people):
            message = consumer.poll(10)
            assert message is not None, f"only {len(raw)} of {len(people)} records arrived"
            assert message.error() is None, message.error()
            raw.append(message.value())
    finally:
        consumer.close()

    registered = client.get_latest_version(f"{topic_name}-value")
    assert registered.version == 1
    # Confluent wire format: magic byte 0, then the 4-byte big-endian schema id.
    assert {struct.unpack(">bI", value[:5]) for value in raw} == {(0, registered.schema_id)}
    context = SerializationContext(topic_name, MessageField.VALUE)
    # A fresh client so the writer schema really comes from the registry by id.
    fresh = AvroDeserializer(SchemaRegistryClient({"url": stack.schema_registry_url}))
    assert [fresh(value, context) for value in raw] == people
    assert [deserializer(value, context) for value in raw] == people


def test_register_get_list_versions(stack: LocalStack, client: SchemaRegistryClient) -> None:
    first = client.register_schema("people-value", avro(PERSON_V1))
    assert client.register_schema("people-value", avro(PERSON_V1)) == first  # same schema, same id
    # Key order and whitespace do not make a different schema.
    reordered = json.dumps(dict(reversed(list(PERSON_V1.items()))), indent=2)
    assert client.register_schema("people-value", Schema(reordered, "AVRO")) == first
    second = client.register_schema("people-value", avro(PERSON_V2_WITH_DEFAULT))
    assert second > first
    # Ids are global: the same schema under another subject keeps its id; a new one gets the next.
    assert client.register_schema("other-value", avro(PERSON_V2_WITH_DEFAULT)) == second
    third = client.register_schema("third-value", avro({"type": "string"}))
    assert third == second + 1

    assert client.get_subjects() == ["other-value", "people-value", "third-value"]
    assert client.get_versions("people-value") == [1, 2]
    latest = client.get_latest_version("people-value")
    assert (latest.version, latest.schema_id) == (2, second)
    assert json.loads(latest.schema.schema_str) == PERSON_V2_WITH_DEFAULT
    version_one = client.get_version("people-value", 1)
    assert (version_one.version, version_one.schema_id) == (1, first)
    assert json.loads(client.get_schema(first).schema_str) == PERSON_V1
    looked_up = client.lookup_schema("people-value", avro(PERSON_V1))
    assert (looked_up.version, looked_up.schema_id) == (1, first)

    with http(stack) as session:
        assert session.get(f"/schemas/ids/{first}/schema").json() == PERSON_V1
        assert session.get("/subjects/people-value/versions/latest/schema").json() == PERSON_V2_WITH_DEFAULT
        assert session.get("/subjects/people-value/versions/-1").json()["version"] == 2
        assert session.get(f"/schemas/ids/{second}/versions").json() == [
            {"subject": "other-value", "version": 1},
            {"subject": "people-value", "version": 2},
        ]
        # Plain application/json is accepted as well as the registry's own content type.
        response = session.post(
            "/subjects/people-value",
            content=json.dumps({"schema": json.dumps(PERSON_V1)}),
            headers={"Content-Type": "application/json"},
        )
        assert response.json() == {
            "subject": "people-value",
            "version": 1,
            "id": first,
            "schema": json.dumps(PERSON_V1, separators=(",", ":")),
        }


def test_not_found_errors(stack: LocalStack, client: SchemaRegistryClient) -> None:
    client.register_schema("people-value", avro(PERSON_V1))
    with http(stack) as session:
        assert error_of(session.get("/subjects/nobody/versions")) == (404, 40401)
        assert error_of(session.get("/subjects/nobody/versions/latest")) == (404, 40401)
        assert error_of(session.get("/subjects/people-value/versions/7")) == (404, 40402)
        assert error_of(session.get("/subjects/people-value/versions/zero")) == (422, 42202)
        assert error_of(session.get("/schemas/ids/999")) == (404, 40403)
        lookup = session.post("/subjects/people-value", json={"schema": json.dumps(PERSON_V2_WITH_DEFAULT)})
        assert error_of(lookup) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as raised:
        client.get_latest_version("nobody")
    assert raised.value.error_code == 40401


def test_backward_compatibility_rejects_a_field_without_default(
    stack: LocalStack, client: SchemaRegistryClient
) -> None:
    assert client.get_compatibility() == "BACKWARD"
    client.register_schema("people-value", avro(PERSON_V1))
    assert client.test_compatibility("people-value", avro(PERSON_V2_WITH_DEFAULT)) is True
    assert client.test_compatibility("people-value", avro(PERSON_V2_WITHOUT_DEFAULT)) is False
    with pytest.raises(SchemaRegistryError) as raised:
        client.register_schema("people-value", avro(PERSON_V2_WITHOUT_DEFAULT))
    assert (raised.value.http_status_code, raised.value.error_code) == (409, 409)
    assert "'city'" in raised.value.error_message
    assert client.get_versions("people-value") == [1]

    with http(stack) as session:
        verbose = session.post(
            "/compatibility/subjects/people-value/versions/latest?verbose=true",
            json={"schema": json.dumps(PERSON_V2_WITHOUT_DEFAULT)},
        ).json()
        assert verbose["is_compatible"] is False
        assert any("'city'" in message for message in verbose["messages"])
        assert error_of(session.get("/config/people-value")) == (404, 40408)  # no subject-level setting yet
        assert session.get("/config/people-value?defaultToGlobal=true").json() == {"compatibilityLevel": "BACKWARD"}
        assert error_of(session.put("/config/people-value", json={"compatibility": "SOMETIMES"})) == (422, 42203)

    assert client.set_compatibility("people-value", "NONE") == {"compatibility": "NONE"}
    assert client.get_compatibility("people-value") == "NONE"
    assert client.get_compatibility() == "BACKWARD"  # the global level is untouched
    new_id = client.register_schema("people-value", avro(PERSON_V2_WITHOUT_DEFAULT))
    assert client.get_latest_version("people-value").schema_id == new_id
    assert client.get_versions("people-value") == [1, 2]


def test_global_level_applies_to_subjects_without_their_own(client: SchemaRegistryClient) -> None:
    client.register_schema("a-value", avro(PERSON_V1))
    client.set_compatibility(level="NONE")
    client.register_schema("a-value", avro(PERSON_V2_WITHOUT_DEFAULT))
    client.set_compatibility(level="FULL")
    with pytest.raises(SchemaRegistryError) as raised:
        # v2's readers cannot read the id as a string (nor can this schema read v2's int id).
        client.register_schema("a-value", avro(PERSON_ID_STRING))
    assert raised.value.error_code == 409


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"schema": json.dumps({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})}, "nope"),
        ({"schema": "{not json"}, "not JSON"),
        (
            {
                "schema": json.dumps(
                    {"type": "record", "name": "X", "fields": [{"name": "a", "type": "int", "default": "text"}]}
                )
            },
            "Default value",
        ),
        ({"schema": json.dumps({"type": "object"}), "schemaType": "JSON"}, "AVRO only"),
        ({"schemaType": "AVRO"}, "no 'schema'"),
    ],
)
def test_invalid_schema_is_42201(stack: LocalStack, body: dict, detail: str) -> None:
    with http(stack) as session:
        response = session.post("/subjects/bad-value/versions", json=body)
        assert error_of(response) == (422, 42201)
        assert detail in response.json()["message"]
        assert session.get("/subjects").json() == []


def test_registry_survives_broker_kill_9(tmp_path: Path) -> None:
    process = StackProcess(tmp_path / "broker", schema_registry=True)
    process.start()
    try:
        client = SchemaRegistryClient({"url": process.schema_registry_url})
        ids = [
            client.register_schema("people-value", avro(PERSON_V1)),
            client.register_schema("people-value", avro(PERSON_V2_WITH_DEFAULT)),
            client.register_schema("keys-key", avro({"type": "string"})),
        ]
        client.set_compatibility("keys-key", "NONE")
        url = process.schema_registry_url

        process.restart()  # SIGKILL, then start on the same data dir and ports

        assert process.schema_registry_url == url
        fresh = SchemaRegistryClient({"url": url})
        assert fresh.get_subjects() == ["keys-key", "people-value"]
        assert fresh.get_versions("people-value") == [1, 2]
        assert [fresh.get_version("people-value", v).schema_id for v in (1, 2)] == ids[:2]
        assert json.loads(fresh.get_schema(ids[0]).schema_str) == PERSON_V1
        assert fresh.get_compatibility("keys-key") == "NONE"
        # Still BACKWARD for people-value, and ids keep counting up rather than reusing one.
        with pytest.raises(SchemaRegistryError):
            fresh.register_schema("people-value", avro(PERSON_ID_STRING))
        assert fresh.register_schema("keys-key", avro({"type": "long"})) == max(ids) + 1
        assert fresh.register_schema("people-value", avro(PERSON_V1)) == ids[0]
    finally:
        process.kill()


def test_the_registrys_log_opens_through_connections_cut_while_it_reads(tmp_path: Path) -> None:
    """The registry reads its log back when it starts, as the broker it runs beside comes back from a crash: a
    connection lost then (the network of a chaos run, a broker still loading) is retried until the log's timeout,
    as a producer's send is, instead of failing the start."""
    from sparkeos.registry.kafka_log import KafkaSchemaLog
    from support.network_faults import proxied_broker

    fetch, list_offsets, create_topics = 1, 2, 19
    with proxied_broker(tmp_path) as (proxy, _broker):
        written = KafkaSchemaLog(proxy.address, timeout=30.0)
        written.open()
        written.append({"subject": "s"}, {"version": 1})
        written.close()
        proxy.cut_requests(list_offsets, count=3)
        proxy.cut_requests(create_topics, count=2)
        proxy.cut_requests(fetch, count=2)
        reread = KafkaSchemaLog(proxy.address, timeout=30.0)
        reread.open()
        try:
            assert [record for _offset, record in reread.read_new()] == [({"subject": "s"}, {"version": 1})]
            assert [proxy.requests_left_to_cut(api) for api in (fetch, list_offsets, create_topics)] == [0, 0, 0]
        finally:
            reread.close()
