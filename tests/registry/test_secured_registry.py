"""A schema registry over HTTPS with basic authentication, as production registries run, and the ways our clients
reach one: Confluent's client settings (`url`, `basic.auth.user.info`, `ssl.ca.location`), checked when given,
used by sparkeos.serde on the driver and in Spark's Python workers, and refused by the registry when wrong."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from pyspark.sql import functions as F

from sparkeos.broker import EmbeddedBroker
from sparkeos.registry import SchemaRegistryServer
from sparkeos.registry.client import Registry, RegistryRequestError
from sparkeos.serde import from_confluent_avro, to_confluent_avro
from support.secured import make_certificates

PEOPLE = json.dumps({"type": "record", "name": "People", "fields": [{"name": "id", "type": "int"},
                                                                    {"name": "name", "type": "string"}]})
USERS = {"etl": "etl-secret"}


@pytest.fixture
def secured_registry(tmp_path: Path) -> Iterator[tuple[SchemaRegistryServer, Path]]:
    certificates = make_certificates(tmp_path / "certificates")
    with EmbeddedBroker(tmp_path / "broker") as broker, SchemaRegistryServer(
            broker.bootstrap_servers, users=USERS, ssl_certfile=certificates["cert"],
            ssl_keyfile=certificates["key"]) as registry:
        yield registry, certificates["ca"]


def settings(registry: SchemaRegistryServer, ca: Path, **overrides: str) -> dict[str, str]:
    return {"url": registry.url, "basic.auth.user.info": "etl:etl-secret", "ssl.ca.location": str(ca), **overrides}


def test_confluents_client_is_served_with_its_credentials_and_refused_without(secured_registry) -> None:
    registry, ca = secured_registry
    assert registry.url.startswith("https://")
    client = SchemaRegistryClient(settings(registry, ca))
    schema_id = client.register_schema("people-value", Schema(PEOPLE, "AVRO"))
    assert json.loads(client.get_schema(schema_id).schema_str) == json.loads(PEOPLE)
    for wrong in ({"basic.auth.user.info": "etl:not-the-password"}, {"basic.auth.user.info": "nobody:etl-secret"}):
        with pytest.raises(SchemaRegistryError) as refused:
            SchemaRegistryClient(settings(registry, ca, **wrong)).get_subjects()
        assert refused.value.http_status_code == 401
    answer = httpx.get(f"{registry.url}/subjects", verify=ssl.create_default_context(cafile=str(ca)))
    assert (answer.status_code, answer.json()) == (401, {"error_code": 401, "message": "Unauthorized"})
    assert answer.headers["WWW-Authenticate"].startswith("Basic")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{registry.url.replace('https', 'http')}/subjects", timeout=10)


def test_serde_reaches_the_registry_with_confluents_settings_on_the_driver_and_in_workers(spark, secured_registry):
    registry, ca = secured_registry
    people = spark.createDataFrame([(1, "Ann"), (2, "Bo")], "id int, name string").select(
        F.struct("id", "name").alias("person"))
    encoded = people.select(to_confluent_avro("person", PEOPLE, settings(registry, ca), "people-value").alias("v"))
    # Credentials in the URL, Confluent's default source, work as well.
    in_url = registry.url.replace("https://", "https://etl:etl-secret@")
    decoded = encoded.select(from_confluent_avro("v", PEOPLE, {"url": in_url, "ssl.ca.location": str(ca)}).alias("p"))
    assert sorted(tuple(row.p) for row in decoded.collect()) == [(1, "Ann"), (2, "Bo")]


def test_wrong_credentials_and_an_unknown_authority_are_refused_naming_what_to_set(secured_registry) -> None:
    """On the driver, where to_confluent_avro registers its schema."""
    registry, ca = secured_registry
    with pytest.raises(RegistryRequestError, match=r"refused the credentials of etl \(401 Unauthorized\)") as refused:
        to_confluent_avro("p", PEOPLE, settings(registry, ca, **{"basic.auth.user.info": "etl:wrong"}), "people")
    assert "wrong" not in str(refused.value)
    with pytest.raises(RegistryRequestError, match="refused a request without credentials"):
        to_confluent_avro("p", PEOPLE, {"url": registry.url, "ssl.ca.location": str(ca)}, "people")
    with pytest.raises(RegistryRequestError, match="certificate verify failed.*ssl.ca.location"):
        to_confluent_avro("p", PEOPLE, {"url": registry.url, "basic.auth.user.info": "etl:etl-secret"}, "people")


@pytest.mark.parametrize(("given", "error"), [
    ({"url": "registry:8081"}, r"'url' must be an http\(s\) URL, got 'registry:8081'"),
    ({"url": "https://u:secret@registry"}, None),
    ({"url": "http://r", "basic.auth.user.info": "no-colon"}, "'basic.auth.user.info' must be user:password"),
    ({"url": "http://r", "basic.auth.credentials.source": "SASL_INHERIT"},
     "'basic.auth.credentials.source' must be one of URL, USER_INFO, got 'SASL_INHERIT'"),
    ({"url": "http://r", "basic.auth.credentials.source": "USER_INFO"}, "'basic.auth.user.info' .* is required"),
    ({"url": "http://r", "ssl.ca.location": "/ca.pem"}, "'ssl.ca.location' applies to an https URL"),
    ({"url": "http://r", "schema.registry.basic.auth.user.info": "a:b"},
     "unknown schema registry setting 'schema.registry.basic.auth.user.info'"),
    ({"url": "https://u:secret@r", "basic.auth.user.info": "v:other"}, "credentials are given twice"),
    ({"url": "https://r", "basic.auth.credentials.source": "URL", "basic.auth.user.info": "v:other"},
     "'basic.auth.user.info' is not used with basic.auth.credentials.source URL"),
    ({"url": "https://r", "ssl.ca.location": "/nonexistent/ca.pem"},
     "'ssl.ca.location' names no file: /nonexistent/ca.pem"),
    ({"url": "u:secret@registry:8081"}, r"must be an http\(s\) URL, got 'u@registry:8081'"),
])
def test_registry_settings_are_checked_when_given(given: dict[str, str], error: str | None) -> None:
    if error is None:
        registry = Registry.of(given)
        assert (registry.url, registry.user_info, str(registry)) == ("https://registry", "u:secret",
                                                                    "https://registry (as u)")
        assert registry.confluent_config() == {"url": "https://registry", "basic.auth.user.info": "u:secret"}
        assert "secret" not in repr(registry)
        return
    with pytest.raises(ValueError, match=error) as refused:
        Registry.of(given)
    assert "secret" not in str(refused.value)
