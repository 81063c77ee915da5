"""Shared fixtures: a real broker over real TCP for every test that needs one.

A test (or module) marked `apache_kafka` runs once against the embedded broker and once against each Apache Kafka
version of `SPARKEOS_TEST_KAFKA` (default: every version of sparkeos.apache_kafka.VERSIONS; `none` runs the embedded
broker only), through the same `broker` (or `broker_process`) fixture; a test that starts its broker itself takes
`broker_kind`, the name of the kind to start. Its test ids end in `[embedded]`,
`[kafka-4.4.0]`, ... A test of such a module marked `embedded_broker_only` runs on the embedded broker alone.
`apache_kafka(newest_only=True)` keeps the default run within its time: such a test runs on the newest version
only, unless `SPARKEOS_TEST_KAFKA` names the versions. `apache_kafka(opt_in=True)`, for the longest soaks, runs on
Apache Kafka only when `SPARKEOS_TEST_KAFKA` names the versions. `apache_kafka(embedded=False)` leaves the embedded
broker out (it runs there only when no Apache Kafka version is tested).

A test marked `soak` is one of the longest drills whose guarantee a shorter test of the default run also checks
(the mark says which): it is deselected (counted as such, never as passed) unless `SPARKEOS_TEST_SOAK=1`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkeos.broker import BrokerProcess, EmbeddedBroker
from support import apache_kafka, class_archives
from support.apache_kafka import ApacheKafkaCluster
from support.postgres import PostgresServer


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "apache_kafka(newest_only=False, opt_in=False, embedded=True): run against the embedded broker and "
        "each Apache Kafka version (tests/conftest.py)"
    )
    config.addinivalue_line(
        "markers", "embedded_broker_only(why): in a module marked apache_kafka, a test whose subject does not depend "
        "on the broker (say why), run on the embedded broker only"
    )
    config.addinivalue_line(
        "markers", "soak(covered_by): one of the longest drills, run only when SPARKEOS_TEST_SOAK=1; covered_by names "
        "what checks its guarantee in the default run (tests/conftest.py)"
    )
    if not hasattr(config, "workerinput"):  # once per run, before pytest-xdist starts the test processes
        make_class_archives(config)


def make_class_archives(config: pytest.Config) -> None:
    """The JVMs' class archives (support/class_archives.py), made when missing; the drivers told to map theirs
    through the environment every test process and every process of a test inherits. A missing archive costs only
    time: a warning says why, and tests/test_class_archives.py fails."""
    problem = class_archives.make_missing(apache_kafka.tested_versions())
    if problem is not None:
        config.issue_config_time_warning(pytest.PytestWarning(f"class archives missing: {problem}"), stacklevel=2)
    os.environ[class_archives.DRIVER_OPTIONS_VARIABLE] = class_archives.driver_options()


# A test given at least this long (pytest-timeout's mark) is one of the few that take minutes.
LONG_TEST_TIMEOUT_S = 400


def soaks_wanted() -> bool:
    value = os.environ.get("SPARKEOS_TEST_SOAK", "")
    if value not in ("", "0", "1"):
        raise pytest.UsageError(f"SPARKEOS_TEST_SOAK must be 1 (run the soaks too) or 0, got {value!r}")
    return value == "1"


def deselect_soaks(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The soaks leave the default run, as deselected tests."""
    for item in items:
        mark = item.get_closest_marker("soak")
        if mark is not None and not (mark.args and str(mark.args[0]).strip()):
            raise pytest.UsageError(f"{item.nodeid}: soak(covered_by) must name what covers it in the default run")
    if soaks_wanted():
        return
    soaks = [item for item in items if item.get_closest_marker("soak")]
    if soaks:
        config.hook.pytest_deselected(items=soaks)
        items[:] = [item for item in items if not item.get_closest_marker("soak")]


