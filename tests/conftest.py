"""Shared fixtures: a real broker over real TCP for every test that needs one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkeos.broker import BrokerProcess, EmbeddedBroker
from support.postgres import PostgresServer


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """An in-process broker on a free port, with a fresh data dir."""
    with EmbeddedBroker(tmp_path / "broker") as running:
        yield running


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker in a child process, for tests that kill -9 and restart it."""
    process = BrokerProcess(tmp_path / "broker")
    process.start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture
def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server that can prepare transactions, shared by the session (the sparkeos.postgres tests and
    the job examples); a test that crashes it starts it again."""
    with PostgresServer(max_prepared_transactions=20) as server:
        server.add_password_user()
        yield server


@pytest.fixture(scope="session")
def spark():
    """A real local Spark session (local[2]) shared by the whole test run, sparkeos.kafka registered."""
    from support.spark import spark_session

    session = spark_session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def runtime_python(tmp_path_factory) -> Path:
    """The interpreter of a virtualenv holding sparkeos and its runtime dependencies only (support/runtime_only.py)."""
    from support.runtime_only import make_runtime_venv

    return make_runtime_venv(tmp_path_factory.mktemp("runtime-venv"))


@pytest.fixture
def s3_server():
    """An S3-compatible server on this machine (moto in server mode), with a bucket: its ``fs.s3a.*`` settings."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"fs.s3a.endpoint": f"http://{host}:{port}", "fs.s3a.access.key": "test",
               "fs.s3a.secret.key": "test", "fs.s3a.endpoint.region": "us-east-1"}

    pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", access_key="test", secret_key="test",
                      region="us-east-1", allow_bucket_creation=True).create_dir("sink-bucket")
    try:
        yield options
    finally:
        server.stop()
