"""The HTTP face of the registry: the Confluent Schema Registry REST API subset clients use.

Routing and JSON only; all state lives in `SchemaStore`. Served by the standard library's
threading HTTP server (HTTP/1.1 keep-alive, which the Confluent clients' httpx pool relies on).
As Confluent's registry can be, it is served over HTTPS (`ssl_certfile`, `ssl_keyfile`) and asks
for HTTP basic authentication (`users`: name -> password; Confluent's `authentication.method=BASIC`),
answering 401 `{"error_code": 401, "message": "Unauthorized"}` to a request without valid credentials.
Every authenticated user may do everything: there is no role-based authorization.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import re
import ssl
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from . import errors
from .errors import RegistryError
from .kafka_log import DEFAULT_TOPIC, KafkaSchemaLog
from .store import LATEST, SchemaStore

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
MAX_VERSION = 2**31 - 1


class SchemaRegistryServer:
    """A Confluent-compatible schema registry stored in a broker's `_schemas` topic.

    >>> with SchemaRegistryServer(broker.bootstrap_servers) as registry:
    ...     client = SchemaRegistryClient({"url": registry.url})
    """

    def __init__(
        self,
        bootstrap_servers: str,
        host: str = "127.0.0.1",
        port: int = 0,
        topic: str = DEFAULT_TOPIC,
        timeout: float = 30.0,
        *,
        kafka_config: Mapping[str, str] | None = None,
        users: Mapping[str, str] | None = None,
        ssl_certfile: str | Path | None = None,
        ssl_keyfile: str | Path | None = None,
    ) -> None:
        """`kafka_config`: librdkafka settings for reaching a secured cluster; `users`: basic authentication's
        users and passwords (none: no authentication); `ssl_certfile` and `ssl_keyfile`: PEM files, for HTTPS."""
        if (ssl_certfile is None) != (ssl_keyfile is None):
            raise ValueError("HTTPS needs both ssl_certfile and ssl_keyfile")
        self.bootstrap_servers = bootstrap_servers
        self.host = host
        self.port = port
        self.users = dict(users or {})
        self._tls: ssl.SSLContext | None = None
        if ssl_certfile is not None:
            self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._tls.load_cert_chain(str(ssl_certfile), str(ssl_keyfile))
        self.store = SchemaStore(KafkaSchemaLog(bootstrap_servers, topic=topic, timeout=timeout,
                                                kafka_config=kafka_config))
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self._tls is not None else 'http'}://{host}:{self.port}"

    def start(self) -> SchemaRegistryServer:
        """Replay the `_schemas` topic, then accept requests."""
        self.store.open()
        self._http = _Server((self.host, self.port), _handler_class(_Api(self.store), self.users))
        self._http.daemon_threads = True
        if self._tls is not None:
            # The handshake happens in each request's thread, on its first read, not in the accepting one.
            self._http.socket = self._tls.wrap_socket(self._http.socket, server_side=True,
                                                      do_handshake_on_connect=False)
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, name="sparkeos-schema-registry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        self.store.close()

    def __enter__(self) -> SchemaRegistryServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


Response = tuple[int, Any]


class _Api:
    """Maps (method, path, query, body) to (status, JSON document) using the store."""

    def __init__(self, store: SchemaStore) -> None:
        self.store = store
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Response]]] = [
            (method, re.compile(f"^{pattern}$"), handler)
            for method, pattern, handler in [
                ("GET", r"/", lambda q: (200, {})),
                ("GET", r"/schemas/types", lambda q: (200, ["AVRO"])),
                ("GET", r"/schemas/ids/([^/]+)", self.get_schema),
                ("GET", r"/schemas/ids/([^/]+)/schema", self.get_raw_schema),
                ("GET", r"/schemas/ids/([^/]+)/versions", self.get_schema_versions),
                ("GET", r"/schemas/ids/([^/]+)/subjects", self.get_schema_subjects),
                ("GET", r"/subjects", lambda q: (200, self.store.subjects())),
                ("GET", r"/subjects/([^/]+)/versions", lambda q, s: (200, self.store.versions(s))),
                ("POST", r"/subjects/([^/]+)/versions", self.register),
                ("GET", r"/subjects/([^/]+)/versions/([^/]+)", self.get_version),
                ("GET", r"/subjects/([^/]+)/versions/([^/]+)/schema", self.get_raw_version),
                ("POST", r"/subjects/([^/]+)", self.lookup),
                ("GET", r"/config", lambda q: (200, {"compatibilityLevel": self.store.level(None, True)})),
                ("PUT", r"/config", lambda q, body: self.put_config(None, body)),
                ("DELETE", r"/config", lambda q: (200, {"compatibilityLevel": self.store.delete_level(None)})),
                ("GET", r"/config/([^/]+)", self.get_subject_config),
                ("PUT", r"/config/([^/]+)", lambda q, s, body: self.put_config(s, body)),
                ("DELETE", r"/config/([^/]+)", lambda q, s: (200, {"compatibilityLevel": self.store.delete_level(s)})),
                ("POST", r"/compatibility/subjects/([^/]+)/versions/([^/]+)", self.check_version),
                ("POST", r"/compatibility/subjects/([^/]+)/versions", self.check_all),
                ("GET", r"/mode", lambda q: (200, {"mode": "READWRITE"})),
            ]
        ]

    def handle(self, method: str, raw_path: str, body: bytes) -> Response:
        parts = urlsplit(raw_path)
        path = parts.path.rstrip("/") or "/"
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        for route_method, pattern, handler in self.routes:
            match = pattern.match(path)
            if match is None or route_method != method:
                continue
            arguments: list[Any] = [query, *(unquote(group) for group in match.groups())]
            if method in ("POST", "PUT"):
                arguments.append(_json_body(body))
            return handler(*arguments)
        if any(pattern.match(path) for _, pattern, _ in self.routes):
            return 405, {"error_code": 405, "message": f"HTTP 405 Method Not Allowed: {method} {path}"}
        raise errors.not_found(path)

    # -- schemas by id -----------------------------------------------------------------------

    def get_schema(self, query: dict[str, str], schema_id: str) -> Response:
        return 200, {"schema": self.store.schema_by_id(_schema_id(schema_id)).text}

    def get_raw_schema(self, query: dict[str, str], schema_id: str) -> Response:
        return 200, _Raw(self.store.schema_by_id(_schema_id(schema_id)).text)

    def get_schema_versions(self, query: dict[str, str], schema_id: str) -> Response:
        usages = self.store.usages_of_id(_schema_id(schema_id))
        return 200, [{"subject": subject, "version": version} for subject, version in usages]

    def get_schema_subjects(self, query: dict[str, str], schema_id: str) -> Response:
        return 200, sorted({subject for subject, _ in self.store.usages_of_id(_schema_id(schema_id))})

    # -- subjects ----------------------------------------------------------------------------

    def register(self, query: dict[str, str], subject: str, body: dict[str, Any]) -> Response:
        entry = self.store.register(subject, _avro_schema_text(body))
        return 200, {"id": entry.schema_id}

    def get_version(self, query: dict[str, str], subject: str, version: str) -> Response:
        return 200, self.store.version(subject, _version(version)).to_json()

    def get_raw_version(self, query: dict[str, str], subject: str, version: str) -> Response:
        return 200, _Raw(self.store.version(subject, _version(version)).schema.text)

    def lookup(self, query: dict[str, str], subject: str, body: dict[str, Any]) -> Response:
        return 200, self.store.lookup(subject, _avro_schema_text(body)).to_json()

    # -- compatibility -----------------------------------------------------------------------

    def get_subject_config(self, query: dict[str, str], subject: str) -> Response:
        default_to_global = query.get("defaultToGlobal", "false").lower() == "true"
        return 200, {"compatibilityLevel": self.store.level(subject, default_to_global)}

    def put_config(self, subject: str | None, body: dict[str, Any]) -> Response:
        return 200, {"compatibility": self.store.set_level(subject, body.get("compatibility"))}

    def check_version(self, query: dict[str, str], subject: str, version: str, body: dict[str, Any]) -> Response:
        problems = self.store.compatibility_problems(subject, _avro_schema_text(body), _version(version))
        return 200, _compatibility_answer(problems, query)

    def check_all(self, query: dict[str, str], subject: str, body: dict[str, Any]) -> Response:
        problems = self.store.compatibility_problems(subject, _avro_schema_text(body), None)
        return 200, _compatibility_answer(problems, query)


class _Raw(str):
    """A schema returned as the body itself (the `/schema` endpoints), not wrapped in JSON."""


def _compatibility_answer(problems: list[str], query: dict[str, str]) -> dict[str, Any]:
    answer: dict[str, Any] = {"is_compatible": not problems}
    if query.get("verbose", "false").lower() == "true":
        answer["messages"] = problems
    return answer


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RegistryError(400, 400, f"request body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise RegistryError(422, 422, "request body must be a JSON object")
    return document


def _avro_schema_text(body: dict[str, Any]) -> Any:
    schema_type = body.get("schemaType") or "AVRO"
    if schema_type != "AVRO":
        raise errors.invalid_schema(f"schemaType {schema_type!r} is not supported; this registry holds AVRO only")
    if body.get("references"):
        raise errors.invalid_schema("schema references are not supported")
    if "schema" not in body:
        raise errors.invalid_schema("the request has no 'schema' field")
    return body["schema"]


def _version(text: str) -> int:
    if text == "latest":
        return LATEST
    try:
        number = int(text)
    except ValueError:
        raise errors.invalid_version(text) from None
    if number == LATEST:
        return LATEST
    if not 1 <= number <= MAX_VERSION:
        raise errors.invalid_version(text)
    return number


def _schema_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise errors.schema_not_found(f"Schema {text} not found") from None


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        # A client that left, or spoke plain HTTP to HTTPS, or never finished its handshake: its connection ends,
        # without the traceback the standard library prints.
        log.debug("schema registry connection from %s failed", client_address, exc_info=True)


def _authorized(header: str | None, users: Mapping[str, str]) -> bool:
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    return user in users and hmac.compare_digest(users[user].encode(), password.encode())


UNAUTHORIZED = {"error_code": 401, "message": "Unauthorized"}


def _handler_class(api: _Api, users: Mapping[str, str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "sparkeos-schema-registry"
        timeout = 60  # seconds a connection may stay silent, in its TLS handshake or between requests

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            try:
                if users and not _authorized(self.headers.get("Authorization"), users):
                    status, document = 401, UNAUTHORIZED
                else:
                    status, document = api.handle(method, self.path, body)
            except RegistryError as exc:
                status, document = exc.status, exc.to_json()
            except Exception as exc:  # an unexpected bug must still answer in the registry's error form
                log.exception("schema registry request %s %s failed", method, self.path)
                status, document = 500, {"error_code": 50001, "message": f"{type(exc).__name__}: {exc}"}
            if isinstance(document, _Raw):
                payload, content_type = str(document).encode(), CONTENT_TYPE
            else:
                payload, content_type = json.dumps(document).encode(), CONTENT_TYPE
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="SchemaRegistry"')
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