@pytest.hookimpl(trylast=True)  # after -k, -m and --deselect have chosen the tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The soaks out unless wanted; then the long tests first, shared out among the test processes: pytest-xdist's
    worksteal hands each process an even, contiguous share of the tests, and one that runs out takes short ones from
    the end of another's. Each share thus begins with its long tests, so that no process runs the last long test alone
    while the others wait."""

    def timeout(item: pytest.Item) -> float:
        mark = item.get_closest_marker("timeout")
        return float(mark.args[0]) if mark and mark.args else 0.0

    deselect_soaks(config, items)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    long = sorted((item for item in items if timeout(item) >= LONG_TEST_TIMEOUT_S), key=lambda item: -timeout(item))
    short = iter([item for item in items if timeout(item) < LONG_TEST_TIMEOUT_S])
    shares: list[list[pytest.Item]] = [long[n::workers] for n in range(workers)]
    left = len(items)
    for n, share in enumerate(shares):
        size = left // (workers - n)  # as worksteal sizes them
        share.extend(next(short) for _ in range(max(0, size - len(share))))
        left -= len(share)
    shares[-1].extend(short)
    items[:] = [item for share in shares for item in share]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("apache_kafka")
    if marker is None or metafunc.definition.get_closest_marker("embedded_broker_only"):
        return
    versions = apache_kafka.tested_versions()
    chosen = "SPARKEOS_TEST_KAFKA" in os.environ
    if marker.kwargs.get("opt_in") and not chosen:
        versions = []
    elif marker.kwargs.get("newest_only") and not chosen:
        versions = versions[:1]
    kinds = [f"kafka-{version}" for version in versions]
    if marker.kwargs.get("embedded", True) or not kinds:
        kinds.insert(0, "embedded")
    for fixture in ("broker", "broker_process", "broker_kind"):
        if fixture in metafunc.fixturenames:
            metafunc.parametrize(fixture, kinds, indirect=True)
            return
    if any(mark.name == "apache_kafka" for mark in metafunc.definition.own_markers):
        raise pytest.UsageError(f"{metafunc.definition.nodeid} is marked apache_kafka but uses no broker fixture")


class ApacheKafkaNodes:
    """One single-node Apache Kafka per version, started on first use and shared by the tests of a test process:
    each test works in topics, groups and transactional ids of its own."""

    def __init__(self, root: Path):
        self.root = root
        self.clusters: dict[str, ApacheKafkaCluster] = {}

    def node(self, version: str) -> ApacheKafkaCluster:
        if version not in self.clusters:
            self.clusters[version] = ApacheKafkaCluster(self.root / version, version).start()
        return self.clusters[version]

    def stop(self) -> None:
        for cluster in self.clusters.values():
            cluster.stop()


@pytest.fixture(scope="session")
def apache_kafka_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafkaNodes]:
    nodes = ApacheKafkaNodes(tmp_path_factory.mktemp("apache-kafka"))
    try:
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedBroker | ApacheKafkaCluster]:
    """An in-process broker on a free port, with a fresh data dir; in a test marked `apache_kafka`, also a shared
    Apache Kafka node of each version."""
    kind = getattr(request, "param", "embedded")
    if kind == "embedded":
        with EmbeddedBroker(tmp_path / "broker") as running:
            yield running
    else:
        yield request.getfixturevalue("apache_kafka_nodes").node(kind.removeprefix("kafka-"))


class ApacheKafkaProcess:
    """A single-node Apache Kafka of a test's own, with BrokerProcess's start() and kill()."""

    def __init__(self, root: Path, version: str):
        self.cluster = ApacheKafkaCluster(root, version)
        self.bootstrap_servers = self.cluster.bootstrap_servers

    def start(self) -> ApacheKafkaProcess:
        if self.cluster.nodes[1].process is None:
            self.cluster.start()
        else:
            self.cluster.restart(1)
        return self

    def kill(self) -> None:
        self.cluster.kill(1)


@pytest.fixture
def broker_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess | ApacheKafkaProcess]:
    """A broker in a child process, for tests that kill -9 and restart it; in a test marked `apache_kafka`, also a
    fresh Apache Kafka node of each version."""
    kind = getattr(request, "param", "embedded")
    if kind == "embedded":
        process = BrokerProcess(tmp_path / "broker")
    else:
        process = ApacheKafkaProcess(tmp_path / "apache-kafka", kind.removeprefix("kafka-"))
    process.start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture
def broker_kind(request: pytest.FixtureRequest) -> str:
    """For a test that starts its broker itself: `embedded`, or in a test marked `apache_kafka` also
    `kafka-<version>`."""
    return getattr(request, "param", "embedded")


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
